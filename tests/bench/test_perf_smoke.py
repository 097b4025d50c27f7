"""A tiny run of bench perf: it works end to end (no timing is checked)."""

from __future__ import annotations

import io
import json
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from helpers.storage import open_url, store_place, store_url
from memory_mcp.bench.perf import generate, kept_fill, run_perf
from memory_mcp.config import EmbedderSettings, Settings
from memory_mcp.embedders.base import FakeEmbedder, Matrix
from memory_mcp.errors import InvalidInput

pytestmark = pytest.mark.anyio


def test_the_generator_is_seeded_varied_and_has_near_duplicates() -> None:
    first = generate(400, seed=9)
    assert first == generate(400, seed=9)
    kinds = {kind for kind, _, _ in first}
    assert {"fact", "decision", "procedure", "gotcha", "journal"} <= kinds
    lengths = sorted(len(text) for _, text, _ in first)
    assert lengths[-1] > 2 * lengths[0]
    assert sum(text.endswith("(again).") for _, text, _ in first) >= 5


@pytest.mark.sqlite_only
async def test_bytes_per_memory_count_the_vectors_kept_beside_the_database(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A store's kept vector copies are disk it takes (176 MB at 200,000 memories)."""
    from memory_mcp.storage.sqlite import SqliteStore

    seen: list[tuple[int, int]] = []
    stats = SqliteStore.stats

    async def with_copies(self: SqliteStore) -> object:
        found = await stats(self)
        found.cache_bytes = 3_000_000
        seen.append((found.database_bytes, sum(found.records.values())))
        return found

    monkeypatch.setattr(SqliteStore, "stats", with_copies)
    report = await run_perf([30], Settings(), samples=5, embedder=FakeEmbedder())
    (point,) = report.points
    database_bytes, records = seen[-1]
    assert point.bytes_per_memory == round((database_bytes + 3_000_000) / records, 1)


@pytest.mark.sqlite_only  # bench perf measures the SQLite files it makes
async def test_a_tiny_perf_run_reports_every_figure() -> None:
    report = await run_perf([30], Settings(), samples=5, embedder=FakeEmbedder())
    (point,) = report.points
    assert point.memories == 30
    for value in (
        point.import_per_s,
        point.import_embedded_per_s,
        point.store_p50_ms,
        point.store_p95_ms,
        point.search_p50_ms,
        point.search_p95_ms,
        point.search_after_store_p50_ms,
        point.search_after_store_p95_ms,
        point.brief_inject_ms,
        point.bytes_per_memory,
        point.rss_mb,
    ):
        assert value is not None and value > 0
    assert point.store_p95_ms >= point.store_p50_ms
    data = report.to_json()["points"][0]
    assert data["embedder"] == "fake:hash-256"
    assert point.embed_one_ms is not None and point.embed_one_ms > 0  # the model alone
    assert point.embed_query_ms is not None and point.embed_query_ms > 0
    # a store against the model on what it stored, a search on what it asked
    assert data["store_p50_x"] == round(point.store_p50_ms / point.embed_one_ms, 2)
    assert data["search_p95_x"] == round(point.search_p95_ms / point.embed_query_ms, 2)
    assert data["store_p50_over_ms"] == round(point.store_p50_ms - point.embed_one_ms, 2)
    assert data["search_p50_over_ms"] == round(point.search_p50_ms - point.embed_query_ms, 2)
    assert point.search_after_store_p50_ms is not None
    assert data["search_after_store_p50_over_ms"] == round(
        point.search_after_store_p50_ms - point.embed_query_ms, 2
    )
    assert point.deferred_ms is not None and point.deferred_ms >= 0  # the windows, after
    assert point.model_batch_per_s is not None and point.model_batch_per_s > 0
    assert data["import_of_model"] == round(
        point.import_embedded_per_s / point.model_batch_per_s, 3
    )
    assert point.index_wait_s is not None and point.index_wait_s >= 0
    assert point.warm_read_s is not None and point.warm_read_s >= 0
    # 30 imported, 3 for each of three other projects, 10 stores (5 of them warm-up)
    # and 10 more before the searches after a store, which may fold
    assert point.current_records is not None and 39 < point.current_records <= 59
    assert point.dense_recall_at_50 == 1.0  # a scope this small is scored whole


class _Recording(FakeEmbedder):
    """Records the texts of every single-text call."""

    def __init__(self) -> None:
        super().__init__()
        self.alone: list[str] = []

    def embed(self, texts: Sequence[str]) -> Matrix:
        if len(texts) == 1:
            self.alone.append(texts[0])
        return super().embed(texts)


@pytest.mark.sqlite_only  # bench perf measures the SQLite files it makes
async def test_the_model_alone_embeds_the_strings_stored_and_asked() -> None:
    """The floor of a store is its own text (the run's suffix included), that of a
    search its query: each embedded once in the operation and once alone."""
    embedder = _Recording()
    await run_perf([30], Settings(), samples=5, embedder=embedder)
    stored = [t for t in embedder.alone if t.endswith("[0.9]")]
    assert len(stored) == 2
    asked = Counter(t for t in embedder.alone if t.startswith("what port does it listen on"))
    assert asked and all(n >= 2 for n in asked.values())


def test_the_warm_read_reads_the_store_and_its_log_whole(tmp_path: Path) -> None:
    from memory_mcp.bench.perf import warm_file

    database = tmp_path / "memory.db"
    database.write_bytes(b"x" * 5_000_000)  # more than one chunk
    assert warm_file(database) == 5_000_000  # no log: the file alone
    (tmp_path / "memory.db-wal").write_bytes(b"y" * 1234)
    assert warm_file(database) == 5_001_234


def test_the_warm_read_leaves_the_stores_locks_to_it(tmp_path: Path) -> None:
    """The read must not close a descriptor of the store in the process that holds it
    open: that drops SQLite's locks, and the next process to close the store takes
    itself for the last one and deletes the log still in use."""
    import sqlite3
    import subprocess
    import sys

    from memory_mcp.bench.perf import warm_file

    database = tmp_path / "memory.db"
    conn = sqlite3.connect(database, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE t (x)")
        conn.execute("INSERT INTO t VALUES (1)")
        assert warm_file(database) > 0
        other = (
            "import sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
            "c.execute('INSERT INTO t VALUES (2)'); c.close()"
        )
        subprocess.run([sys.executable, "-c", other, str(database)], check=True)
        assert (tmp_path / "memory.db-wal").exists()  # still this process's log
        assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 2
    finally:
        conn.close()


@pytest.mark.sqlite_only  # bench perf measures the SQLite files it makes
async def test_rounds_take_turns_on_stores_filled_once(tmp_path: Path) -> None:
    """``rounds``: the sizes take turns, each store filled once and measured again;
    the medians sum up each size's runs."""
    report = await run_perf(
        [30, 40], Settings(), samples=5, embedder=FakeEmbedder(), keep=tmp_path, rounds=2
    )
    assert [(p.memories, p.run_on_store) for p in report.points] == [
        (30, 1),
        (40, 1),
        (30, 2),
        (40, 2),
    ]
    assert report.points[2].import_per_s == report.points[0].import_per_s  # not refilled
    grown = [p.current_records or 0 for p in report.points[1::2]]
    assert grown[1] > grown[0]  # the second round meets the first one's stores
    assert json.loads((tmp_path / "40" / "fill.json").read_text())["runs"] == 2
    medians = report.to_json()["medians"]
    assert [(m["memories"], m["runs"]) for m in medians] == [(30, 2), (40, 2)]
    first, again = report.points[1].store_p50_ms, report.points[3].store_p50_ms
    spread = medians[1]["store_p50_ms"]
    assert (spread["min"], spread["max"]) == (min(first, again), max(first, again))
    assert spread["median"] == round((first + again) / 2, 4)
    with pytest.raises(InvalidInput, match="rounds must be at least 1"):
        await run_perf([30], Settings(), samples=5, embedder=FakeEmbedder(), rounds=0)


@pytest.mark.sqlite_only  # bench perf measures the SQLite files it makes
async def test_rounds_without_keep_measure_one_temporary_store_per_size() -> None:
    report = await run_perf([30], Settings(), samples=5, embedder=FakeEmbedder(), rounds=2)
    assert [p.run_on_store for p in report.points] == [1, 2]


@pytest.mark.sqlite_only
async def test_perf_waits_for_the_clusters_and_measures_their_recall(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from memory_mcp.storage.sqlite import dense

    monkeypatch.setattr(dense, "CLUSTER_FROM", 40)
    monkeypatch.setattr(dense, "IVF_PROBES", 20)  # of about 55 clusters
    monkeypatch.setattr(dense, "PROBE_ROWS", 1)  # however few rows they hold
    report = await run_perf([600], Settings(), samples=5, embedder=FakeEmbedder())
    (point,) = report.points
    assert point.index_wait_s is not None
    assert point.dense_recall_at_50 is not None and 0 < point.dense_recall_at_50 < 1


@pytest.mark.sqlite_only
async def test_the_timed_searches_wait_for_the_clustering_the_stores_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bench's stores grow the scope's tail past its share; the clustering that
    starts then has ended (and its wait is reported) before the first timed search."""
    import time

    from memory_mcp.service import MemoryService
    from memory_mcp.storage.sqlite import dense

    monkeypatch.setattr(dense, "CLUSTER_FROM", 40)
    monkeypatch.setattr(dense, "PROBE_ROWS", 1)
    jobs: list[dense._Clustering] = []
    start = dense._Segment.start_clustering
    cluster = dense.cluster

    def started(self: dense._Segment) -> dense._Clustering:
        jobs.append(start(self))
        return jobs[-1]

    def slow(*args: object) -> object:
        time.sleep(0.5)
        return cluster(*args)  # type: ignore[arg-type]

    running_at_search: list[bool] = []
    search = MemoryService.search

    async def watched(self: MemoryService, *args: object, **kwargs: object) -> object:
        if not running_at_search:
            running_at_search.append(any(job.thread.is_alive() for job in jobs))
        return await search(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(dense._Segment, "start_clustering", started)
    monkeypatch.setattr(dense, "cluster", slow)
    monkeypatch.setattr(MemoryService, "search", watched)
    report = await run_perf([300], Settings(), samples=40, embedder=FakeEmbedder())
    (point,) = report.points
    assert len(jobs) >= 2  # one before the stores, one they started
    assert running_at_search == [False]
    assert point.index_wait_searches_s is not None and point.index_wait_searches_s >= 0.3


@pytest.mark.sqlite_only  # bench perf keeps its SQLite files in the folder
async def test_a_kept_store_copied_elsewhere_is_refused(tmp_path: Path) -> None:
    """Its project is named by its old path: measured here, it would be all but empty."""
    import shutil

    from memory_mcp.errors import InvalidInput

    await run_perf([30], Settings(), samples=5, embedder=FakeEmbedder(), keep=tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    with pytest.raises(InvalidInput, match="was the folder moved or copied"):
        await run_perf([30], Settings(), samples=5, embedder=FakeEmbedder(), keep=tmp_path / "b")


@pytest.mark.sqlite_only  # bench perf keeps its SQLite files in the folder
async def test_a_kept_store_is_measured_again_without_refilling(tmp_path: Path) -> None:
    first = await run_perf([30], Settings(), samples=5, embedder=FakeEmbedder(), keep=tmp_path)
    again = await run_perf([30], Settings(), samples=5, embedder=FakeEmbedder(), keep=tmp_path)
    (one,), (two,) = first.points, again.points
    assert (one.run_on_store, two.run_on_store) == (1, 2)
    assert two.import_per_s == one.import_per_s  # the figures of the run that filled it
    assert json.loads((tmp_path / "30" / "fill.json").read_text())["runs"] == 2
    stats = await _stats(tmp_path / "30" / "memory.db")
    # nothing imported twice; each run's stores, timed and before the searches after one
    assert stats == 30 + 3 * 3 + 2 * 2 * (5 + 5)


async def _stats(database: Path) -> int:
    from memory_mcp.storage.sqlite import SqliteStore

    store = await SqliteStore.open(database)
    try:
        return sum((await store.stats()).records.values())
    finally:
        await store.close()


def test_a_folder_without_a_finished_store_is_refused(tmp_path: Path) -> None:
    (tmp_path / "30").mkdir()
    with pytest.raises(ValueError, match="no store finished by bench perf"):
        kept_fill(tmp_path / "30")


@pytest.mark.sqlite_only  # bench perf keeps its SQLite files in the folder
async def test_a_fill_stopped_while_embedding_resumes(tmp_path: Path) -> None:
    class Stop(Exception):
        pass

    def stop_midway(phase: str, done: int, total: int) -> None:
        if phase.endswith("importing, embedding") and 0 < done < total:
            raise Stop

    with pytest.raises(Stop):
        await run_perf(
            [200],
            Settings(),
            samples=5,
            embedder=FakeEmbedder(),
            keep=tmp_path,
            progress=stop_midway,
        )
    state = json.loads((tmp_path / "200" / "fill.json").read_text())
    assert not state["done"] and state["others_written"] == 3 and state["written_s"] > 0
    report = await run_perf([200], Settings(), samples=5, embedder=FakeEmbedder(), keep=tmp_path)
    (point,) = report.points
    assert point.run_on_store == 1 and point.import_embedded_per_s > 0
    assert json.loads((tmp_path / "200" / "fill.json").read_text())["done"]
    assert await _stats(tmp_path / "200" / "memory.db") == 200 + 3 * 20 + 2 * (5 + 5)


async def test_a_fill_stopped_while_writing_cannot_resume(tmp_path: Path, storage_url: str) -> None:
    from memory_mcp.bench.perf import Fill, FillInterrupted, fill
    from memory_mcp.service import MemoryService

    root = tmp_path / "project"
    for folder in (root, tmp_path / "other-0"):
        (folder / ".git").mkdir(parents=True)
    settings, database = store_place(tmp_path, storage_url, "m")
    async with MemoryService.open(
        settings, database=database, embedder=FakeEmbedder(), wait_for_embedder=10
    ) as memory:
        await memory.store("half of an import", cwd=tmp_path / "other-0")
        with pytest.raises(FillInterrupted, match="remove the folder"):
            await fill(memory, root, Fill(memories=20))


def test_bench_cli_times_each_command_as_a_whole_process(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A tiny bench cli run: every command runs and is timed (no timing is checked), on a
    store of its own, not the one the user's storage.url names."""
    from memory_mcp.bench.commands import COMMANDS, run_commands_bench

    monkeypatch.setenv("MEMORY_MCP_EMBEDDER_BACKEND", "bm25")  # the model is not the point here
    users = tmp_path / "users-own.db"
    monkeypatch.setenv("MEMORY_MCP_STORAGE_URL", f"sqlite:///{users}")
    report = run_commands_bench(memories=20, runs=1, uncached=False)
    assert not users.exists()
    data = report.to_json()
    assert [c["command"] for c in data["commands"]] == [
        "--version",
        "status",
        "brief",
        "brief --hook",
        "inject",
        "store",
        "search",
    ]
    assert len(data["commands"]) == len(COMMANDS)
    assert all(c["median_s"] > 0 and c["target_s"] in (0.3, 1.0) for c in data["commands"])


async def test_each_size_goes_to_the_store_a_storage_url_names(
    tmp_path: Path, storage_url: str
) -> None:
    # On a server each size's database must exist before the bench opens it.
    template = store_url(tmp_path, storage_url, "perf20").replace("perf20", "perf{size}")
    store_url(tmp_path, storage_url, "perf30")
    report = await run_perf(
        [20, 30], Settings(), samples=5, embedder=FakeEmbedder(), storage=template
    )
    assert [p.memories for p in report.points] == [20, 30]
    assert all(p.warm_read_s is None for p in report.points)  # no file of its own to read
    async with open_url(template.replace("{size}", "30")) as filled:
        assert sum((await filled.status()).stats.records.values()) >= 30
    with pytest.raises(InvalidInput, match="holds records"):  # a store it did not make
        await run_perf(
            [30],
            Settings(),
            samples=5,
            embedder=FakeEmbedder(),
            storage=template.replace("{size}", "30"),
        )
    with pytest.raises(InvalidInput, match="needs"):
        await run_perf(
            [20, 30], Settings(), samples=5, embedder=FakeEmbedder(), storage="sqlite:///x.db"
        )


async def test_a_kept_fill_is_measured_again_only_on_the_store_it_filled(
    tmp_path: Path, storage_url: str
) -> None:
    first = store_url(tmp_path, storage_url, "first")
    keep = tmp_path / "keep"
    await run_perf([20], Settings(), samples=5, embedder=FakeEmbedder(), keep=keep, storage=first)
    again = await run_perf(
        [20], Settings(), samples=5, embedder=FakeEmbedder(), keep=keep, storage=first
    )
    assert again.points[0].run_on_store == 2
    with pytest.raises(InvalidInput, match="was filled on"):
        await run_perf(
            [20],
            Settings(),
            samples=5,
            embedder=FakeEmbedder(),
            keep=keep,
            storage=store_url(tmp_path, storage_url, "second"),
        )


async def test_a_servers_memory_is_measured_in_a_serve_of_its_own(
    tmp_path: Path, storage_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's figure comes from a ``memory-mcp serve`` on the size's store (and
    not from the store the settings name), which searched, stored and briefed there."""
    monkeypatch.setenv("MEMORY_MCP_EMBEDDER_BACKEND", "bm25")  # the server reads it too
    template = store_url(tmp_path, storage_url, "served") if storage_url else ""
    report = await run_perf(
        [20], Settings(), samples=5, keep=tmp_path / "keep", storage=template, served=True
    )
    (point,) = report.points
    assert point.server_rss_mb is not None and 10 < point.server_rss_mb < point.rss_mb + 500
    assert point.server_peak_mb is not None and point.server_peak_mb >= point.server_rss_mb
    assert point.server_first_search_s is not None and point.server_first_search_s > 0
    assert report.medians()[0]["server_rss_mb"]["median"] == point.server_rss_mb
    url = template or f"sqlite:///{tmp_path / 'keep' / '20' / 'memory.db'}"
    exported = io.StringIO()
    async with open_url(url) as filled:
        await filled.export(exported)
    # run 1's server stored its 20 memories there (folded ones among others' history)
    assert set(re.findall(r"\[1\.served\.(\d+)\]", exported.getvalue())) == {
        str(n) for n in range(20)
    }
    fake = await run_perf([20], Settings(), samples=5, embedder=FakeEmbedder(), served=True)
    assert fake.points[0].server_rss_mb is None, "a server cannot load the caller's embedder"


async def test_a_server_that_cannot_start_leaves_the_other_figures_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MEMORY_MCP_EMBEDDER_BACKEND", "nonsense")  # the server's settings only
    settings = Settings(embedder=EmbedderSettings(backend="bm25"))
    report = await run_perf([20], settings, samples=5, served=True)
    (point,) = report.points
    assert point.store_p50_ms > 0 and point.server_rss_mb is None
    assert point.server_error is not None and "embedder.backend" in point.server_error
    assert report.to_json()["points"][0]["server_error"] == point.server_error
