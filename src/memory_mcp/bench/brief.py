"""``bench brief``: the spawn brief and its injection, timed at a given number of facts.

A fresh store in a temporary project gets ``facts`` facts (mixed kinds, ages over
two years, some pinned, some reinforced), 40 journal entries, a goal and a plan,
written straight to storage (the write pipeline is not what is measured). Then
the brief is built (``dated``, as ``inject`` builds it) and injected into
CLAUDE.md, AGENTS.md and GEMINI.md, ``runs`` times; the first run writes the
files, later ones find them unchanged.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from memory_mcp.agents.inject import inject
from memory_mcp.config import Settings
from memory_mcp.records import Corpus, Record, format_time, utcnow
from memory_mcp.scope import project_scope
from memory_mcp.service import MemoryService
from memory_mcp.write import new_id

_WORDS = [
    "cache",
    "queue",
    "worker",
    "schema",
    "migration",
    "deploy",
    "token",
    "build",
    "release",
    "config",
    "adapter",
    "handler",
    "router",
    "parser",
    "index",
    "replica",
    "shard",
    "backup",
    "retry",
    "timeout",
    "logger",
    "metric",
    "fixture",
    "mock",
    "client",
    "server",
    "proxy",
    "gateway",
    "session",
    "cookie",
    "header",
    "payload",
    "batch",
]
_KINDS = ["fact"] * 6 + ["decision", "gotcha", "preference", "procedure"]


@dataclass
class BriefBench:
    facts: int
    populate_s: float
    runs_ms: list[float] = field(default_factory=list)
    tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "facts": self.facts,
            "populate_s": round(self.populate_s, 2),
            "first_ms": round(self.runs_ms[0], 1),
            "median_ms": round(statistics.median(self.runs_ms), 1),
            "max_ms": round(max(self.runs_ms), 1),
            "runs_ms": [round(t, 1) for t in self.runs_ms],
            "brief_tokens": self.tokens,
        }


async def populate(memory: MemoryService, root: Path, facts: int, seed: int = 5) -> None:
    rng = random.Random(seed)
    now = utcnow()
    key = project_scope(root).key
    batch: list[Record] = []

    def record(corpus: Corpus, kind: str, content: str, days: float) -> Record:
        at = format_time(now - timedelta(days=days))
        return Record(
            id=new_id(corpus),
            corpus=corpus,
            kind=kind,
            scope="project",
            scope_key=key,
            content=content,
            agent=rng.choice(["claude", "codex", "gemini"]),
            created_at=at,
            updated_at=at,
            pinned=rng.random() < 0.002,
            fold_count=rng.choice([0, 0, 0, 1, 3]),
            access_count=rng.choice([0, 0, 2, 10]),
        )

    batch.append(record("docs", "goal", "Ship the v2 API by March", 20))
    batch.append(record("docs", "plan", "Freeze schema, write migrations, run a beta", 10))
    for n in range(40):
        batch.append(record("journal", "journal", f"Worked on {rng.choice(_WORDS)} #{n}", n / 5))
    for n in range(facts):
        words = " ".join(rng.sample(_WORDS, 8))
        batch.append(record("facts", rng.choice(_KINDS), f"{words} ({n})", rng.uniform(0, 730)))
    for start in range(0, len(batch), 2000):
        async with memory.engine.store.write() as tx:
            for item in batch[start : start + 2000]:
                await tx.insert(item, None)


async def run_brief_bench(
    facts: int, *, runs: int = 10, progress: Callable[[int, int], None] | None = None
) -> BriefBench:
    with tempfile.TemporaryDirectory(prefix="memory-mcp-bench-") as tmp:
        root = Path(tmp) / "project"
        (root / ".git").mkdir(parents=True)
        (root / "CLAUDE.md").write_text("# Rules\n\nUse tabs.\n")
        settings = Settings(data_dir=tmp)
        settings.embedder.backend = "bm25"
        async with MemoryService.open(settings) as memory:
            started = time.perf_counter()
            await populate(memory, root, facts)
            report = BriefBench(facts=facts, populate_s=time.perf_counter() - started)
            for n in range(runs):
                started = time.perf_counter()
                brief = await memory.brief(root, dated=True)
                inject(root, brief.text)
                report.runs_ms.append((time.perf_counter() - started) * 1000)
                report.tokens = brief.tokens
                if progress is not None:
                    progress(n + 1, runs)
        return report
