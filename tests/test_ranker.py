"""The one ranker, table-tested."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from memory_mcp import ranker
from memory_mcp.records import _EMPHATIC, Record, emphasis, format_time

NOW = datetime(2026, 6, 1, tzinfo=UTC)
CONFIG = ranker.RankerConfig(half_life_days=30, prior_weight=0.15)


def make(
    *,
    kind: str = "fact",
    content: str = "The API listens on port 8080",
    age_days: float = 0,
    importance: float | None = None,
    pinned: bool = False,
    fold_count: int = 0,
    access_count: int = 0,
) -> Record:
    stamp = format_time(NOW - timedelta(days=age_days))
    return Record(
        id="f_test",
        corpus="facts",
        kind=kind,
        scope="project",
        scope_key="/repo",
        content=content,
        agent="test",
        created_at=stamp,
        updated_at=stamp,
        importance=importance,
        pinned=pinned,
        fold_count=fold_count,
        access_count=access_count,
    )


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (make(importance=0.9), 0.9),
        (make(importance=0.0), 0.0),
        (make(kind="fact"), 0.5),
        (make(kind="decision"), 0.7),
        (make(kind="gotcha"), 0.7),
        (make(kind="journal"), 0.4),
        (make(kind="fact", content="Never push to main; it is a breaking change"), 0.7),
        (make(kind="decision", content="Never, always, must: critical security bug"), 1.0),
    ],
)
def test_importance_is_explicit_or_inferred_from_kind_and_words(
    record: Record, expected: float
) -> None:
    assert ranker.importance(record) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("NEVER force-push; Don't skip CI", 2),
        ("the deadline-driven DECISION was a Bug", 3),
        ("nevermore, doNOT, must've", 1),  # words, not parts of words ("must" of must've)
        ("do  not merge", 0),  # one space between "do" and "not", as IGNORECASE found it
        ("\u017fecurity review of the caf\u00e9", 1),  # long s: IGNORECASE's own rules
        ("Caf\u00e9 rules: Never, always, must, critical", 3),
    ],
)
def test_emphasis_counts_emphatic_words_whatever_their_case(text: str, expected: int) -> None:
    assert emphasis(text) == expected == min(3, len(_EMPHATIC.unicode.findall(text)))


@pytest.mark.parametrize(
    ("age_days", "pinned", "expected"),
    [(0, False, 1.0), (30, False, 0.5), (60, False, 0.25), (90, False, 0.125), (365, True, 1.0)],
)
def test_recency_halves_every_half_life_and_pinned_records_do_not_decay(
    age_days: float, pinned: bool, expected: float
) -> None:
    assert ranker.recency(make(age_days=age_days, pinned=pinned), NOW, 30) == pytest.approx(
        expected
    )


@pytest.mark.parametrize(
    ("fold_count", "access_count", "expected"),
    [(0, 0, 0.0), (3, 0, 0.5), (0, 6, 0.5), (9, 0, 0.75), (30, 60, 1 - 1 / 21)],
)
def test_reinforcement_grows_with_folds_and_accesses_and_saturates(
    fold_count: int, access_count: int, expected: float
) -> None:
    record = make(fold_count=fold_count, access_count=access_count)
    assert ranker.reinforcement(record) == pytest.approx(expected)


def test_prior_is_importance_times_recency_times_reinforcement_with_floors() -> None:
    fresh = make(importance=1.0)
    assert ranker.prior(fresh, NOW, CONFIG) == pytest.approx(1.0 * 1.0 * 0.8)
    old = make(importance=1.0, age_days=10_000)
    assert ranker.prior(old, NOW, CONFIG) == pytest.approx(ranker.RECENCY_FLOOR * 0.8)
    assert ranker.prior(old, NOW, CONFIG) > 0


def test_newer_and_reinforced_records_outrank_older_ones_without_a_query() -> None:
    newer, older = make(age_days=1), make(age_days=120)
    reinforced = make(age_days=120, fold_count=6)
    assert ranker.prior(newer, NOW, CONFIG) > ranker.prior(reinforced, NOW, CONFIG)
    assert ranker.prior(reinforced, NOW, CONFIG) > ranker.prior(older, NOW, CONFIG)


@pytest.mark.parametrize(
    ("relevance", "prior", "expected"),
    [(1.0, 0.0, 0.85), (0.0, 1.0, 0.15), (0.5, 0.5, 0.5), (0.8, 0.2, 0.71)],
)
def test_score_blends_relevance_with_the_prior(
    relevance: float, prior: float, expected: float
) -> None:
    assert ranker.score(relevance, prior, CONFIG) == pytest.approx(expected)


def test_relevance_dominates_the_prior_with_the_default_weight() -> None:
    relevant_old = ranker.score(0.6, ranker.prior(make(age_days=400), NOW, CONFIG), CONFIG)
    unrelated_new = ranker.score(0.3, ranker.prior(make(importance=1.0), NOW, CONFIG), CONFIG)
    assert relevant_old > unrelated_new
