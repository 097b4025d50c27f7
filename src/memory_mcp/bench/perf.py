"""``bench perf``: the speed figures of SPEC §12, at growing numbers of memories.

For each size N, in a fresh store:

1. other projects get N/10 memories each (three of them), so searches must not
   read other projects' rows or vectors;
2. the project gets N memories through ``import`` (``exchange.import_jsonl``,
   what ``memory-mcp import`` runs on an export file): bulk throughput in
   memories per second, once to the records written (searchable, lexically)
   and once to every record embedded (the end of the command);
3. ``store`` latency: single writes of fresh memories, after the store's file is
   read once (``warm_file``) and a warm-up; then
   the time the embedding they deferred takes (the long ones' sentence windows,
   done after the answer), per store;
4. ``search`` latency: hybrid searches with the filters agents use (kinds,
   tags, a time bound), after a warm-up; then the same searches each right after
   a store (an agent's session mixes them: a store changes the words' record
   counts that BM25 weighs a search's words by);
5. the model alone: one text at a time, the strings the stores wrote (the
   floor of a store) and the queries the searches asked (the floor of a
   search; a query is shorter than a memory and embeds in about half the
   time), and the imported memories' passages in one batched pass (the
   ceiling of an import's embedding rate);
6. brief + inject time (``build_brief`` then ``inject`` into three files);
7. database bytes per memory and the process's resident memory; then, with the
   store closed, the resident memory of a ``memory-mcp serve`` of its own on the
   store after searches, stores and a brief through MCP (``measure_server``):
   the bench's own process holds what it did before (other sizes, the model's
   batched pass), a server does not.

The memories come from ``generate``: seeded, coding-agent-like (commands,
decisions, conventions, versions, paths, gotchas across several stacks), of
varied length, with some near-duplicates that the fold decision has to catch.
Figures are medians of repetitions (p50) and 95th percentiles (p95).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio

from memory_mcp.agents.inject import inject
from memory_mcp.bench.launch import Served, executable, process_resident_mb
from memory_mcp.config import Settings, WriteSettings, replaced
from memory_mcp.embedders.base import Embedder
from memory_mcp.errors import InvalidInput
from memory_mcp.exchange import header_line, record_line
from memory_mcp.passages import record_passages
from memory_mcp.records import utcnow
from memory_mcp.scope import project_scope
from memory_mcp.service import MemoryService
from memory_mcp.storage.base import Filters
from memory_mcp.write import prepare

_STACKS = {
    "python": ("pytest -q", "uv run", "ruff check .", "mypy --strict", "pyproject.toml", "3.12"),
    "node": ("npm test", "pnpm install", "eslint .", "tsc --noEmit", "package.json", "20"),
    "rust": (
        "cargo test",
        "cargo build --release",
        "cargo clippy",
        "cargo fmt",
        "Cargo.toml",
        "1.79",
    ),
    "go": (
        "go test ./...",
        "go build ./cmd/...",
        "golangci-lint run",
        "go vet ./...",
        "go.mod",
        "1.22",
    ),
    "java": ("./gradlew test", "./gradlew build", "spotless", "checkstyle", "build.gradle", "21"),
}
_AREAS = (
    "billing",
    "auth",
    "search",
    "uploads",
    "notifications",
    "reporting",
    "sync",
    "checkout",
    "profiles",
    "scheduler",
    "exports",
    "webhooks",
    "cache",
    "metrics",
    "admin",
    "onboarding",
)
_THINGS = (
    "Postgres",
    "Redis",
    "SQLite",
    "Kafka",
    "S3",
    "GitHub Actions",
    "Fly.io",
    "Docker",
    "Terraform",
    "Sentry",
    "Grafana",
    "nginx",
    "Celery",
    "gRPC",
    "OpenAPI",
    "feature flags",
)
_TEMPLATES = (
    ("procedure", "Run the {area} tests with `{test}`; they need {thing} running locally."),
    ("procedure", "Build the {area} service with `{build}` before `{lint}`, or CI fails."),
    ("decision", "We chose {thing} for {area} because the old setup could not keep up at peak."),
    ("decision", "The {area} module talks to {thing} only through its adapter in src/{area}/."),
    ("fact", "The {stack} toolchain is pinned to {version} in {manifest} for {area}."),
    ("fact", "{area} config lives in config/{area}.toml; secrets come from the environment."),
    ("gotcha", "Never run `{build}` in the {area} folder directly: it skips the codegen step."),
    ("gotcha", "The {area} tests are flaky when {thing} starts slowly; rerun once before digging."),
    ("preference", "For {area}, the user prefers small PRs with the tests in the same commit."),
    ("fact", "Port {port} serves {area} in development; {thing} listens on {port2}."),
    ("journal", "Fixed the {area} timeout: the {thing} client had no retry on connection reset."),
    ("journal", "Moved {area} from {thing} to {thing2}; migration script in scripts/{area}.py."),
)
_DETAIL = (
    " The reason is recorded in docs/adr/{n:04d}.md.",
    " See the runbook section on {area} for the rollback steps.",
    " This bit us twice in the last release, so keep it in mind when touching {area}.",
    " The same applies to the staging environment, which mirrors production settings.",
)


def generate(
    count: int, seed: int = 1, *, tag_prefix: str = ""
) -> list[tuple[str, str, list[str]]]:
    """``count`` coding-agent memories as (kind, text, tags); about 5% near-duplicates."""
    rng = random.Random(seed)
    out: list[tuple[str, str, list[str]]] = []
    for n in range(count):
        if out and rng.random() < 0.05:  # a reworded repeat of an earlier memory
            kind, text, tags = rng.choice(out)
            out.append(
                (kind, text.replace("The ", "Note: the ", 1).rstrip(".") + " (again).", tags)
            )
            continue
        stack = rng.choice(list(_STACKS))
        test, build, lint, _types, manifest, version = _STACKS[stack]
        kind, template = rng.choice(_TEMPLATES)
        area = rng.choice(_AREAS)
        values = {
            "area": f"{area}-{n % 97}",
            "thing": rng.choice(_THINGS),
            "thing2": rng.choice(_THINGS),
            "stack": stack,
            "test": test,
            "build": build,
            "lint": lint,
            "manifest": manifest,
            "version": version,
            "port": 3000 + n % 5000,
            "port2": 6000 + n % 3000,
            "n": n,
        }
        text = template.format(**values)
        for detail in rng.sample(_DETAIL, rng.choice((0, 0, 1, 2))):
            text += detail.format(**values)
        out.append((kind, text, [f"{tag_prefix}{stack}", f"{tag_prefix}{area}"]))
    return out


Progress = Callable[[str, int, int], None]
"""Called with (phase, done, total) as a run goes on."""


def _silent(phase: str, done: int, total: int) -> None:
    """No progress shown."""


def export_lines(rows: Sequence[tuple[str, str, list[str]]], root: Path) -> list[str]:
    """``rows`` as a ``memory-mcp export`` file of project ``root``, one minute apart."""
    scope = project_scope(root)
    end = utcnow().timestamp()
    lines = [header_line()]
    settings = WriteSettings()
    for n, (kind, text, tags) in enumerate(rows):
        at = datetime.fromtimestamp(end - 60 * (len(rows) - n), tz=UTC)
        draft = prepare(
            text,
            kind=kind,
            scope=scope,
            importance=None,
            tags=tags,
            agent="bench",
            at=at,
            settings=settings,
        )
        lines.append(record_line(draft.record))
    return lines


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def resident_mb() -> float:
    """This process's resident memory now, else its peak, in MB."""
    now = process_resident_mb()
    if now is not None:
        return now
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024 if sys.platform == "darwin" else 1024)


