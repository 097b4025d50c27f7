"""Retrieval metrics as bench/FORMAT.md defines them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from memory_mcp.bench.metrics import QueryJudgement, aggregate, query_metrics
from memory_mcp.bench.retrieval import score_run

GROUPS = {"m1": "s1", "m2": "s1", "m3": "s2", "m4": "s3", "m5": "s4", "m6": "s5", "m7": "s6"}


def judge(gold: set[str], groups: set[str]) -> QueryJudgement:
    return QueryJudgement("c", "q", "cat", frozenset(gold), frozenset(groups))


def test_turn_metrics_count_gold_ids_in_the_top_k() -> None:
    ranked = ["m3", "m1", "m4", "m5", "m6", "m2", "m7"]
    m = query_metrics(ranked, judge({"m1", "m2"}, {"s1"}), GROUPS)
    assert m["turn_recall@5"] == 0.5
    assert m["turn_any@5"] == 1.0
    assert m["turn_all@5"] == 0.0
    assert m["turn_all@10"] == 1.0
    ideal = 1 + 1 / math.log2(3)
    assert m["turn_ndcg@10"] == pytest.approx((1 / math.log2(3) + 1 / math.log2(7)) / ideal)


def test_session_metrics_keep_the_first_place_of_each_group() -> None:
    # m1 and m2 share s1: s1 takes one place, so s6 (m7) is the 5th distinct group.
    ranked = ["m1", "m2", "m3", "m4", "m5", "m7", "m6"]
    m = query_metrics(ranked, judge(set(), {"s1", "s6"}), GROUPS)
    assert m["sess_all@5"] == 1.0
    assert m["sess_any@5"] == 1.0
    assert "turn_recall@5" not in m  # no gold ids: session metrics only
    m = query_metrics(ranked, judge(set(), {"s1", "s5"}), GROUPS)
    assert m["sess_all@5"] == 0.0


def test_aggregate_averages_in_percent_overall_and_per_category() -> None:
    rows = [
        ("a", {"turn_recall@10": 1.0, "sess_all@5": 1.0}),
        ("a", {"turn_recall@10": 0.5, "sess_all@5": 0.0}),
        ("b", {"sess_all@5": 1.0}),
        ("b", {}),  # skipped: no gold and no gold groups
    ]
    table = aggregate(rows)
    assert table.queries == 3
    assert table.turn_queries == 2  # the third has gold groups only
    assert table.overall["turn_recall@10"] == 75.0
    assert table.overall["sess_all@5"] == pytest.approx(66.7)
    assert table.by_category["a"]["sess_all@5"] == 50.0
    assert table.queries_by_category == {"a": 2, "b": 1}


def test_halves_split_the_queries_so_one_conversation_splits_too(tmp_path: Path) -> None:
    # One case (one conversation) with four queries: two in each half, by position.
    case = {
        "case": "conv",
        "memories": [{"id": m, "text": m, "group": g} for m, g in GROUPS.items()],
        "queries": [
            {"id": f"q{i}", "text": "x", "gold": [gold], "category": "c"}
            for i, gold in enumerate(["m1", "m2", "m3", "m4"])
        ],
    }
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps(case) + "\n")
    run = tmp_path / "run.jsonl"
    # Queries at even positions (q0, q2) find their gold first; the odd ones never do.
    run.write_text(
        "".join(
            json.dumps({"case": "conv", "query": f"q{i}", "ranked": [gold] if i % 2 == 0 else []})
            + "\n"
            for i, gold in enumerate(["m1", "m2", "m3", "m4"])
        )
    )
    report = score_run(data, run)
    assert (report.even.queries, report.odd.queries) == (2, 2)
    assert report.even.overall["turn_recall@10"] == 100.0
    assert report.odd.overall["turn_recall@10"] == 0.0
    assert report.table.overall["turn_recall@10"] == 50.0
