"""Several processes on one store: the fold decision and the write are atomic."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.processes import Workers, release
from helpers.storage import store_place, store_url
from memory_mcp import write
from memory_mcp.embedders.base import FakeEmbedder
from memory_mcp.service import MemoryService

pytestmark = pytest.mark.anyio

WORKER = Path(__file__).with_name("concurrency_worker.py")
TIMEOUT = 120


def run_together(
    workers: Workers, url: str, cwd: Path, batches: list[list[str]]
) -> list[list[dict[str, str]]]:
    """Start one process per batch, release them at once, return each one's results."""
    procs = [workers.start(WORKER, url, cwd, *texts) for texts in batches]
    release(*procs)
    return [proc.result(timeout=TIMEOUT) for proc in procs]


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
    tmp_path: Path, storage_url: str, project: Path, workers: Workers
) -> None:
    settings, db = store_place(tmp_path, storage_url, "shared")
    async with MemoryService.open(settings, database=db, embedder=FakeEmbedder()):
        pass  # create and migrate once, so both workers race on the writes only
    first, second = run_together(
        workers,
        store_url(tmp_path, storage_url, "shared"),
        project,
        [[a for a, _ in PARAPHRASES], [b for _, b in PARAPHRASES]],
    )
    for one, two in zip(first, second, strict=True):
        # Whoever wrote second saw the first one's record and folded into it.
        assert sorted([one["action"], two["action"]]) == ["folded", "inserted"], (one, two)
    async with MemoryService.open(settings, database=db, embedder=FakeEmbedder()) as memory:
        stats = await memory.engine.store.stats()
        assert stats.records[("facts", "project", "current")] == len(PARAPHRASES)
        assert stats.records[("facts", "project", "archived")] == len(PARAPHRASES)


async def test_neighbours_read_before_the_lock_are_read_again_after_a_commit(
    memory: MemoryService, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store reads its neighbours before the write lock; a paraphrase committed after
    that read is still what it folds into (the reads are made again under the lock)."""
    real = write.neighbours
    raced: list[str] = []

    async def racing(reads: object, record: object, *args: object, **kwargs: object) -> object:
        found = await real(reads, record, *args, **kwargs)  # type: ignore[arg-type]
        if reads is memory.engine.store and not raced:  # read before the lock: commit meanwhile
            raced.append("")
            raced[0] = (await memory.store(PARAPHRASES[0][0], cwd=project)).id
        return found

    monkeypatch.setattr(write, "neighbours", racing)
    second = await memory.store(PARAPHRASES[0][1], cwd=project)
    assert raced and raced[0] and second.action == "folded"
    stats = await memory.engine.store.stats()
    assert stats.records[("facts", "project", "current")] == 1
    # with nothing committed in between, the reads made before the lock are used
    calls: list[object] = []

    async def counted(reads: object, *args: object, **kwargs: object) -> object:
        calls.append(reads)
        return await real(reads, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(write, "neighbours", counted)
    await memory.store("The release branch is cut every second Tuesday", cwd=project)
    assert len(calls) == 1 and calls[0] is memory.engine.store


async def test_concurrent_writers_lose_no_acknowledged_write(
    tmp_path: Path, storage_url: str, project: Path, workers: Workers
) -> None:
    settings, db = store_place(tmp_path, storage_url, "shared")
    batches = [
        [f"Worker {w} note {i}: service-{w}-{i} uses port {10000 + 100 * w + i}" for i in range(25)]
        for w in range(3)
    ]
    outputs = run_together(workers, store_url(tmp_path, storage_url, "shared"), project, batches)
    ids = [r["id"] for out in outputs for r in out]
    assert len(ids) == 75
    async with MemoryService.open(settings, database=db, embedder=FakeEmbedder()) as memory:
        found = await memory.engine.store.get_many(ids)
        assert len(found) == 75