@dataclass
class PerfPoint:
    """The figures at one size."""

    memories: int
    import_per_s: float  # records written (searchable lexically at once)
    import_embedded_per_s: float  # records written and embedded: the whole import
    store_p50_ms: float
    store_p95_ms: float
    search_p50_ms: float
    search_p95_ms: float
    first_search_ms: float  # the first search after opening: loads the scope's vectors
    brief_inject_ms: float
    bytes_per_memory: float
    rss_mb: float
    embedder: str
    run_on_store: int  # 1: the run that filled the store; more: a --keep store measured again
    # The model's own time for one text, p50 in this run, over the strings the timed
    # stores wrote (the floor of a store) and over the queries the timed searches
    # asked (the floor of a search), so that the latencies compare across machines.
    embed_one_ms: float | None = None
    embed_query_ms: float | None = None
    # The searches timed again, each right after a store (not timed) of another memory.
    search_after_store_p50_ms: float | None = None
    search_after_store_p95_ms: float | None = None
    # The embedding the timed stores deferred until after their answers, per store.
    deferred_ms: float | None = None
    # Memories a second the model embeds in one batched pass over the passages of
    # imported memories (up to ``_BATCH_SAMPLE`` of them), in this run.
    model_batch_per_s: float | None = None
    # Seconds the run waited, before the timed operations, for the index the backend
    # builds over the vectors in the background (SQLite: the scope's clusters).
    index_wait_s: float | None = None
    # The same wait after the timed stores, before the timed searches: for the
    # clusterings the stores started (SQLite), which would run beside the searches.
    index_wait_searches_s: float | None = None
    # Seconds spent reading the SQLite store's file once before the timed operations
    # (``warm_file``); None for a store that ``--storage`` names.
    warm_read_s: float | None = None
    # Current records in the whole store when measured (all projects, the stores of
    # earlier runs included): a kept store grows by every run's stores, and by
    # whatever else is stored in it.
    current_records: int | None = None
    # The share of the exact 50 nearest records (every vector scored) that the
    # approximate search returns, over the search queries and stored texts.
    dense_recall_at_50: float | None = None
    # The resident memory (MB) of a ``memory-mcp serve`` process on this store, model
    # loaded, after its searches, stores and brief (``measure_server``); None when
    # not measured (a bench given its own embedder, or ``served=False``).
    server_rss_mb: float | None = None
    # That process's highest resident memory since its launch (loading the model and
    # the vectors included; Linux only).
    server_peak_mb: float | None = None
    # Seconds from that process's launch to its first search's answer (SPEC §12: within
    # 1 s): the model and the project's vectors loaded first.
    server_first_search_s: float | None = None
    # Why the server's figures are missing, when it failed (the rest of the point stands).
    server_error: str | None = None

    def as_json(self) -> dict[str, Any]:
        """Every figure, with ``ratios``, as ``--json`` prints a point."""
        return {**asdict(self), **self.ratios}

    @property
    def ratios(self) -> dict[str, float | None]:
        """Store p50 / p95 as multiples of ``embed_one_ms`` and search p50 / p95 of
        ``embed_query_ms``; each p50 over its model time in milliseconds (SPEC §12: a
        store one embedding + 5 ms, a search one embedding + 8 ms); the import's
        embedding rate as a share of the model's batched one."""
        out: dict[str, float | None] = {}
        for op, unit in (("store", self.embed_one_ms), ("search", self.embed_query_ms)):
            for p in ("p50", "p95"):
                value = getattr(self, f"{op}_{p}_ms")
                out[f"{op}_{p}_x"] = round(value / unit, 2) if unit else None
            p50 = getattr(self, f"{op}_p50_ms")
            out[f"{op}_p50_over_ms"] = round(p50 - unit, 2) if unit else None
        after = self.search_after_store_p50_ms
        query = self.embed_query_ms
        out["search_after_store_p50_over_ms"] = (
            round(after - query, 2) if after is not None and query else None
        )
        batch = self.model_batch_per_s
        out["import_of_model"] = round(self.import_embedded_per_s / batch, 3) if batch else None
        return out


