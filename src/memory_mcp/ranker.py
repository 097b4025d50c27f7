"""The one ranker: every search and the spawn brief order records with it.

    score = (1 - w) * relevance + w * prior                       (with a query)
    score = prior                                                 (spawn brief: no query)

    prior         = importance * (R0 + (1 - R0) * recency) * (F0 + (1 - F0) * reinforcement)
    importance    = the record's explicit importance, else KIND_IMPORTANCE[kind]
                    + 0.1 per emphatic word (never, always, must, bug, breaking, ...), max 1
    recency       = 0.5 ** (age_days / half_life)     (1 for pinned records)
    half_life     = ranking.durable_half_life_days for decisions, preferences,
                    procedures, gotchas, goals and plans (meant to last), else
                    ranking.half_life_days
    reinforcement = 1 - 1 / (1 + (fold_count + access_count / 2) / 3)

``relevance`` in [0, 1] comes from hybrid retrieval (``fusion.py``); ``w`` is
``ranking.prior_weight``.
The floors R0 and F0 keep an old or never-used record findable: age and
disuse lower a record, they never erase it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from memory_mcp.records import Record, emphasis, parse_time

KIND_IMPORTANCE: dict[str, float] = {
    "goal": 0.9,
    "plan": 0.8,
    "decision": 0.7,
    "gotcha": 0.7,
    "preference": 0.6,
    "procedure": 0.6,
    "fact": 0.5,
    "insight": 0.5,
    "journal": 0.4,
    "chunk": 0.4,
}
RECENCY_FLOOR = 0.35  # R0
REINFORCEMENT_FLOOR = 0.8  # F0


# Kinds whose records are meant to last; they age on the longer half-life.
DURABLE_KINDS = frozenset({"decision", "preference", "procedure", "gotcha", "goal", "plan"})


@dataclass(frozen=True)
class RankerConfig:
    half_life_days: float = 30.0
    prior_weight: float = 0.15
    durable_half_life_days: float = 180.0

    def half_life(self, kind: str) -> float:
        """The half-life, in days, of a record of this kind."""
        return self.durable_half_life_days if kind in DURABLE_KINDS else self.half_life_days


def importance(record: Record) -> float:
    """Explicit importance, else inferred from the kind and emphatic words."""
    if record.importance is not None:
        return record.importance
    base = KIND_IMPORTANCE.get(record.kind, 0.5)
    return min(1.0, base + 0.1 * emphasis(record.content))


def recency(record: Record, now: datetime, half_life_days: float) -> float:
    """Exponential decay with the age of the record (pinned records do not decay)."""
    if record.pinned:
        return 1.0
    age_days = max(0.0, (now - parse_time(record.created_at)).total_seconds() / 86400)
    return float(0.5 ** (age_days / half_life_days))


def reinforcement(record: Record) -> float:
    """How often the record was re-stated (folds) and returned (accesses), in [0, 1)."""
    signal = record.fold_count + record.access_count / 2
    return 1.0 - 1.0 / (1.0 + signal / 3.0)


def prior(record: Record, now: datetime, config: RankerConfig) -> float:
    """What a record is worth without a query, in [0, 1]."""
    rec = RECENCY_FLOOR + (1 - RECENCY_FLOOR) * recency(record, now, config.half_life(record.kind))
    rf = REINFORCEMENT_FLOOR + (1 - REINFORCEMENT_FLOOR) * reinforcement(record)
    return importance(record) * rec * rf


def score(relevance: float, prior_value: float, config: RankerConfig) -> float:
    """The ranked score of a hit: relevance blended with the prior."""
    w = config.prior_weight
    return (1 - w) * relevance + w * prior_value
