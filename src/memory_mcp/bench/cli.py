"""``memory-mcp bench``: the benchmarks anyone can rerun (see the README).

Each command imports its benchmark only when it runs, so the command line starts fast."""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from memory_mcp.cli.base import (
    CwdOption,
    JsonOption,
    engine_errors,
    err,
    open_memory,
    out,
    print_json,
    progress_bar,
    run_engine,
    settings_for,
)
from memory_mcp.config import LoadedSettings, replaced
from memory_mcp.errors import InvalidInput

if TYPE_CHECKING:
    from memory_mcp.embedders.base import Embedder
    from memory_mcp.service import MemoryService

bench_app = typer.Typer(help="Benchmarks anyone can rerun (see the README).", no_args_is_help=True)

StorageOption = Annotated[
    str,
    typer.Option(
        help="Store the memories where this storage.url says (postgresql://…; it must "
        "be empty). Default: a SQLite file in a temporary folder."
    ),
]


@bench_app.command("fold")
def bench_fold(
    pairs: Annotated[Path, typer.Argument(help="Labelled pairs, JSONL (see bench/FORMAT.md).")],
    cv: Annotated[
        int | None,
        typer.Option(
            min=2,
            max=20,
            help="Cross-validate the fold threshold in K folds: each fold's pairs are "
            "decided with the threshold the other folds choose (most duplicates folded at "
            "precision >= 0.95, no contradiction folded).",
        ),
    ] = None,
    storage: StorageOption = "",
    as_json: JsonOption = False,
) -> None:
    """Store a then b for each pair in a fresh scope; count what the pipeline did per label."""
    from memory_mcp.bench.fold import (
        ACTIONS,
        LABELS,
        cross_validate,
        pair_evidence,
        read_pairs,
        run_fold_bench,
    )

    async def work() -> Any:
        loaded = _bench_settings(storage)
        items = read_pairs(pairs)
        async with _bench_memory(loaded, storage, "fold") as memory:
            if cv is not None:
                evidence = await pair_evidence(memory, items)
                identity = memory.engine.embeddings.identity or "bm25"
                fold = loaded.settings.fold
                return cross_validate(items, evidence, fold, k=cv, embedder=identity)
            with progress_bar("pairs", len(items)) as report:
                return await run_fold_bench(memory, items, progress=report)

    result = run_engine(work)
    if as_json:
        print_json(result.to_json())
        return
    report = result.report if cv is not None else result
    out.print(f"{report.pairs} pairs, embedder {report.embedder}")
    if cv is not None:
        chosen = ", ".join(f"{t:.2f}" for t in result.chosen)
        out.print(f"{cv}-fold cross-validation, out-of-fold decisions; thresholds chosen: {chosen}")
    labels = [label for label in LABELS if label in report.counts] + sorted(
        set(report.counts) - set(LABELS)
    )
    for source, by_label in [("all", report.counts), *sorted(report.by_source.items())]:
        if source != "all" and len(report.by_source) < 2:
            continue
        rows = [
            [label, *[str(counts[a]) for a in ACTIONS], str(sum(counts.values()))]
            for label in labels
            if (counts := by_label.get(label))
        ]
        out.table((f"label ({source})", *ACTIONS, "total"), rows)
    precision, recall = report.fold_precision, report.fold_recall
    out.print(
        f"fold precision {precision:.3f}" if precision is not None else "fold precision n/a",
        f"  recall {recall:.3f}" if recall is not None else "",
    )
    for label in ("update", "contradiction"):
        if label in report.counts:
            kept, both = report.old_value_kept(label)
            out.print(f"{label}: old value kept visible {kept}, left as two current facts {both}")


