"""Read queries, shared by the store (a pooled connection per read) and write transactions."""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from memory_mcp.lexical import query_terms, stem
from memory_mcp.overlap import alongside
from memory_mcp.records import Record
from memory_mcp.storage.base import (
    IVF_PROBES,
    Around,
    CandidateReads,
    Filters,
    Scored,
    Vector,
)
from memory_mcp.storage.bm25 import (
    COUNTS_TTL,
    TopPlan,
    deepening,
    kept_per_walk,
    narrowed,
    rarest,
)
from memory_mcp.storage.postgres.sql import filters_sql, hash_sql, lexical_sql
from memory_mcp.storage.rows import SELECT, record_of

if TYPE_CHECKING:
    from memory_mcp.storage.postgres.store import PgStore

# The nearest-neighbour search asks the space's ivfflat index (``vector_index``) for
# this many rows (passages) per wanted record at first (a record has two or three).
# pgvector (0.6) filters *after* the index scan, which returns the rows of the
# ``ivfflat.probes`` lists nearest the query (set on every pooled connection) and no
# more: while the filters reject too many, the next round goes at least twice as deep,
# and as deep as the share they kept says ``k`` lie (with a margin), up to
# ``_DEPTH_MAX`` rows. Deeper than that, when the filters keep no row at all (a
# selective filter), or when the index returned fewer rows than asked (a small space,
# or lists that ran dry), an exact scan of the records that pass the filters answers.
_FIRST_DEPTH = 4
_MARGIN = 1.25
_MIN_DEPTH = 40
_DEPTH_MAX = 1000

# A write decision's neighbours come from this many of the ivfflat lists nearest the
# new memory (searches: the session's ``IVF_PROBES``). SQLite's 12 (``NEIGHBOUR_PROBES``)
# are clusters of the scope's own rows; an ivfflat list holds every scope's, so 12 of
# them hold fewer of the scope's rows. The decisions of the bench's facts (two seeds of
# about 582 at 10,000 and at 50,000 memories, 2,329 in all) against every list scored:
# 48 and 32 lists, none different; 24 and 12, one of 582 at 50,000 in each seed.
_NEIGHBOUR_PROBES = 32


