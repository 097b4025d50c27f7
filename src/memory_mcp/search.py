"""Hybrid retrieval: lexical and dense relevance, fused, then ranked once.

    relevance = a * bm25 / max_bm25 + (1 - a) * max(0, cosine)      both branches
    relevance = bm25 / max_bm25                                     lexical only
    relevance = max(0, cosine)                                      dense only

A record that has no vector from the query's embedder yet (written while the
model was away, waiting for maintenance to embed it) is scored by its words
alone: ``bm25 / max_bm25`` times the share of the query's words it holds.

``a`` is ``search.lexical_weight``; ``cosine`` is the best of a record's passage
vectors, and ``max_bm25`` the best BM25 score among this query's hits. Each
branch contributes its best ``search.candidates`` records; a record found by
only one branch is scored by the other too, so fusion sees both numbers. The
fused relevance goes through the one ranker (``ranker.score``). Filters (scope,
kind, tags, time) are applied inside both branches, before the limit; hits
below ``search.min_relevance`` are dropped. The hits returned show their text
through the current secret rules (``secret_scan``), so that a record stored
before a rule existed does not show its secret.

A search over several corpora (``project_search``, ``searchUnifiedMemory``)
gathers each corpus's ``candidates`` separately - concurrently, with one query
vector - and fuses them together in one ``fuse``: ``max_bm25`` is then the best
over every corpus, so every hit's relevance and score is on the same scale.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime

from memory_mcp import ranker
from memory_mcp.lexical import stems
from memory_mcp.records import Hit, Record
from memory_mcp.secret_scan import redact_text
from memory_mcp.storage.base import Filters, Vector
from memory_mcp.storage.sqlite import SqliteStore


@dataclass(frozen=True)
class SearchPlan:
    candidates: int
    lexical_weight: float
    min_relevance: float
    ranking: ranker.RankerConfig
    redact: bool = True  # show hits through the current secret rules (write.secrets not off)


@dataclass
class Candidates:
    """What the branches found for one query: records with their raw scores."""

    records: dict[str, Record] = field(default_factory=dict)
    bm25: dict[str, float] = field(default_factory=dict)
    cosine: dict[str, float] = field(default_factory=dict)
    # Of a record with no vector yet: the share of the query's words it holds.
    coverage: dict[str, float] = field(default_factory=dict)

    def update(self, other: Candidates) -> None:
        """Add another branch's candidates (a record found twice keeps its best scores)."""
        self.records.update(other.records)
        pairs = ((self.bm25, other.bm25), (self.cosine, other.cosine))
        for mine, theirs in (*pairs, (self.coverage, other.coverage)):
            for rid, value in theirs.items():
                mine[rid] = max(value, mine.get(rid, value))


async def candidates(
    store: SqliteStore,
    query: str,
    query_vector: Vector | None,
    embedder: str | None,
    filters: Filters,
    plan: SearchPlan,
) -> Candidates:
    """The best ``plan.candidates`` records of each branch, each scored by both branches."""
    found = Candidates()
    for item in await store.lexical(query, filters, plan.candidates):
        found.records[item.record.id] = item.record
        found.bm25[item.record.id] = item.score
    if query_vector is None or embedder is None:
        return found
    for item in await store.nearest(query_vector, embedder, filters, plan.candidates):
        found.records[item.record.id] = item.record
        found.cosine[item.record.id] = item.score
    missing = [rid for rid in found.bm25 if rid not in found.cosine]
    found.cosine.update(await store.dense_scores(query_vector, embedder, missing))
    asked = set(stems(query))
    for rid in found.bm25:
        if rid not in found.cosine and asked:  # no vector: its words are all there is
            held = asked & set(stems(found.records[rid].content))
            found.coverage[rid] = len(held) / len(asked)
    return found


def fuse(
    found: Candidates,
    *,
    dense: bool,
    limit: int,
    now: datetime,
    plan: SearchPlan,
    min_relevance: float | None = None,
    redact: bool | None = None,
) -> list[Hit]:
    """Fused relevance, ranked by the one ranker: the ``limit`` best hits, best first.

    BM25 is normalised by the best BM25 among all the candidates, so hits from
    several branches (corpora) are scored on one scale.

    Args:
        dense: whether the query had a vector (else relevance is lexical only).
        min_relevance: overrides ``plan.min_relevance`` (0 keeps every candidate,
            for a full ranking).
        redact: overrides ``plan.redact`` (False: the caller keeps a few of the hits
            and shows those through ``shown``).
    """
    min_relevance = plan.min_relevance if min_relevance is None else min_relevance
    a = plan.lexical_weight if dense else 1.0
    if dense and not found.bm25:
        a = 0.0
    top_bm25 = max(found.bm25.values(), default=0.0)
    hits: list[Hit] = []
    for rid, record in found.records.items():
        lex = found.bm25[rid] / top_bm25 if rid in found.bm25 and top_bm25 > 0 else 0.0
        cos = max(0.0, found.cosine.get(rid, 0.0))
        if dense and rid not in found.cosine:
            # No vector yet (stored while the model was away): its words are all there
            # is, weighed by how much of the question they cover, so that one shared
            # word with the best BM25 of the query does not make it fully relevant.
            relevance = lex * found.coverage.get(rid, 1.0)
        else:
            relevance = a * lex + (1 - a) * cos
        if relevance < min_relevance:
            continue
        prior = ranker.prior(record, now, plan.ranking)
        hits.append(
            Hit(
                record=record,
                score=ranker.score(relevance, prior, plan.ranking),
                relevance=relevance,
                lexical=lex if rid in found.bm25 else None,
                dense=found.cosine.get(rid),
            )
        )
    hits.sort(key=lambda h: (-h.score, h.record.id))
    if plan.redact if redact is None else redact:
        return [shown(hit) for hit in hits[:limit]]
    return hits[:limit]


def shown(hit: Hit) -> Hit:
    """The hit with its text through the current secret rules: a record stored before
    a rule existed must not show its secret."""
    record = shown_record(hit.record)
    return hit if record is hit.record else replace(hit, record=record)


def shown_record(record: Record) -> Record:
    """A record as it may be shown: its text through the current secret rules."""
    content = redact_text(record.content)
    return record if content == record.content else replace(record, content=content)


async def hybrid(
    store: SqliteStore,
    query: str,
    query_vector: Vector | None,
    embedder: str | None,
    filters: Filters,
    *,
    limit: int,
    now: datetime,
    plan: SearchPlan,
    min_relevance: float | None = None,
) -> list[Hit]:
    """The ``limit`` best records for ``query`` under ``filters``, best first."""
    found = await candidates(store, query, query_vector, embedder, filters, plan)
    dense = query_vector is not None and embedder is not None
    return fuse(found, dense=dense, limit=limit, now=now, plan=plan, min_relevance=min_relevance)