@bench_app.command("retrieval")
def bench_retrieval(
    data: Annotated[Path, typer.Argument(help="Benchmark data (*.jsonl or *.jsonl.gz).")],
    run_out: Annotated[Path, typer.Option("--out", help="Where to write the run file.")],
    cases: Annotated[int | None, typer.Option(help="Only the first N cases.")] = None,
    vector_cache: Annotated[
        Path | None,
        typer.Option(
            help="Keep the passages' vectors in this file and reuse them in later runs "
            "(same model, same texts: only search changes)."
        ),
    ] = None,
    storage: StorageOption = "",
    as_json: JsonOption = False,
) -> None:
    """Run the retrieval benchmark (bench/FORMAT.md): store, search, score."""
    from memory_mcp.bench.retrieval import read_cases, run_retrieval_bench
    from memory_mcp.bench.vector_cache import CachedEmbedder
    from memory_mcp.embedders.runtime import build_candidates

    if not data.is_file():
        err.print(f"error: {data} is not a file")
        raise typer.Exit(66)
    total_cases = sum(1 for _ in read_cases(data)) if cases is None else cases

    async def work() -> Any:
        loaded = _bench_settings(storage)
        cached: CachedEmbedder | None = None
        if vector_cache is not None:
            found = build_candidates(loaded.settings.embedder)
            if not found:
                err.print("error: --vector-cache needs a model (the embedder backend is bm25)")
                raise typer.Exit(2)
            cached = CachedEmbedder(found[0], vector_cache)
        async with _bench_memory(loaded, storage, "retrieval", embedder=cached) as memory:
            with (
                progress_bar("cases", total_cases) as report,
                run_out.open("w", encoding="utf-8") as fh,
            ):
                return await run_retrieval_bench(memory, data, fh, max_cases=cases, progress=report)

    report = run_engine(work)
    if as_json:
        print_json(report.to_json())
        return
    for warning in report.warnings:
        err.print(f"warning: {warning}")
    out.print(
        f"{report.cases} cases, {report.memories} memories, {report.table.queries} scored "
        f"queries ({report.table.turn_queries} with gold turns, for the turn metrics); "
        f"embedder {report.embedder}, search {report.mode}; run file {run_out}"
    )
    if report.skipped:
        out.print(f"{report.skipped} memories could not be stored (see the warnings)")
    _metric_tables(report.table, report.even, report.odd)


