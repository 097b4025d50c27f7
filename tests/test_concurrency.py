"""Several processes on one store: the fold decision and the write are atomic."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from memory_mcp.config import Settings
from memory_mcp.embedders.base import FakeEmbedder
from memory_mcp.service import MemoryService

pytestmark = pytest.mark.anyio

WORKER = Path(__file__).with_name("concurrency_worker.py")
TIMEOUT = 120


def run_together(db: Path, cwd: Path, batches: list[list[str]]) -> list[list[dict[str, str]]]:
    """Start one process per batch, release them at once, return each one's results."""
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(db), str(cwd), *texts],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for texts in batches
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.strip() == "ready", proc.stderr.read() if proc.stderr else line
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = []
        for proc in procs:
            out, err = proc.communicate(timeout=TIMEOUT)
            assert proc.returncode == 0, err
            outputs.append(json.loads(out.strip().splitlines()[-1]))
        return outputs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()


PARAPHRASES = [
    (
        "The staging database is reset every Sunday night",
        "The staging database is reset every Sunday",
    ),
    ("Run the linter with make lint before pushing", "Run the linter with make lint before a push"),
    ("Use uv to install the Python dependencies", "use uv to install the python dependencies"),
    (
        "Integration tests need Docker running locally",
        "Integration tests need Docker running on the machine",
    ),
    (
        "Merging to main requires one approving review",
        "Merging to main requires one approving code review",
    ),
]


async def test_two_processes_storing_paraphrases_at_once_end_with_one_canonical_record(
    tmp_path: Path, project: Path
) -> None:
    db = tmp_path / "shared.db"
    async with MemoryService.open(Settings(), database=db, embedder=FakeEmbedder()):
        pass  # create and migrate once, so both workers race on the writes only
    first, second = run_together(
        db, project, [[a for a, _ in PARAPHRASES], [b for _, b in PARAPHRASES]]
    )
    for one, two in zip(first, second, strict=True):
        # Whoever wrote second saw the first one's record and folded into it.
        assert sorted([one["action"], two["action"]]) == ["folded", "inserted"], (one, two)
    async with MemoryService.open(Settings(), database=db, embedder=FakeEmbedder()) as memory:
        stats = await memory.db.stats()
        assert stats.records[("facts", "project", "current")] == len(PARAPHRASES)
        assert stats.records[("facts", "project", "archived")] == len(PARAPHRASES)


async def test_concurrent_writers_lose_no_acknowledged_write(tmp_path: Path, project: Path) -> None:
    db = tmp_path / "shared.db"
    batches = [
        [f"Worker {w} note {i}: service-{w}-{i} uses port {10000 + 100 * w + i}" for i in range(25)]
        for w in range(3)
    ]
    outputs = run_together(db, project, batches)
    ids = [r["id"] for out in outputs for r in out]
    assert len(ids) == 75
    async with MemoryService.open(Settings(), database=db, embedder=FakeEmbedder()) as memory:
        found = await memory.db.get_many(ids)
        assert len(found) == 75
