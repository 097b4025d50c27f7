"""Retrieval metrics of ``bench/FORMAT.md``.

A run ranks memory ids per query. Turn metrics compare the top k ids with the
query's ``gold`` ids; session metrics map ids to their group (session), keep
the first place of each group, and compare the first k groups with
``gold_groups``. A query with neither gold nor gold groups is skipped; one
with gold groups but no gold ids counts for the session metrics only.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

KS = (5, 10, 25, 50)
TURN_METRICS = [f"turn_{m}@{k}" for m in ("recall", "any", "all") for k in KS] + ["turn_ndcg@10"]
SESSION_METRICS = [f"sess_{m}@{k}" for m in ("any", "all") for k in KS]
HEADLINE = ("sess_all@5", "turn_recall@10")


@dataclass(frozen=True)
class QueryJudgement:
    case: str
    query: str
    category: str
    gold: frozenset[str]
    gold_groups: frozenset[str]


def query_metrics(
    ranked: Sequence[str], judgement: QueryJudgement, group_of: Mapping[str, str]
) -> dict[str, float]:
    """Every metric for one query (turn metrics only when it has gold ids)."""
    out: dict[str, float] = {}
    gold = judgement.gold
    if gold:
        for k in KS:
            top = set(ranked[:k])
            found = len(gold & top)
            out[f"turn_recall@{k}"] = found / len(gold)
            out[f"turn_any@{k}"] = float(found > 0)
            out[f"turn_all@{k}"] = float(found == len(gold))
        dcg = sum(1 / math.log2(i + 2) for i, mid in enumerate(ranked[:10]) if mid in gold)
        ideal = sum(1 / math.log2(i + 2) for i in range(min(len(gold), 10)))
        out["turn_ndcg@10"] = dcg / ideal
    if judgement.gold_groups:
        groups: list[str] = []
        for mid in ranked:
            group = group_of.get(mid)
            if group is not None and group not in groups:
                groups.append(group)
        for k in KS:
            top_groups = set(groups[:k])
            found = len(judgement.gold_groups & top_groups)
            out[f"sess_any@{k}"] = float(found > 0)
            out[f"sess_all@{k}"] = float(found == len(judgement.gold_groups))
    return out


@dataclass
class MetricTable:
    """Mean of each metric, overall and per category, in percent."""

    overall: dict[str, float] = field(default_factory=dict)
    by_category: dict[str, dict[str, float]] = field(default_factory=dict)
    queries: int = 0  # scored queries (session metrics: every query with gold groups)
    turn_queries: int = 0  # of those, the ones with gold ids (turn metrics)
    queries_by_category: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "queries": self.queries,
            "turn_queries": self.turn_queries,
            "overall": self.overall,
            "by_category": self.by_category,
            "queries_by_category": self.queries_by_category,
        }


def aggregate(rows: Iterable[tuple[str, dict[str, float]]]) -> MetricTable:
    """Average per-query metrics (category, metrics) into a table, in percent."""
    sums: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    counts: dict[str, int] = defaultdict(int)
    total = turn_total = 0
    for category, metrics in rows:
        if not metrics:
            continue
        total += 1
        turn_total += "turn_recall@10" in metrics
        counts[category] += 1
        for name, value in metrics.items():
            sums[category][name].append(value)
            sums["\0all"][name].append(value)

    def mean(values: dict[str, list[float]]) -> dict[str, float]:
        return {
            name: round(100 * sum(v) / len(v), 1)
            for name in TURN_METRICS + SESSION_METRICS
            if (v := values.get(name))
        }

    return MetricTable(
        overall=mean(sums["\0all"]),
        by_category={c: mean(sums[c]) for c in sorted(counts)},
        queries=total,
        turn_queries=turn_total,
        queries_by_category=dict(sorted(counts.items())),
    )