@bench_app.command("launch")
def bench_launch(
    launches: Annotated[int, typer.Option(min=1, max=1000, help="Timed launches.")] = 10,
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Seconds from spawning `memory-mcp serve` (stdio) to tools/list, and to a first search."""
    from memory_mcp.bench.launch import run_launch_bench

    with engine_errors(), progress_bar("launches", launches) as report:
        result = run_launch_bench(
            cwd or Path.cwd(), launches=launches, progress=report, search=True
        )
    if as_json:
        print_json(result.to_json())
        return
    if result.cold is not None:
        out.print(f"first launch (no handshake cache yet): {result.cold:.3f} s")
    out.print(
        f"{len(result.warm)} launches: tools/list median {result.median:.3f} s "
        f"(min {min(result.warm):.3f} s, max {max(result.warm):.3f} s; target 0.6 s)"
    )
    search = result.search_median
    if search is not None:
        out.print(
            f"first memory_search answered: median {search:.3f} s after launch "
            f"(target: hybrid within 1 s); hybrid in {result.hybrid} of {len(result.launches)}"
        )


@bench_app.command("cli")
def bench_cli(
    memories: Annotated[
        int, typer.Option(min=0, max=100_000, help="Memories in the store first.")
    ] = 1000,
    runs: Annotated[int, typer.Option(min=1, max=1000, help="Timed runs per command.")] = 10,
    no_bytecode: Annotated[
        bool,
        typer.Option(
            "--no-bytecode/--skip-no-bytecode",
            help="Also time each command without Python's bytecode cache.",
        ),
    ] = True,
    as_json: JsonOption = False,
) -> None:
    """Whole-process seconds of --version, status, brief, brief --hook, inject, store, search."""
    from memory_mcp.bench.commands import run_commands_bench

    with engine_errors(), progress_bar("runs", None) as report:
        result = run_commands_bench(
            memories=memories, runs=runs, uncached=no_bytecode, progress=report
        )
    if as_json:
        print_json(result.to_json())
        return
    out.print(f"{memories:,} memories; median of {runs} runs each, as whole processes")
    rows = []
    for timing in result.to_json()["commands"]:
        uncached = timing["median_no_bytecode_s"]
        rows.append(
            [
                timing["command"],
                f"{timing['median_s']:.3f} s",
                f"{timing['max_s']:.3f} s",
                "" if uncached is None else f"{uncached:.3f} s",
                f"{timing['target_s']:.1f} s",
                "ok" if timing["median_s"] <= timing["target_s"] else "OVER",
            ]
        )
    out.table(("command", "median", "max", "no bytecode", "target", ""), rows)


@bench_app.command("brief")
def bench_brief(
    facts: Annotated[int, typer.Option(min=0, max=1_000_000, help="Facts in the store.")] = 50_000,
    runs: Annotated[int, typer.Option(min=1, max=1000, help="Timed runs.")] = 10,
    as_json: JsonOption = False,
) -> None:
    """Time building the spawn brief and injecting it, at a number of facts."""
    from memory_mcp.bench.brief import run_brief_bench

    async def work() -> Any:
        with progress_bar("runs", runs) as report:
            return await run_brief_bench(facts, runs=runs, progress=report)

    result = run_engine(work)
    if as_json:
        print_json(result.to_json())
        return
    data = result.to_json()
    out.print(
        f"{facts:,} facts (written in {data['populate_s']} s): brief + inject first "
        f"{data['first_ms']} ms, median {data['median_ms']} ms, max {data['max_ms']} ms "
        f"over {runs} runs; brief {data['brief_tokens']} tokens"
    )


@bench_app.command("perf")
def bench_perf(
    sizes: Annotated[
        str, typer.Option(help="Comma-separated numbers of memories, e.g. 1000,10000,50000,200000.")
    ] = "1000,10000",
    samples: Annotated[int, typer.Option(min=5, max=10000, help="Timed calls per figure.")] = 50,
    rounds: Annotated[
        int,
        typer.Option(
            min=1,
            max=100,
            help="Measure every size this many times, the sizes taking turns (each store "
            "filled once), and print each figure's median and range over the rounds.",
        ),
    ] = 1,
    launch: Annotated[
        bool, typer.Option("--launch/--no-launch", help="Also time spawn to tools/list.")
    ] = True,
    server_rss: Annotated[
        bool,
        typer.Option(
            "--server-rss/--no-server-rss",
            help="Also measure the resident memory of a memory-mcp serve of its own on each "
            "store, after searches, stores and a brief through MCP.",
        ),
    ] = True,
    keep: Annotated[
        Path | None,
        typer.Option(
            help="Keep each size's store in KEEP/<size>; a store kept there by an earlier "
            "run is measured again without refilling it (a fill stopped while embedding "
            "resumes)."
        ),
    ] = None,
    storage: Annotated[
        str,
        typer.Option(
            help="Put each size's store where this storage.url says (postgresql://…); "
            "{size} in it is replaced by the size. Each must be empty. Default: a SQLite "
            "file in a temporary folder."
        ),
    ] = "",
    as_json: JsonOption = False,
) -> None:
    """Store / search latency, import rate, brief time, size and memory at each size."""
    from memory_mcp.bench.launch import run_launch_bench
    from memory_mcp.bench.perf import cpu_description, kept_fill, run_perf

    try:
        counts = [int(part) for part in sizes.split(",") if part.strip()]
    except ValueError:
        err.print(f"error: --sizes takes numbers separated by commas, got {sizes!r}")
        raise typer.Exit(2) from None
    if not counts or min(counts) < 10:
        err.print("error: --sizes needs numbers of at least 10")
        raise typer.Exit(2)
    if storage and len(counts) > 1 and "{size}" not in storage:
        err.print(f"error: --storage needs {{size}} in it to hold {len(counts)} sizes")
        raise typer.Exit(2)
    if keep is not None:
        for n in counts:
            try:
                kept_fill(keep / str(n))
            except ValueError as exc:
                err.print(f"error: {exc}")
                raise typer.Exit(2) from None

    async def work() -> Any:
        loaded = settings_for(None)
        with progress_bar("starting", None) as report:

            def step(phase: str, done: int, total: int) -> None:
                report(done, total, phase)

            return await run_perf(
                counts,
                loaded.settings,
                samples=samples,
                progress=step,
                keep=keep,
                storage=storage,
                rounds=rounds,
                served=server_rss,
            )

    result = run_engine(work)
    if launch:
        with tempfile.TemporaryDirectory(prefix="memory-mcp-launch-") as tmp:
            result.launch_s = run_launch_bench(Path(tmp), launches=10).median
    if as_json:
        print_json({"machine": cpu_description(), **result.to_json()})
        return
    out.print(f"machine: {cpu_description()}; embedder: {result.points[0].embedder}")
    header = (
        "memories",
        "current",
        "import/s",
        "embedded/s",
        "store p50",
        "store p95",
        "search p50",
        "search p95",
        "1st search",
        "brief+inject",
        "bytes/memory",
        "RSS MB",
        "server RSS MB",
        "server peak MB",
        "server 1st search",
        "model, stored",
        "model, query",
        "store/model",
        "search/model",
        "store - model",
        "search - model",
        "search after store",
        "deferred/store",
        "model batch/s",
        "import/model",
        "index wait (stores / searches)",
        "warm read",
        "dense recall@50",
    )
    rows = [
        [
            f"{point.memories:,}",
            "-" if point.current_records is None else f"{point.current_records:,}",
            f"{point.import_per_s:,.0f}",
            f"{point.import_embedded_per_s:,.0f}",
            f"{point.store_p50_ms} ms",
            f"{point.store_p95_ms} ms",
            f"{point.search_p50_ms} ms",
            f"{point.search_p95_ms} ms",
            f"{point.first_search_ms} ms",
            f"{point.brief_inject_ms} ms",
            f"{point.bytes_per_memory:,.0f}",
            f"{point.rss_mb:,.0f}",
            "-" if point.server_rss_mb is None else f"{point.server_rss_mb:,.0f}",
            "-" if point.server_peak_mb is None else f"{point.server_peak_mb:,.0f}",
            "-" if point.server_first_search_s is None else f"{point.server_first_search_s} s",
            _ms(point.embed_one_ms),
            _ms(point.embed_query_ms),
            _times(point.ratios["store_p50_x"]),
            _times(point.ratios["search_p50_x"]),
            _over(point.ratios["store_p50_over_ms"]),
            _over(point.ratios["search_p50_over_ms"]),
            _after_store(
                point.search_after_store_p50_ms,
                point.search_after_store_p95_ms,
                point.ratios["search_after_store_p50_over_ms"],
            ),
            "-" if point.deferred_ms is None else f"{point.deferred_ms} ms",
            "-" if point.model_batch_per_s is None else f"{point.model_batch_per_s:,.0f}",
            _share(point.ratios["import_of_model"]),
            _waits(point.index_wait_s, point.index_wait_searches_s),
            "-" if point.warm_read_s is None else f"{point.warm_read_s} s",
            "-" if point.dense_recall_at_50 is None else f"{point.dense_recall_at_50:.3f}",
        ]
        for point in result.points
    ]
    out.table(header, rows)
    for point in result.points:
        if point.server_error:
            err.print(f"{point.memories:,}: the server could not be measured: {point.server_error}")
    if rounds > 1:
        _print_medians(result.medians())
    if result.launch_s is not None:
        out.print(f"spawn to tools/list over stdio: median {result.launch_s:.3f} s of 10")


def _print_medians(medians: list[dict[str, Any]]) -> None:
    """Each size's medians over its rounds, with their ranges, and as multiples of the
    model; then each size against the one before it."""
    out.print("medians over the rounds (lowest-highest):")
    names = (
        ("store p50", "store_p50_ms", " ms"),
        ("store p95", "store_p95_ms", " ms"),
        ("search p50", "search_p50_ms", " ms"),
        ("search p95", "search_p95_ms", " ms"),
        ("model, stored", "embed_one_ms", " ms"),
        ("model, query", "embed_query_ms", " ms"),
        ("brief+inject", "brief_inject_ms", " ms"),
        ("RSS MB", "rss_mb", ""),
        ("server RSS MB", "server_rss_mb", ""),
        ("server peak MB", "server_peak_mb", ""),
        ("server 1st search", "server_first_search_s", " s"),
        ("dense recall@50", "dense_recall_at_50", ""),
        ("store/model", "store_p50_x", "x"),
        ("search/model", "search_p50_x", "x"),
        ("store - model", "store_p50_over_ms", " ms"),
        ("search - model", "search_p50_over_ms", " ms"),
        ("after store", "search_after_store_p50_ms", " ms"),
        ("after store - model", "search_after_store_p50_over_ms", " ms"),
    )

    def cell(spread: dict[str, float] | None, unit: str) -> str:
        if spread is None:
            return "-"
        return f"{spread['median']:g}{unit} ({spread['min']:g}-{spread['max']:g})"

    out.table(
        ("memories", "runs", *(label for label, _, _ in names)),
        [
            [f"{row['memories']:,}", str(row["runs"]), *(cell(row[k], u) for _, k, u in names)]
            for row in medians
        ],
    )
    out.print(
        "RSS is this process's: after the first round it includes what earlier rounds "
        "left in it (each opened and closed its store and model). Server RSS is a "
        "memory-mcp serve's own, on the store after its searches, stores and brief; "
        "server peak is that process's highest since launch, server 1st search its "
        "first search's answer from launch."
    )
    growth = ("store_p50_ms", "store_p95_ms", "search_p50_ms", "search_p95_ms")
    for before, after in itertools.pairwise(medians):
        parts = [
            f"{name.replace('_ms', '').replace('_', ' ')} "
            f"{after[name]['median'] / before[name]['median']:.2f}x"
            for name in growth
            if after[name] and before[name] and before[name]["median"]
        ]
        out.print(f"{after['memories']:,} against {before['memories']:,}: {', '.join(parts)}")


def _after_store(p50: float | None, p95: float | None, over: float | None) -> str:
    """A search right after a store: p50 / p95, and p50 over the query's model time."""
    return "-" if p50 is None else f"{p50} / {p95} ms ({_over(over)})"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value} ms"