# The figures that ``PerfReport.medians`` sums up over the rounds of a size.
SPREAD_FIGURES = (
    "store_p50_ms",
    "store_p95_ms",
    "search_p50_ms",
    "search_p95_ms",
    "embed_one_ms",
    "embed_query_ms",
    "brief_inject_ms",
    "rss_mb",
    "server_rss_mb",
    "server_peak_mb",
    "server_first_search_s",
    "dense_recall_at_50",
    "store_p50_x",
    "store_p95_x",
    "search_p50_x",
    "search_p95_x",
    "store_p50_over_ms",
    "search_p50_over_ms",
    "search_after_store_p50_ms",
    "search_after_store_p50_over_ms",
)


@dataclass
class PerfReport:
    points: list[PerfPoint] = field(default_factory=list)
    launch_s: float | None = None

    def medians(self) -> list[dict[str, Any]]:
        """Per size, in the order first measured: how many runs, and each figure's
        median, lowest and highest over them (``SPREAD_FIGURES``; None where a run
        has no such figure)."""
        by_size: dict[int, list[dict[str, Any]]] = {}
        for point in self.points:
            by_size.setdefault(point.memories, []).append(point.as_json())
        out: list[dict[str, Any]] = []
        for memories, runs in by_size.items():
            row: dict[str, Any] = {"memories": memories, "runs": len(runs)}
            for name in SPREAD_FIGURES:
                values = [r[name] for r in runs if r[name] is not None]
                row[name] = (
                    {
                        "median": round(statistics.median(values), 4),
                        "min": min(values),
                        "max": max(values),
                    }
                    if values
                    else None
                )
            out.append(row)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "points": [p.as_json() for p in self.points],
            "medians": self.medians(),
            "launch_to_tools_list_s": self.launch_s,
        }


@dataclass
class Fill:
    """How a store was filled, kept with a ``--keep`` store as ``fill.json``.

    Written as the fill goes, so that a fill stopped while embedding (hours at
    200,000 memories) resumes where it stopped: embedding time adds up over
    the runs, and the import figures count only the project's own import.
    """

    memories: int
    import_per_s: float = 0.0
    import_embedded_per_s: float = 0.0
    runs: int = 0  # timed runs on this store so far
    others_written: int = 0  # other projects whose records are all written
    written_s: float | None = None  # seconds the project's records took to write
    embedding_s: float = 0.0  # seconds spent embedding them so far
    done: bool = False
    storage: str = ""  # the storage.url of the store (empty: memory.db beside fill.json)


