"""``memory-mcp bench retrieval``: the retrieval benchmark of bench/FORMAT.md.

Every case gets a fresh project scope. Its memories are stored in file order
through the write pipeline (so near-duplicates fold and updates supersede, as
in use), each with its ``time`` as creation time. Each query is then searched
with its ``time`` as "now", through the same ``MemoryService.search`` that the
MCP tools call; a hit that folded or superseded other memories is listed with
all of its source ids, in its place. The run file and the metric table follow
FORMAT.md.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from memory_mcp.bench.files import read_jsonl
from memory_mcp.bench.metrics import MetricTable, QueryJudgement, aggregate, query_metrics
from memory_mcp.errors import InvalidInput
from memory_mcp.records import parse_time
from memory_mcp.service import MemoryService, StoreRequest

RUN_DEPTH = 50


@dataclass
class RetrievalReport:
    """The metric table overall and per category, plus the two halves of the queries."""

    table: MetricTable
    even: MetricTable
    odd: MetricTable
    cases: int
    memories: int
    embedder: str
    mode: str
    warnings: list[str] = field(default_factory=list)
    skipped: int = 0  # memories the write pipeline refused (e.g. empty text)

    def to_json(self) -> dict[str, Any]:
        return {
            "cases": self.cases,
            "memories": self.memories,
            "embedder": self.embedder,
            "mode": self.mode,
            "metrics": self.table.to_json(),
            "even_queries": self.even.to_json(),
            "odd_queries": self.odd.to_json(),
            "warnings": self.warnings,
            "skipped_memories": self.skipped,
        }


def read_cases(path: Path) -> Iterator[dict[str, Any]]:
    """Cases of a benchmark data file (``.jsonl`` or ``.jsonl.gz``).

    Raises:
        InvalidInput: a line is not a case (the message names it).
    """
    return read_jsonl(path, _case, "a benchmark case")


def _case(data: Any) -> dict[str, Any]:
    if not isinstance(data.get("memories"), list) or not isinstance(data.get("queries"), list):
        raise ValueError("a case needs 'memories' and 'queries' lists")
    str(data["case"])
    return dict(data)


def query_half(position: int) -> str:
    """'even' or 'odd': a query's position among all the queries of the data file.

    Methods are chosen on one half and checked on the other. Positions, not the
    numbers in ids: a sample taken every 4th question (as the LongMemEval file
    is, one query per case) has only even ids; and queries, not cases, so that
    a file of one conversation (the LoCoMo one) splits too.
    """
    return "even" if position % 2 == 0 else "odd"


def groups_of(case: dict[str, Any]) -> dict[str, str]:
    """Memory id -> the group (session) it came from."""
    return {str(m["id"]): str(m.get("group", "")) for m in case["memories"]}


@dataclass
class Tally:
    """Per-query metrics of a run, overall and for each half of the queries."""

    rows: list[tuple[str, dict[str, float]]] = field(default_factory=list)
    position: int = 0  # queries seen so far, scored or not
    halves: dict[str, list[tuple[str, dict[str, float]]]] = field(
        default_factory=lambda: {"even": [], "odd": []}
    )

    def add(
        self,
        case: dict[str, Any],
        query: dict[str, Any],
        ranked: Sequence[str],
        group_of: Mapping[str, str],
    ) -> None:
        """Score one query's ranking (queries with no gold at all are skipped).

        Call it for every query of the file, in file order: a query's half is its position.
        """
        half = query_half(self.position)
        self.position += 1
        judgement = QueryJudgement(
            case=str(case["case"]),
            query=str(query["id"]),
            category=str(query.get("category", "")),
            gold=frozenset(str(g) for g in query.get("gold", [])),
            gold_groups=frozenset(str(g) for g in query.get("gold_groups", [])),
        )
        if judgement.gold or judgement.gold_groups:
            metrics = query_metrics(ranked, judgement, group_of)
            self.rows.append((judgement.category, metrics))
            self.halves[half].append((judgement.category, metrics))

    def tables(self) -> tuple[MetricTable, MetricTable, MetricTable]:
        """All queries, the even-position queries, the odd-position queries."""
        return aggregate(self.rows), aggregate(self.halves["even"]), aggregate(self.halves["odd"])


@dataclass
class ScoreReport:
    """A run file scored against its data (``bench score``)."""

    table: MetricTable
    even: MetricTable
    odd: MetricTable
    missing: int  # queries of the data with no line in the run (scored as empty rankings)
    unknown: int  # run lines naming no query of the data

    def to_json(self) -> dict[str, Any]:
        return {
            "metrics": self.table.to_json(),
            "even_queries": self.even.to_json(),
            "odd_queries": self.odd.to_json(),
            "missing_queries": self.missing,
            "unknown_run_lines": self.unknown,
        }


def read_run(path: Path) -> dict[tuple[str, str], list[str]]:
    """A run file: (case, query) -> ranked memory ids.

    Raises:
        InvalidInput: a line is not a run line (the message names it).
    """
    return dict(read_jsonl(path, _run_line, "a run line"))


def _run_line(data: Any) -> tuple[tuple[str, str], list[str]]:
    ids = data["ranked"]
    if not isinstance(ids, list):
        raise TypeError("'ranked' is not a list")
    return (str(data["case"]), str(data["query"])), [str(i) for i in ids]


def score_run(data: Path, run: Path) -> ScoreReport:
    """Score any system's run file (bench/FORMAT.md) against the benchmark data."""
    ranked = read_run(run)
    tally = Tally()
    seen: set[tuple[str, str]] = set()
    missing = 0
    for case in read_cases(data):
        group_of = groups_of(case)
        for query in case["queries"]:
            key = (str(case["case"]), str(query["id"]))
            seen.add(key)
            missing += key not in ranked
            tally.add(case, query, ranked.get(key, []), group_of)
    table, even, odd = tally.tables()
    return ScoreReport(table, even, odd, missing, len(set(ranked) - seen))