def _over(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f} ms"


def _times(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.1f}x"


def _waits(before_stores: float | None, before_searches: float | None) -> str:
    """The index waits before the timed stores and before the timed searches."""
    if before_stores is None:
        return "-"
    return f"{before_stores} s / {before_searches} s"


def _share(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.0%}"


@bench_app.command("score")
def bench_score(
    data: Annotated[Path, typer.Argument(help="Benchmark data (*.jsonl or *.jsonl.gz).")],
    run_file: Annotated[
        Path, typer.Argument(help="A run file (bench/FORMAT.md), from any system.")
    ],
    as_json: JsonOption = False,
) -> None:
    """Score a run file against the benchmark data (bench/FORMAT.md), as bench retrieval does."""
    from memory_mcp.bench.retrieval import score_run

    for path in (data, run_file):
        if not path.is_file():
            err.print(f"error: {path} is not a file")
            raise typer.Exit(66)

    with engine_errors():
        report = score_run(data, run_file)
    if as_json:
        print_json(report.to_json())
        return
    if report.missing:
        err.print(f"warning: {report.missing} queries have no run line (scored as empty rankings)")
    if report.unknown:
        err.print(f"warning: {report.unknown} run lines name no query of {data}")
    out.print(
        f"{report.table.queries} scored queries ({report.table.turn_queries} with gold turns, "
        "for the turn metrics)"
    )
    _metric_tables(report.table, report.even, report.odd)