class FillInterrupted(RuntimeError):
    """A fill stopped while writing records: it cannot resume."""


_SAVE_EVERY = 1000  # records embedded between two saves of an unfinished fill


async def fill(
    memory: MemoryService,
    root: Path,
    state: Fill,
    *,
    progress: Progress | None = None,
    save: Callable[[Fill], None] | None = None,
) -> Fill:
    """Fill ``memory``: other projects, then ``root``'s project through ``import``.

    Picks up an unfinished ``state``; ``save`` is called with it at each step.

    Raises:
        FillInterrupted: an earlier fill stopped while writing records.
    """
    say = progress or _silent
    keep = save or (lambda _: None)
    count = state.memories
    if state.others_written or state.written_s is not None:  # resuming: embed what is left
        started = time.perf_counter()

        def resumed(done: int, total: int) -> None:
            say(f"{count:,}: resuming, embedding", done, total)

        await memory.reembed(progress=resumed)
        if state.written_s is not None:
            state.embedding_s += time.perf_counter() - started
        keep(state)
    for i in range(state.others_written, 3):
        other = root.parent / f"other-{i}"
        (other / ".git").mkdir(parents=True, exist_ok=True)
        await _refuse_partial(memory, other)
        rows = generate(max(1, count // 10), seed=1000 + i, tag_prefix="o-")

        def other_written(done: int, total: int, i: int = i) -> None:
            if done == total:
                state.others_written = i + 1
                keep(state)

        def other_embedded(done: int, total: int, i: int = i) -> None:
            say(f"{count:,}: other project {i + 1} of 3, embedding", done, total)

        await memory.import_(
            export_lines(rows, other),
            progress=other_written,
            embed_progress=other_embedded,
        )
    if state.written_s is None:
        await _refuse_partial(memory, root)
        lines = export_lines(generate(count, seed=count), root)
        started = time.perf_counter()
        written = 0.0
        saved = 0

        def on_written(done: int, total: int) -> None:
            nonlocal written
            say(f"{count:,}: importing", done, total)
            if done == total:
                written = time.perf_counter()
                state.written_s = written - started
                keep(state)

        def on_embedded(done: int, total: int) -> None:
            nonlocal saved
            say(f"{count:,}: importing, embedding", done, total)
            if done - saved >= _SAVE_EVERY:
                saved = done
                state.embedding_s = time.perf_counter() - written
                keep(state)

        summary = await memory.import_(lines, progress=on_written, embed_progress=on_embedded)
        if summary.records_added != count:
            raise RuntimeError(f"the import was incomplete: {summary}")
        state.embedding_s = time.perf_counter() - written
    identity = memory.engine.embeddings.identity
    if memory.engine.embeddings.ready and await memory.engine.store.count_needing_embedding(
        identity
    ):
        raise RuntimeError("records were left without vectors")
    assert state.written_s is not None
    state.import_per_s = round(count / state.written_s, 1)
    state.import_embedded_per_s = round(count / (state.written_s + state.embedding_s), 1)
    state.done = True
    keep(state)
    return state


async def _refuse_moved(memory: MemoryService, root: Path, filled: Fill) -> None:
    """Raise if a kept store's project, where it is now, holds few of the memories its
    fill wrote: projects are named by their paths, so a store moved or copied
    elsewhere would be measured on an all but empty project."""
    held = await memory.engine.store.count_unarchived(project_scope(root).key)
    if held < filled.memories // 2:
        raise InvalidInput(
            f"the project at {root} holds {held:,} memories, not the {filled.memories:,} "
            "its fill wrote: was the folder moved or copied? A kept store is measured "
            "where it was filled"
        )


async def _refuse_partial(memory: MemoryService, root: Path) -> None:
    """Raise if a project that is about to be imported already has records."""
    filters = Filters(scope_keys=(project_scope(root).key,), corpora=("facts", "journal", "docs"))
    if await memory.engine.store.current(filters, 1):
        raise FillInterrupted(
            f"an earlier fill stopped while writing {root.name}'s records; "
            "remove the folder and start again"
        )


async def measure(
    memory: MemoryService,
    root: Path,
    filled: Fill,
    *,
    samples: int = 50,
    progress: Progress | None = None,
    database: Path | None = None,
) -> PerfPoint:
    """Time the operations on a filled store (``filled.runs`` earlier runs on it).

    ``database``: the SQLite file of the store, read once (``warm_file``) before the
    timed operations.
    """
    say = progress or _silent
    count = filled.memories
    if filled.runs == 0:  # the memories that follow the imported ones
        fresh = generate(count + (samples + 5) * 2, seed=count)[count:]
    else:  # others than earlier runs stored, lest they fold as exact repeats
        fresh = generate((samples + 5) * 2, seed=count + 104_729 * filled.runs)
    index_wait_s = await _settle_index(memory, root)
    warm_read_s = None
    if database is not None:
        say(f"{count:,}: warm read", 0, 1)
        started = time.perf_counter()
        await anyio.to_thread.run_sync(warm_file, database)
        warm_read_s = round(time.perf_counter() - started, 2)
    say(f"{count:,}: store", 0, 1)
    store_ms: list[float] = []
    stored: list[str] = []  # as written: the model alone embeds the same strings
    for n, (kind, text, tags) in enumerate(fresh[: samples + 5]):
        stored.append(f"{text} [{filled.runs}.{n}]")
        started = time.perf_counter()
        await memory.store(stored[-1], kind=kind, cwd=root, tags=tags)
        if n >= 5:  # warm-up
            store_ms.append((time.perf_counter() - started) * 1000)

    deferred_ms = None
    if memory.engine.embeddings.identity is not None:
        started = time.perf_counter()
        await memory.engine.finish_deferred(600)
        deferred_ms = (time.perf_counter() - started) * 1000 / (samples + 5)
    # the clustering the stores started (a scope's tail past its share), if any: the
    # bench stores a session's worth in seconds, and a clustering beside the timed
    # searches (4-7 s of one core at 50,000 memories) slowed them by a third
    index_wait_searches_s = await _settle_index(memory, root)

    say(f"{count:,}: search", 0, 1)
    questions = _questions(count, samples + 5)
    asked = [q.query for q in questions]

    async def timed_search(n: int) -> float:
        """Milliseconds the n-th search takes (``questions[n]``)."""
        q = questions[n]
        started = time.perf_counter()
        await memory.search(
            q.query, cwd=root, kinds=q.kinds, tags=q.tags, since=q.since, count_access=False
        )
        return (time.perf_counter() - started) * 1000

    search_ms: list[float] = []
    first_search_ms = 0.0
    for n in range(samples + 5):
        took = await timed_search(n)
        if n == 0:  # loads the scope's vectors into memory
            first_search_ms = took
        if n >= 5:
            search_ms.append(took)

    say(f"{count:,}: search after a store", 0, 1)
    after_store_ms: list[float] = []
    for n, (kind, text, tags) in enumerate(fresh[samples + 5 : (samples + 5) * 2]):
        await memory.store(f"{text} [{filled.runs}.after.{n}]", kind=kind, cwd=root, tags=tags)
        took = await timed_search(n)  # the same searches as above, the same model time
        if n >= 5:
            after_store_ms.append(took)
    if memory.engine.embeddings.identity is not None:
        await memory.engine.finish_deferred(600)

    say(f"{count:,}: the model alone", 0, 1)
    embed_ms = await _model_alone(memory, stored)
    query_ms = await _model_alone(memory, asked)
    model_batch_per_s = await _model_batch_rate(memory, count)
    say(f"{count:,}: dense recall", 0, 1)
    unseen = generate(samples, seed=count * 31 + 7)  # memories like the stored, not stored
    recall = await _dense_recall(memory, root, [q for q, *_ in _QUERIES], unseen)

    say(f"{count:,}: brief", 0, 1)
    brief_ms: list[float] = []
    for _ in range(5):
        started = time.perf_counter()
        brief = await memory.brief(root, dated=True)
        inject(root, brief.text)
        brief_ms.append((time.perf_counter() - started) * 1000)

    stats = await memory.engine.store.stats()
    total = sum(stats.records.values())
    filled.runs += 1
    return PerfPoint(
        memories=count,
        import_per_s=filled.import_per_s,
        import_embedded_per_s=filled.import_embedded_per_s,
        store_p50_ms=round(statistics.median(store_ms), 2),
        store_p95_ms=round(_percentile(store_ms, 0.95), 2),
        search_p50_ms=round(statistics.median(search_ms), 2),
        search_p95_ms=round(_percentile(search_ms, 0.95), 2),
        search_after_store_p50_ms=round(statistics.median(after_store_ms), 2),
        search_after_store_p95_ms=round(_percentile(after_store_ms, 0.95), 2),
        first_search_ms=round(first_search_ms, 1),
        brief_inject_ms=round(statistics.median(brief_ms), 1),
        bytes_per_memory=round((stats.database_bytes + stats.cache_bytes) / max(1, total), 1),
        rss_mb=round(resident_mb(), 1),
        embedder=memory.engine.embeddings.identity or "bm25",
        run_on_store=filled.runs,
        embed_one_ms=round(statistics.median(embed_ms), 2) if embed_ms else None,
        embed_query_ms=round(statistics.median(query_ms), 2) if query_ms else None,
        deferred_ms=None if deferred_ms is None else round(deferred_ms, 2),
        model_batch_per_s=model_batch_per_s,
        index_wait_s=index_wait_s,
        index_wait_searches_s=index_wait_searches_s,
        warm_read_s=warm_read_s,
        current_records=sum(n for (_, _, state), n in stats.records.items() if state == "current"),
        dense_recall_at_50=recall,
    )


_QUERIES: tuple[tuple[str, tuple[str, ...], tuple[str, ...], str | None], ...] = (
    # (the words, kinds, tags, since) of the searches timed, the filters agents use
    ("how do I run the tests", (), (), None),
    ("which database do we use", ("decision",), (), None),
    ("flaky tests", ("gotcha",), (), None),
    ("build the service", (), ("python",), None),
    ("what port does it listen on", (), (), "2000-01-01"),
)


@dataclass(frozen=True)
class Question:
    """One timed search: its query and filters."""

    query: str
    kinds: tuple[str, ...]
    tags: tuple[str, ...]
    since: str | None


def _questions(count: int, n: int) -> list[Question]:
    """The ``n`` searches timed at size ``count``: ``_QUERIES`` in turn, each with an
    area (the same at every run on a size)."""
    rng = random.Random(count)
    return [
        Question(f"{words} {rng.choice(_AREAS)}", kinds, tags, since)
        for words, kinds, tags, since in itertools.islice(itertools.cycle(_QUERIES), n)
    ]


_SERVED_SEARCHES = 100
_SERVED_STORES = 20


@dataclass(frozen=True)
class ServerFigures:
    """What a ``memory-mcp serve`` of its own on a size's store showed."""

    first_search_s: float  # from its launch to its first search's answer
    rss_mb: float | None  # resident memory after its work, settled
    peak_mb: float | None  # highest resident memory since launch


def measure_server(root: Path, url: str, filled: Fill) -> ServerFigures:
    """A ``memory-mcp serve`` on the store at ``url``, in ``root``: how long its first
    search took from launch, its resident memory (MB) and its peak since launch: a
    server's own figures, free of what this process did before (other sizes' stores,
    the model's batched pass).

    Its first search loads the model and the project's vectors; once it has settled
    (the vectors' clusters built in the background, a maintenance round),
    ``_SERVED_SEARCHES`` searches, ``_SERVED_STORES`` stores of fresh memories and a
    brief through MCP, and once it has settled again (the stores' deferred
    embedding, maintenance), its memory. Settled: less than a tenth of a core over a
    second more than maintenance waits without a call (``QUIET_S``), so that a round
    that was due has run.
    """
    from memory_mcp.maintenance.runner import QUIET_S

    count = filled.memories
    fresh = generate(_SERVED_STORES, seed=count + 7_919 * (filled.runs + 1))
    here = {"cwd": str(root)}
    command = [executable(), "serve"]
    with Served(command, root, env={"MEMORY_MCP_STORAGE_URL": url}, timeout=900) as served:
        for n, q in enumerate(_questions(count, _SERVED_SEARCHES)):
            arguments: dict[str, Any] = {"query": q.query, **here}
            arguments |= {"kinds": list(q.kinds)} if q.kinds else {}
            arguments |= {"tags": list(q.tags)} if q.tags else {}
            arguments |= {"since": q.since} if q.since else {}
            served.call("memory_search", arguments)
            if n == 0:
                first_search_s = served.since_launch()
                served.settle(QUIET_S + 1)
        for n, (kind, text, tags) in enumerate(fresh):
            content = f"{text} [{filled.runs}.served.{n}]"
            served.call("memory_store", {"content": content, "kind": kind, "tags": tags, **here})
        served.call("memory_brief", here)
        served.settle(QUIET_S + 1)
        return ServerFigures(first_search_s, served.resident_mb(), served.peak_mb())


async def _model_alone(memory: MemoryService, texts: Sequence[str]) -> list[float]:
    """Milliseconds the model takes for each of ``texts`` alone, one call each, after
    the first five (empty without a model)."""
    times: list[float] = []
    if memory.engine.embeddings.identity is None:
        return times
    for n, text in enumerate(texts):
        started = time.perf_counter()
        if await memory.engine.embeddings.embed([text]) is None:
            return []
        if n >= 5:
            times.append((time.perf_counter() - started) * 1000)
    return times


_BATCH_SAMPLE = 2000  # imported memories whose passages the model embeds in one pass


async def _model_batch_rate(memory: MemoryService, count: int) -> float | None:
    """Memories a second the model embeds, all passages of each, in one batched call.

    The texts are the first of those the fill imported (the same generator and
    seed): what an import embeds, given to the model at once, with no store
    around it.
    """
    engine = memory.engine
    if engine.embeddings.identity is None:
        return None
    texts = [text for _, text, _ in generate(min(count, _BATCH_SAMPLE), seed=count)]
    passages = [p for text in texts for p in record_passages(text, [])]
    started = time.perf_counter()
    if await engine.embeddings.embed(passages) is None:
        return None
    return round(len(texts) / (time.perf_counter() - started), 1)


def warm_file(database: Path) -> int:
    """Read a SQLite store's file (and its write-ahead log) once, start to end, in a
    child process: the bytes read.

    The timed operations then meet the store as a server in use has it, its pages in
    the OS's cache, not as a store left alone for minutes: a store whose rounds take
    turns with other sizes' (``--rounds``), or whose import ended long before. A
    machine may evict pages that nobody read for a while; this one's kernel pages out
    memory idle for a minute (DAMON), and at 200,000 memories a rare-word lookup's
    p90 was 6.6 ms on the first pass over a kept store against 1.3-1.4 on the next.

    Not in this process, which holds the store open: closing any descriptor of a file
    drops every POSIX lock the process holds on it, SQLite's included, and another
    process that then opened and closed the store took itself for its last user,
    deleted the write-ahead log this one was writing, and found the file malformed
    (seen on a kept store read by a script during a run; sqlite.org/howtocorrupt.html).
    """
    read = subprocess.run(
        [sys.executable, "-c", _WARM_READ, str(database), f"{database}-wal"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(read.stdout)


_WARM_READ = """
import sys
read = 0
for name in sys.argv[1:]:
    try:
        with open(name, "rb") as file:
            while chunk := file.read(1 << 22):
                read += len(chunk)
    except FileNotFoundError:
        pass
print(read)
"""


async def _settle_index(memory: MemoryService, root: Path) -> float | None:
    """Load the project's vectors and wait for the backend's index over them (seconds
    waited), so that the timed operations meet the index they will run on."""
    identity = memory.engine.embeddings.identity
    if identity is None:
        return None
    started = time.perf_counter()
    keys = await memory.engine.scope_keys("all", root)
    if not await memory.engine.store.load_vectors(identity, keys, settle=1800):
        raise RuntimeError("the vector index was still being built after 30 minutes")
    return round(time.perf_counter() - started, 2)


_RECALL_K = 50


async def _dense_recall(
    memory: MemoryService,
    root: Path,
    queries: Sequence[str],
    memories: Sequence[tuple[str, str, Sequence[str]]],
) -> float | None:
    """The mean share of the exact ``_RECALL_K`` nearest records that ``nearest``
    returns, for each query (with each area) and each memory text (what a store
    looks for its neighbours with)."""
    engine = memory.engine
    identity = engine.embeddings.identity
    if identity is None:
        return None
    texts = [f"{q} {area}" for q in queries for area in _AREAS] + [t for _, t, _ in memories]
    vectors = await engine.embeddings.embed(texts)
    if vectors is None:
        return None
    keys = await engine.scope_keys("all", root)
    filters = Filters(scope_keys=tuple(keys), corpora=("facts",))
    shares: list[float] = []
    for vector in vectors:
        exact = await engine.store.nearest(vector, identity, filters, _RECALL_K, exact=True)
        if not exact:
            continue
        found = await engine.store.nearest(vector, identity, filters, _RECALL_K)
        truth = {s.record.id for s in exact}
        shares.append(len(truth & {s.record.id for s in found}) / len(truth))
    return round(statistics.mean(shares), 4) if shares else None


FILL_FILE = "fill.json"


async def run_perf(
    sizes: Sequence[int],
    settings: Settings,
    *,
    samples: int = 50,
    embedder: Embedder | None = None,
    progress: Progress | None = None,
    keep: Path | None = None,
    storage: str = "",
    rounds: int = 1,
    served: bool = False,
) -> PerfReport:
    """One store per size: fresh in a temporary directory, or ``keep/<size>``.

    A ``keep/<size>`` store filled by an earlier run is measured again as it is
    (its import figures are those of the run that filled it); one whose fill
    stopped while embedding is finished first.

    ``storage`` puts each size's store where a ``storage.url`` says instead (a
    Postgres database, say): ``{size}`` in it is replaced by the size, and each
    such store must be empty (or, with ``keep``, the one that run filled).

    ``rounds``: measure every size that many times, the sizes taking turns
    (50,000, 200,000, 50,000, ...), each store filled once: on a machine whose
    speed drifts, the medians over the rounds (``PerfReport.medians``) compare
    the sizes where one run each would not.

    ``served``: also measure each point's ``server_rss_mb`` (a ``memory-mcp serve``
    process, which reads the settings of this process's environment and config
    files; not with an ``embedder`` of the caller's).

    Raises:
        InvalidInput: several sizes but no ``{size}`` in ``storage``, or a store there
            holds records this bench did not write.
    """
    if storage and len(sizes) > 1 and "{size}" not in storage:
        raise InvalidInput(f"--storage needs {{size}} in it to hold {len(sizes)} sizes")
    if rounds < 1:
        raise InvalidInput(f"rounds must be at least 1, got {rounds}")
    report = PerfReport()
    with contextlib.ExitStack() as every:
        # A size's temporary folder is removed after its last round: with one round,
        # the sizes' stores are never on disk together.
        temporary = {count: every.enter_context(contextlib.ExitStack()) for count in sizes}
        folders: dict[int, Path] = {}
        fills: dict[int, Fill | None] = {}
        for count in sizes:
            if keep is None:
                made = tempfile.TemporaryDirectory(prefix="memory-mcp-perf-")
                folders[count], fills[count] = Path(temporary[count].enter_context(made)), None
            else:
                folders[count] = keep / str(count)
                fills[count] = kept_fill(folders[count])
        for turn in range(rounds):
            for count in sizes:
                point, fills[count] = await _perf_point(
                    count,
                    folders[count],
                    fills[count],
                    settings,
                    samples=samples,
                    embedder=embedder,
                    progress=progress,
                    keep=keep,
                    storage=storage,
                    served=served and embedder is None,
                )
                report.points.append(point)
                if turn == rounds - 1:
                    temporary[count].close()
    return report


async def _perf_point(
    count: int,
    tmp: Path,
    filled: Fill | None,
    settings: Settings,
    *,
    samples: int,
    embedder: Embedder | None,
    progress: Progress | None,
    keep: Path | None,
    storage: str,
    served: bool = False,
) -> tuple[PerfPoint, Fill]:
    """One size's figures in ``tmp`` (filled first unless ``filled`` says it was)."""
    fresh = filled is None
    root = tmp / "project"
    url = storage.replace("{size}", str(count))
    if filled is None:  # a new store: its project is a repository
        await anyio.Path(root / ".git").mkdir(parents=True)
        filled = Fill(memories=count, storage=url)
    elif filled.storage != url:
        raise InvalidInput(
            f"{tmp} was filled on {filled.storage or 'its own SQLite file'}, not on "
            f"{url or 'its own SQLite file'}: give the --storage it was filled with"
        )

    def save(state: Fill, folder: Path = tmp) -> None:
        if keep is not None:
            (folder / FILL_FILE).write_text(json.dumps(asdict(state)) + "\n")

    # Its own store: the one --storage names, else the file in the folder, whatever
    # storage.url the user's settings give.
    database = None if url else tmp / "memory.db"
    async with MemoryService.open(
        replaced(settings, storage=replaced(settings.storage, url=url)),
        database=database,
        embedder=embedder,
        wait_for_embedder=60,
    ) as memory:
        if url and fresh and (await memory.status()).stats.records:
            raise InvalidInput(
                f"the store at {memory.location} holds records: bench perf fills an "
                "empty store (give it an empty database, or {size} in the URL)"
            )
        if embedder is None and not memory.engine.embeddings.ready:
            await memory.engine.embeddings.wait_loaded(600)
        if not filled.done:
            filled = await fill(memory, root, filled, progress=progress, save=save)
        elif not fresh:
            await _refuse_moved(memory, root, filled)
        point = await measure(
            memory,
            root,
            filled,
            samples=samples,
            progress=progress,
            database=database,
        )
    save(filled)
    if served:  # the store closed: the server is its only user
        say = progress or _silent
        say(f"{count:,}: a server's memory", 0, 1)
        where = url or f"sqlite:///{(tmp / 'memory.db').resolve()}"
        try:
            seen = await anyio.to_thread.run_sync(measure_server, root, where, filled)
        except (OSError, RuntimeError, TimeoutError) as exc:  # the other figures stand
            point.server_error = str(exc)
        else:
            point.server_first_search_s = round(seen.first_search_s, 2)
            point.server_rss_mb = None if seen.rss_mb is None else round(seen.rss_mb, 1)
            point.server_peak_mb = None if seen.peak_mb is None else round(seen.peak_mb, 1)
    return point, filled


def kept_fill(folder: Path) -> Fill | None:
    """The fill record of a store kept by an earlier run (finished or not), or None.

    Raises:
        ValueError: the folder exists but holds no finished store.
    """
    if not folder.exists():
        return None
    try:
        return Fill(**json.loads((folder / FILL_FILE).read_text()))
    except (OSError, ValueError, TypeError) as exc:
        raise ValueError(
            f"{folder} holds no store finished by bench perf ({exc}); remove it or choose another"
        ) from exc


def cpu_description() -> str:
    """A line about this machine for the report."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores {model}".strip()