class Queries:
    """Reads over ``fetch``, which a subclass runs on its connection(s)."""

    _store: PgStore

    async def fetch(
        self,
        sql: str,
        params: Sequence[Any] = (),
        *,
        binary: bool = False,
        probes: int | None = None,
    ) -> list[Any]:
        """The rows of one query (``binary``: in binary format, which reads vectors
        several times faster; ``probes``: ivfflat's for it, instead of the session's
        ``IVF_PROBES``)."""
        raise NotImplementedError

    async def lexical(
        self, text: str, filters: Filters, k: int, *, rare_words: bool = False
    ) -> list[Scored]:
        """Records matching words of ``text``, best BM25 first (``bm25``: as FTS5 ranks)."""
        terms = query_terms(text)
        if not terms or not filters.scope_keys or k <= 0:
            return []
        # The words' record counts and the collection's totals with the filters' lists,
        # on two of the pool's connections at once (one after the other in a transaction).
        counts, rows = await alongside(
            lambda: self.document_counts({stem(t) for t in terms}, fresh=not rare_words),
            lambda: self.fetch(
                "SELECT greatest(documents, 1), "
                "greatest(tokens, 1)::float8 / greatest(documents, 1), "
                "ARRAY(SELECT id FROM posting_lists WHERE scope_key = ANY(%s) "
                "AND corpus = ANY(%s)) FROM lexical_stats",
                [list(filters.scope_keys), list(filters.corpora)],
            ),
        )
        if rare_words and len(terms) > 2:
            terms = rarest(terms, counts)
        documents, length, lists = (
            (int(rows[0][0]), float(rows[0][1]), list(rows[0][2])) if rows else (1, 1.0, [])
        )
        plan = TopPlan.of([stem(t) for t in terms], counts, documents)
        if not plan.finders or not lists:
            return []
        where, params = filters_sql(filters)
        weights = [list(plan.weights), list(plan.weights.values())]
        kinds = [list(filters.kinds)] if filters.kinds else []  # the walks read these only

        async def read(depth: int) -> list[Any]:
            narrow = narrowed(filters, depth, k)
            passing = [*params, kept_per_walk(k)] if narrow else []
            return await self.fetch(
                lexical_sql(where, narrowed=narrow, kinds=bool(kinds)),
                [lists, plan.finders, *kinds, depth, *passing, *weights, length, *params, k],
            )

        found = await deepening(read, k, plan.deepest)
        return [Scored(record_of(row), float(row[-1])) for row in found]

    async def document_counts(
        self, stems: Collection[str], *, fresh: bool = True
    ) -> dict[str, int]:
        """How many records hold each of these stems (those that some record holds):
        read now if ``fresh``, else as read up to ``COUNTS_TTL`` seconds ago
        (``bm25.CountCache``: a memory's rarest words, as SQLite's ``WordCounts``), from
        ``term_counts`` (the rows of ``record_terms`` this user sees, by stem)."""
        cache = self._store.word_counts
        now = time.monotonic()
        known, wanted = cache.lookup(stems, math.inf if fresh else now - COUNTS_TTL)
        if wanted:
            rows = await self.fetch(
                "SELECT t.term, coalesce((SELECT sum(c.n) FROM term_counts c "
                "WHERE c.term = t.term), 0)::bigint FROM unnest(%s::text[]) AS t(term)",
                [wanted],
            )
            known |= cache.remember(wanted, {str(term): int(n) for term, n in rows}, now)
        return known

    async def nearest(
        self,
        vector: Vector,
        embedder: str,
        filters: Filters,
        k: int,
        *,
        exact: bool = False,
        probes: int | None = None,
    ) -> list[Scored]:
        """The ``k`` current records nearest ``vector`` (best passage), filters before ``k``;
        from the ivfflat index (the ``probes`` lists nearest ``vector`` if given, else the
        session's) unless ``exact`` (then by the exact scan below)."""
        space = await self._store.space(self, embedder)
        if space is None or not filters.scope_keys or k <= 0:
            return []
        number, dim = space
        where, params = filters_sql(filters)
        query = _unit(vector)
        depth = max(k * _FIRST_DEPTH, _MIN_DEPTH)
        while not exact:
            rows = await self.fetch(
                f"WITH near AS MATERIALIZED (SELECT v.seq, "
                f"v.embedding::vector({dim}) <=> %s::vector({dim}) AS d FROM vectors v "
                f"WHERE v.space = {number} ORDER BY v.embedding::vector({dim}) "
                f"<=> %s::vector({dim}) LIMIT %s), "
                "best AS (SELECT seq, 1.0 - min(d) AS sim FROM near GROUP BY seq) "
                f"SELECT {SELECT}, best.sim, (SELECT count(*) FROM near) "
                f"FROM best JOIN records r ON r.seq = best.seq WHERE {where} "
                "ORDER BY best.sim DESC, r.seq LIMIT %s",
                [query, query, depth, *params, k],
                probes=probes,
            )
            if len(rows) >= k:
                return [Scored(record_of(row), float(row[-2])) for row in rows]
            if not rows or int(rows[0][-1]) < depth:
                break  # nothing passes, or the index gave fewer rows than asked: scan
            # How deep ``k`` records that pass lie, at the rate the filters kept so far.
            estimate = depth * k / len(rows)
            if depth >= _DEPTH_MAX or estimate > _DEPTH_MAX:
                break  # deeper than the index goes: scan
            depth = min(max(depth * 2, math.ceil(estimate * _MARGIN)), _DEPTH_MAX)
        # The exact scan: the records that pass the filters (by their indexes), each
        # with its best passage (by ``vectors``' key), never the whole space.
        rows = await self.fetch(
            f"SELECT {SELECT}, b.sim FROM records r CROSS JOIN LATERAL (SELECT 1.0 - "
            f"min(v.embedding <=> %s) AS sim FROM vectors v WHERE v.seq = r.seq "
            f"AND v.space = {number}) b WHERE {where} AND b.sim IS NOT NULL "
            "ORDER BY b.sim DESC, r.seq LIMIT %s",
            [query, *params, k],
        )
        return [Scored(record_of(row), float(row[-1])) for row in rows]

    async def nearest_with_scores(
        self,
        vector: Vector,
        embedder: str,
        filters: Filters,
        k: int,
        record_ids: Sequence[str],
        *,
        probes: int | None = None,
        ahead: object | None = None,
    ) -> tuple[list[Scored], dict[str, float]]:
        """``nearest`` and ``dense_scores`` of ``record_ids``, on two of the pool's
        connections at once (one after the other in a transaction), from the ``probes``
        ivfflat lists nearest ``vector`` (``_NEIGHBOUR_PROBES`` unless given: a write
        decision's). ``ahead`` is not used (``rank_ahead``: the server ranks inside its
        query)."""
        probed = None if probes == IVF_PROBES else probes or _NEIGHBOUR_PROBES
        scores, near = await alongside(
            lambda: self.dense_scores(vector, embedder, record_ids),
            lambda: self.nearest(vector, embedder, filters, k, probes=probed),
        )
        return near, scores

    async def candidate_reads(
        self,
        vector: Vector,
        embedder: str,
        filters: Filters,
        k: int,
        record_ids: Sequence[str],
        *,
        within_seconds: float | None = None,
        conflicts: bool = False,
        probes: int | None = None,
        ahead: object | None = None,
    ) -> CandidateReads:
        """``nearest_with_scores``; the records' neighbours in time and open conflicts are
        not read with them (None: the caller reads them once it knows what it needs)."""
        near, scores = await self.nearest_with_scores(
            vector, embedder, filters, k, record_ids, probes=probes, ahead=ahead
        )
        return CandidateReads(near, scores)

    async def dense_scores(
        self, vector: Vector, embedder: str, record_ids: Sequence[str]
    ) -> dict[str, float]:
        """The best passage cosine of each given current record that has vectors."""
        space = await self._store.space(self, embedder)
        if space is None or not record_ids:
            return {}
        rows = await self.fetch(
            "SELECT r.id, 1.0 - min(v.embedding <=> %s) FROM records r "
            f"JOIN vectors v ON v.seq = r.seq AND v.space = {space[0]} "
            "WHERE r.id = ANY(%s) AND r.embedder = %s GROUP BY r.id",
            [_unit(vector), list(record_ids), embedder],
        )
        return {str(i): float(s) for i, s in rows}

    async def in_conversation(
        self, record_ids: Sequence[str], within_seconds: float, embedder: str
    ) -> dict[str, Around]:
        """Each record's whole-text vector from ``embedder``, with its neighbours in time
        (the current records of its scope and corpus written just before and after it,
        no more than ``within_seconds`` apart; ``sqlite.queries`` has the same)."""
        space = await self._store.space(self, embedder)
        if space is None or not record_ids:
            return {}
        side = (
            "(SELECT o.id FROM records o WHERE o.scope_key = c.scope_key "
            "AND o.corpus = c.corpus AND o.live AND o.created_at {cmp}= c.created_at "
            "AND (o.created_at {cmp} c.created_at OR o.seq {cmp} c.seq) "
            "ORDER BY o.created_at {order}, o.seq {order} LIMIT 1)"
        )
        near = within_seconds > 0
        sides = (
            f", {side.format(cmp='<', order='DESC')}, {side.format(cmp='>', order='ASC')}"
            if near
            else ", NULL, NULL"
        )
        rows = await self.fetch(
            f"SELECT c.id{sides} FROM records c WHERE c.id = ANY(%s) AND c.embedder = %s "
            "AND c.vec_rows > 0",
            [list(record_ids), embedder],
        )
        if not rows:
            return {}
        wanted = {str(i) for row in rows for i in row if i is not None}
        found = await self.fetch(
            "SELECT r.id, r.created_at, v.embedding FROM records r JOIN vectors v "
            f"ON v.seq = r.seq AND v.passage = 0 AND v.space = {space[0]} "
            "WHERE r.id = ANY(%s) AND r.embedder = %s AND r.live",
            [sorted(wanted), embedder],
            binary=True,
        )
        from memory_mcp.records import parse_time

        vector_of = {str(i): _array(e) for i, _, e in found}
        when = {str(i): parse_time(str(t)) for i, t, _ in found}
        result: dict[str, Around] = {}
        for record_id, *others in rows:
            if record_id not in vector_of:
                continue
            neighbours = {
                o: vector_of[o]
                for o in others
                if o is not None
                and o in vector_of
                and abs((when[o] - when[record_id]).total_seconds()) <= within_seconds
            }
            result[str(record_id)] = Around(vector_of[record_id], neighbours)
        return result

    async def rank_ahead(
        self, vector: Vector, embedder: str, filters: Filters, probes: int
    ) -> object | None:
        """None: pgvector ranks inside the query (``nearest_with_scores``)."""
        return None

    async def vectors_of(self, record_id: str, embedder: str) -> Vector | None:
        """A current record's passage vectors from ``embedder`` (whole text first)."""
        import numpy as np

        rows = await self.fetch(
            "SELECT v.embedding FROM records r JOIN vectors v ON v.seq = r.seq "
            "WHERE r.id = %s AND r.embedder = %s AND r.live ORDER BY v.passage",
            [record_id, embedder],
            binary=True,
        )
        if not rows:
            return None
        return np.stack([_array(row[0]) for row in rows])

    async def find_by_hash(self, content_hash: str, filters: Filters) -> list[Record]:
        where, params = filters_sql(filters)
        rows = await self.fetch(hash_sql(where), [content_hash, *params])
        return [record_of(row) for row in rows]

    async def current(self, filters: Filters, limit: int, offset: int = 0) -> list[Record]:
        """Current records matching ``filters``, newest first (after the first ``offset``)."""
        where, params = filters_sql(filters)
        rows = await self.fetch(
            f"SELECT {SELECT} FROM records r WHERE {where} "
            "ORDER BY r.created_at DESC, r.seq DESC LIMIT %s OFFSET %s",
            [*params, limit, offset],
        )
        return [record_of(row) for row in rows]

    async def get(self, record_id: str) -> Record | None:
        rows = await self.fetch(f"SELECT {SELECT} FROM records r WHERE r.id = %s", [record_id])
        return record_of(rows[0]) if rows else None


def _unit(vector: Vector) -> Any:
    """A query vector as pgvector takes it (one row: the whole text)."""
    import numpy as np
    from pgvector import Vector as PgVector

    flat = np.asarray(vector, dtype=np.float32).reshape(-1)
    return PgVector(flat)


def _array(value: Any) -> Vector:
    """A stored vector as a float32 array."""
    import numpy as np

    if hasattr(value, "to_numpy"):  # pgvector's own Vector
        value = value.to_numpy()
    return np.asarray(value, dtype=np.float32)
