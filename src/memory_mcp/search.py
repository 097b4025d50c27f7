"""Hybrid retrieval: lexical and dense relevance, fused, then ranked once.

    relevance = a * bm25 / max_bm25 + (1 - a) * max(0, cosine)      both branches
    relevance = bm25 / max_bm25                                     lexical only
    relevance = max(0, cosine)                                      dense only

``a`` is ``search.lexical_weight``; ``cosine`` is the best of a record's passage
vectors, and ``max_bm25`` the best BM25 score among this query's hits. Each
branch contributes its best ``search.candidates`` records; a record found by
only one branch is scored by the other too, so fusion sees both numbers. The
fused relevance goes through the one ranker (``ranker.score``). Filters (scope,
kind, tags, time) are applied inside both branches, before the limit; hits
below ``search.min_relevance`` are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from memory_mcp import ranker
from memory_mcp.records import Hit, Record
from memory_mcp.storage.base import Filters, Scored, Vector
from memory_mcp.storage.sqlite import SqliteStore


@dataclass(frozen=True)
class SearchPlan:
    candidates: int
    lexical_weight: float
    min_relevance: float
    ranking: ranker.RankerConfig


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
    """The ``limit`` best records for ``query`` under ``filters``, best first.

    Args:
        min_relevance: overrides ``plan.min_relevance`` (0 keeps every candidate,
            for a full ranking).
    """
    min_relevance = plan.min_relevance if min_relevance is None else min_relevance
    lexical = await store.lexical(query, filters, plan.candidates)
    dense: list[Scored] = []
    if query_vector is not None and embedder is not None:
        dense = await store.nearest(query_vector, embedder, filters, plan.candidates)

    records: dict[str, Record] = {}
    bm25: dict[str, float] = {}
    cosine: dict[str, float] = {}
    for item in lexical:
        records[item.record.id] = item.record
        bm25[item.record.id] = item.score
    for item in dense:
        records[item.record.id] = item.record
        cosine[item.record.id] = item.score
    if query_vector is not None and embedder is not None:
        missing = [rid for rid in bm25 if rid not in cosine]
        cosine.update(await store.dense_scores(query_vector, embedder, missing))

    use_dense = query_vector is not None and embedder is not None
    a = plan.lexical_weight if use_dense else 1.0
    if use_dense and not lexical:
        a = 0.0
    top_bm25 = max(bm25.values(), default=0.0)
    hits: list[Hit] = []
    for rid, record in records.items():
        lex = bm25[rid] / top_bm25 if rid in bm25 and top_bm25 > 0 else 0.0
        cos = max(0.0, cosine.get(rid, 0.0))
        relevance = a * lex + (1 - a) * cos
        if relevance < min_relevance:
            continue
        prior = ranker.prior(record, now, plan.ranking)
        hits.append(
            Hit(
                record=record,
                score=ranker.score(relevance, prior, plan.ranking),
                relevance=relevance,
                lexical=lex if rid in bm25 else None,
                dense=cosine.get(rid),
            )
        )
    hits.sort(key=lambda h: (-h.score, h.record.id))
    return hits[:limit]