async def run_retrieval_bench(
    memory: MemoryService,
    data: Path,
    run_out: TextIO,
    *,
    max_cases: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> RetrievalReport:
    """Run every case of ``data``, write the run file, and score it.

    ``memory`` should be opened on a scratch database: the bench writes to it.

    Args:
        memory: the service under test.
        data: the benchmark data file.
        run_out: where the run file's lines go.
        max_cases: stop after this many cases.
        progress: called with (cases done, cases to do or 0 when unknown) after each case.
    """
    tally = Tally()
    cases = memories = skipped = 0
    mode = "lexical"
    warnings: list[str] = []
    with tempfile.TemporaryDirectory(prefix="memory-mcp-bench-retrieval-") as tmp:
        for index, case in enumerate(read_cases(data)):
            if max_cases is not None and cases >= max_cases:
                break
            case_id = str(case["case"])
            scope_dir = Path(tmp) / f"case-{index:05d}"
            (scope_dir / ".git").mkdir(parents=True)
            requests = [
                StoreRequest(
                    str(m["text"]),
                    cwd=scope_dir,
                    agent="bench",
                    created_at=parse_time(str(m["time"])) if m.get("time") else None,
                )
                for m in case["memories"]
            ]
            results = await memory.store_valid(requests)
            memory_of: dict[str, str] = {}
            for result, item in zip(results, case["memories"], strict=True):
                if isinstance(result, InvalidInput):
                    skipped += 1
                    note = f"memory {item.get('id')} of {case_id} not stored: {result}"
                    if len(warnings) < 20:
                        warnings.append(note)
                else:
                    memory_of[result.id] = str(item["id"])
            group_of = groups_of(case)
            for query in case["queries"]:
                found = await memory.search(
                    str(query["text"]),
                    cwd=scope_dir,
                    scope="project",
                    limit=RUN_DEPTH,
                    # A run file is a ranking at least 50 deep: no relevance floor.
                    min_relevance=0.0,
                    count_access=False,
                    now=parse_time(str(query["time"])) if query.get("time") else None,
                )
                mode = found.mode
                warnings.extend(w for w in found.warnings if w not in warnings)
                ranked: list[str] = []
                for hit in found.hits:
                    for source in await memory.sources_of(hit.record):
                        mid = memory_of.get(source)
                        if mid is not None and mid not in ranked:
                            ranked.append(mid)
                run_out.write(
                    json.dumps({"case": case_id, "query": str(query["id"]), "ranked": ranked})
                    + "\n"
                )
                tally.add(case, query, ranked, group_of)
            cases += 1
            memories += len(requests)
            if progress is not None:
                progress(cases, max_cases or 0)
    table, even, odd = tally.tables()
    return RetrievalReport(
        table=table,
        even=even,
        odd=odd,
        cases=cases,
        memories=memories,
        embedder=memory.engine.embeddings.identity or "bm25",
        mode=mode,
        warnings=warnings,
        skipped=skipped,
    )
