"""``bench fold --cv``: the fold threshold chosen on some pairs, judged on the others."""

from __future__ import annotations

from memory_mcp.bench.fold import FoldPair, choose_threshold, cross_validate
from memory_mcp.config import FoldSettings
from memory_mcp.fold import Evidence, compare

DUPLICATE = ("Run the linter with make lint before pushing", "Run make lint before a push")
RELATED = ("Deploys go through ArgoCD", "ArgoCD syncs every minute from git")


def _pairs(
    n: int, cosine_dup: float, cosine_related: float
) -> tuple[list[FoldPair], list[Evidence]]:
    pairs: list[FoldPair] = []
    evidence: list[Evidence] = []
    for i in range(n):
        for (a, b), label, cosine in (
            (DUPLICATE, "duplicate", cosine_dup),
            (RELATED, "related", cosine_related),
        ):
            pairs.append(FoldPair(f"{a} {i}", f"{b} {i}", label, "coding-agent set"))
            evidence.append(compare(f"{a} {i}", f"{b} {i}", cosine))
    return pairs, evidence


def test_the_threshold_folds_the_most_duplicates_at_the_precision_goal() -> None:
    pairs, evidence = _pairs(5, 0.90, 0.80)
    # Below 0.80 the related pairs fold too (precision 0.5); from 0.81 only duplicates do.
    assert choose_threshold(pairs, evidence, FoldSettings()) == 0.81


def test_each_fold_is_decided_by_the_threshold_the_others_chose() -> None:
    pairs, evidence = _pairs(10, 0.90, 0.80)
    cv = cross_validate(pairs, evidence, FoldSettings(), k=5, embedder="test")
    assert cv.chosen == [0.81] * 5
    assert cv.report.counts["duplicate"]["folded"] == 10
    assert cv.report.counts["related"]["folded"] == 0
    assert cv.report.pairs == 20