def _metric_tables(table: Any, even: Any, odd: Any) -> None:
    """The metric table, then the same table for each half of the queries."""
    _metric_table(table)
    for name, half in (("queries at even positions", even), ("queries at odd positions", odd)):
        out.print(f"\n{name} ({half.queries} scored):")
        _metric_table(half)


def _metric_table(table: Any) -> None:
    from memory_mcp.bench.metrics import HEADLINE

    columns = [*HEADLINE, "sess_any@5", "turn_all@10", "turn_ndcg@10", "turn_recall@50"]
    rows = [("overall", table.queries, table.overall)] + [
        (c, table.queries_by_category[c], m) for c, m in table.by_category.items()
    ]
    width = max(len(name) for name, _, _ in rows)
    out.print(f"{'category':<{width}}  {'n':>4}  " + "  ".join(f"{c:>14}" for c in columns))
    for name, n, metrics in rows:
        cells = [f"{metrics[c]:>14.1f}" if c in metrics else f"{'-':>14}" for c in columns]
        out.print(f"{name:<{width}}  {n:>4}  " + "  ".join(cells))


@asynccontextmanager
async def _bench_memory(
    loaded: LoadedSettings, storage: str, bench: str, *, embedder: Embedder | None = None
) -> AsyncIterator[MemoryService]:
    """The bench's own store, open: a SQLite file in a temporary folder, or ``storage``
    (``loaded``'s ``storage.url``, from ``_bench_settings``), which must be empty.

    Raises:
        InvalidInput: the store at ``storage`` holds records.
    """
    with tempfile.TemporaryDirectory(prefix="memory-mcp-bench-") as tmp:
        database = None if storage else Path(tmp) / "bench.db"
        async with open_memory(loaded, database, needs_vectors=True, embedder=embedder) as memory:
            if storage and (await memory.status()).stats.records:
                raise InvalidInput(
                    f"the store at {memory.location} holds records: the {bench} bench "
                    "needs an empty one"
                )
            yield memory


def _bench_settings(storage: str) -> LoadedSettings:
    """The user's settings, with the bench's own store: ``storage`` (a ``storage.url``), or
    when empty the SQLite file the bench names, whatever ``storage.url`` the user's
    environment or config gives (a bench must never write into a real store)."""
    loaded = settings_for(None)
    given = loaded.settings
    return replace(loaded, settings=replaced(given, storage=replaced(given.storage, url=storage)))
