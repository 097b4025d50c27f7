"""Read queries, shared by the reader connection and write transactions."""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import AsyncIterator, Collection, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import aiosqlite

from memory_mcp.lexical import query_terms, stem
from memory_mcp.passages import MAX_PASSAGES
from memory_mcp.records import Conflict, Record
from memory_mcp.storage.base import (
    NEIGHBOUR_PROBES,
    Around,
    CandidateReads,
    Filters,
    Scored,
    Vector,
)
from memory_mcp.storage.bm25 import TopPlan, deepest_rows, kept_per_walk, narrowed, rarest
from memory_mcp.storage.sqlite import postings
from memory_mcp.storage.sqlite.driver import OPERATIONAL_ERRORS, on_thread
from memory_mcp.storage.sqlite.neighbours import neighbours_sql
from memory_mcp.storage.sqlite.sql import (
    SELECT,
    by_seq_sql,
    conflicts_sql,
    filters_sql,
    hash_sql,
    marks,
    open_conflicts_where,
    passing_sql,
    record_of,
    slots_sql,
    storage_error,
)
from memory_mcp.storage.sqlite.vectors import owner_of, rowids_of, to_blob

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from memory_mcp.storage.sqlite.dense import Ahead, DenseIndex
    from memory_mcp.storage.sqlite.store import SqliteStore

log = logging.getLogger(__name__)


# sqlite-vec's largest k; past as many rows, the in-memory search stops
# deepening and masks the rows of the records that pass the filters instead.
_KNN_MAX = 4096
# Rows asked for per wanted record, doubled while filters reject: vec0's
# k-nearest search costs grow with k as much as with the rows scanned (10.6 ms
# at k=240 vs 4.6 ms at k=60 over 3,650 vectors), and each round of the
# in-memory search reads its records.
_FIRST_DEPTH = 2


def best_rows(
    conn: sqlite3.Connection,
    rowids: npt.NDArray[np.int64],
    sims: Vector,
    where: str,
    params: Sequence[Any],
    k: int,
) -> list[tuple[Any, float]]:
    """The rows of the ``k`` best records among these vector rows that pass the filters
    (``where``), with their scores, best first (fewer once every row is read): a
    deepening list of the best rows, on the connection's own thread. Stopping once
    ``k`` records pass loses nothing: a record's first row in the list is its best
    passage."""
    import numpy as np

    depth = max(k * _FIRST_DEPTH, 32)
    while True:
        top = np.argpartition(-sims, depth)[:depth] if depth < len(sims) else None
        chosen = slice(None) if top is None else top
        best: dict[int, float] = {}
        for rowid, similarity in zip(rowids[chosen].tolist(), sims[chosen].tolist(), strict=True):
            seq = owner_of(rowid)
            best[seq] = max(best.get(seq, -1.0), similarity)
        passing = conn.execute(passing_sql(best, where), [*best, *params]).fetchall()
        if len(passing) >= k or top is None:  # the rows of the best k only
            chosen_seqs = sorted((int(row[0]) for row in passing), key=lambda s: -best[s])[:k]
            rows = conn.execute(by_seq_sql(chosen_seqs, "1"), chosen_seqs).fetchall()
            return by_seq(rows, best, k)
        depth *= 2
        if depth > _KNN_MAX:  # a selective filter: keep the rows of records that pass it
            every = conn.execute(f"SELECT r.seq FROM records r WHERE {where}", params)
            keep = np.isin(rowids // MAX_PASSAGES, np.fromiter((p[0] for p in every), np.int64))
            rowids, sims = rowids[keep], sims[keep]


def nearest_rows(
    conn: sqlite3.Connection,
    index: DenseIndex,
    vector: Vector,
    filters: Filters,
    k: int,
    probes: int | None = None,
    ahead: Ahead | None = None,
) -> list[tuple[Any, float]]:
    """``Queries.nearest`` on a current copy, on the reader's thread: the rows of the ``k``
    best records, from the ``probes`` nearest clusters (``IVF_PROBES``; ranked already
    if ``ahead`` holds that ranking still), then every row if too few of those pass."""
    where, params = filters_sql(filters)
    asked = (filters.scope_keys, filters.corpora, filters.kinds)
    rows: list[tuple[Any, float]] = []
    for every_row in (False, True):
        taken = None
        if not every_row and probes is not None:
            taken = index.taken(ahead, vector, *asked, probes)
        rowids, sims, every = taken or index.rank(vector, *asked, exact=every_row, probes=probes)
        rows = best_rows(conn, rowids, sims, where, params, k)
        if len(rows) >= k or every:
            break
    return rows


def cosines_by_id(
    conn: sqlite3.Connection,
    index: DenseIndex,
    vector: Vector,
    embedder: str,
    record_ids: Sequence[str],
) -> dict[str, float] | None:
    """``Queries.dense_scores`` on a current copy, on the reader's thread; None: a scope
    the copy has not loaded, or rows it lacks (read through vec0 instead)."""
    if not record_ids:
        return {}
    slots = conn.execute(slots_sql(record_ids), [*record_ids, embedder]).fetchall()
    if not index.holds({str(key) for *_, key in slots}):
        return None
    rowids = [r for seq, _, n, _ in slots for r in rowids_of(int(seq), int(n))]
    held = index.cosines_of(vector, rowids)
    if len(held) < len(rowids):
        return None
    return best_of(held, {int(seq): str(i) for seq, i, *_ in slots})


_Found = tuple[
    list[tuple[Any, float]], dict[str, float], dict[str, Around] | None, list[Conflict] | None
]
# Each candidate's neighbours in time (``in_conversation``), by record id and seq.
_Conversations = dict[str, tuple[int, list[tuple[str, int]]]]


def around_rows(
    conn: sqlite3.Connection,
    index: DenseIndex,
    table: str,
    record_ids: Sequence[str],
    within_seconds: float,
    embedder: str,
) -> dict[str, Around]:
    """``Queries.in_conversation`` on the reader's thread, the vectors read from a current
    copy (``index``, held), in the trip that found the records (``candidate_reads``)."""
    if not record_ids:
        return {}
    rows = conn.execute(*_neighbours_query(record_ids, within_seconds, embedder)).fetchall()
    if not rows:
        return {}
    found, rowids = _conversations(rows)
    rowid, vectors = index.vectors_of(rowids)
    vector_of = dict(zip((rowid // MAX_PASSAGES).tolist(), vectors, strict=True))
    rest = [r for r in rowids if owner_of(r) not in vector_of]
    if rest:
        for r, vector in _vec0_vectors(conn.execute(*_vec0_query(table, rest))).items():
            vector_of[owner_of(r)] = vector
    return _arounds(found, vector_of)


def _neighbours_query(
    record_ids: Sequence[str], within_seconds: float, embedder: str
) -> tuple[str, list[Any]]:
    near = [within_seconds] * 2 if within_seconds > 0 else []
    return neighbours_sql(record_ids, bool(near)), [*near, *record_ids, embedder]


def _conversations(rows: list[Any]) -> tuple[_Conversations, list[int]]:
    """``neighbours_sql``'s rows by record id (its seq, its neighbours' ids and seqs), and
    the rowids of every whole text among them (``rowids_of``), in order.

    A neighbour comes as "seq:id", and rowids are made in place: a search reads a
    hundred candidates with twice as many neighbours, and a JSON array and a call
    for each made its read-around 3.7 ms at 50,000 memories, 3.4 without.
    """
    found: _Conversations = {}
    for record_id, seq, *around in rows:
        others = [value.partition(":") for value in around if value]
        found[str(record_id)] = (int(seq), [(i, int(q)) for q, _, i in others])
    seqs = {seq for seq, _ in found.values()}
    seqs.update(q for _, others in found.values() for _, q in others)
    return found, [seq * MAX_PASSAGES for seq in sorted(seqs)]


def _arounds(found: _Conversations, vector_of: Mapping[int, Vector]) -> dict[str, Around]:
    """Each record with a vector, with those of its neighbours that have one (by seq)."""
    return {
        record_id: Around(vector_of[seq], {i: vector_of[q] for i, q in others if q in vector_of})
        for record_id, (seq, others) in found.items()
        if seq in vector_of
    }


def _vec0_query(table: str, rowids: Sequence[int]) -> tuple[str, list[Any]]:
    """These vec0 rows, by rowid in the order asked, with their vectors: those a current
    record holds (a retired record's rows wait in vec0 until they are swept:
    ``vectors.announce_retired``)."""
    # A join on rowid is a point lookup in vec0 (a range or IN list is a full scan);
    # CROSS JOIN keeps that order.
    return (
        f"SELECT j.value, v.embedding FROM json_each(?) j "
        f"CROSS JOIN records r ON r.seq = j.value / {MAX_PASSAGES} "
        f"CROSS JOIN {table} v ON v.rowid = j.value "
        f"WHERE r.live = 1 AND r.vec_rows > j.value % {MAX_PASSAGES} ORDER BY j.key",
        [json.dumps(list(rowids))],
    )


def _vec0_vectors(rows: Iterable[Any]) -> dict[int, Vector]:
    """``_vec0_query``'s rows as vectors, by rowid."""
    import numpy as np

    return {int(r): np.frombuffer(bytes(blob), dtype=np.float32) for r, blob in rows}


def lexical_rows(
    conn: sqlite3.Connection,
    held: Mapping[str, int],
    terms: list[str],
    filters: Filters,
    k: int,
    rare_words: bool,
) -> list[tuple[Any, float]]:
    """``Queries.lexical`` on the connection's own thread, given the record counts of the
    words (``held``, by stem): the rows of the ``k`` best records with their BM25,
    read from the impact-ordered postings of the filters' lists (``postings.top_sql``)."""
    if rare_words and len(terms) > 2:
        terms = rarest(terms, held)
    lists = [
        int(row[0])
        for row in conn.execute(
            f"SELECT id FROM posting_lists WHERE scope_key IN ({marks(filters.scope_keys)}) "
            f"AND corpus IN ({marks(filters.corpora)})",
            [*filters.scope_keys, *filters.corpora],
        )
    ]
    records, length = postings.totals(conn)
    plan = TopPlan.of([stem(t) for t in terms], held, records)
    if not plan.finders or not lists:
        return []
    where, params = filters_sql(filters)
    weights = [v for item in plan.weights.items() for v in item]

    def read(depth: int) -> list[Any]:
        narrow = narrowed(filters, depth, k)
        passing = [*params, kept_per_walk(k)] if narrow else []
        walk = [*filters.kinds, depth, *passing]
        firsts = [v for n in lists for s in plan.finders for v in (n, s, *walk)]
        shape = (len(lists), len(plan.finders), len(plan.weights), where)
        scoring = [*firsts, *weights, length, *plan.weights]
        sql = postings.top_sql(*shape, narrowed=narrow, kinds=len(filters.kinds))
        found = conn.execute(sql, [*scoring, k, *params, k]).fetchall()
        if len(found) < k and not narrow:  # some of the best k may not pass the filters
            sql = postings.top_sql(*shape, kinds=len(filters.kinds), every=True)
            found = conn.execute(sql, [*scoring, *params, k]).fetchall()
        return found

    rows = deepest_rows(read, k, plan.deepest)
    return [(row, float(row[-1])) for row in rows]


def by_seq(rows: list[Any], best: dict[int, float], k: int) -> list[tuple[Any, float]]:
    """The ``k`` best of ``by_seq_sql``'s rows by their records' scores, with them."""
    rows.sort(key=lambda row: -best[int(row[-1])])
    return [(row, best[int(row[-1])]) for row in rows[:k]]


def best_of(cosines: dict[int, float], id_of: dict[int, str]) -> dict[str, float]:
    """Each record's best passage cosine, by id, from its rows' (``id_of``: by seq)."""
    scores: dict[str, float] = {}
    for rowid, similarity in cosines.items():
        record_id = id_of[owner_of(rowid)]
        scores[record_id] = max(scores.get(record_id, -1.0), similarity)
    return scores


class Queries:
    """Read queries shared by the reader connection and write transactions."""

    def __init__(self, conn: aiosqlite.Connection, store: SqliteStore) -> None:
        self._conn = conn
        self._store = store

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """The rows of one query."""
        try:
            return list(await self._conn.execute_fetchall(sql, params))
        except OPERATIONAL_ERRORS as exc:
            raise storage_error(exc) from exc

    @asynccontextmanager
    async def snapshot(self) -> AsyncIterator[None]:
        """Several reads of one moment (on the reader: WAL lets writers go on)."""
        await self._conn.execute("BEGIN")
        try:
            yield
        finally:
            await self._conn.execute("COMMIT")

    async def lexical(
        self, text: str, filters: Filters, k: int, *, rare_words: bool = False
    ) -> list[Scored]:
        """Records matching words of ``text``, best BM25 first.

        ``rare_words`` matches on the text's rarest words only (``rarest``): what
        the write path wants from a whole memory, whose common words match most
        of a project. One trip to the reader's thread (``lexical_rows``); in a
        transaction, one for the words' record counts (``WordCounts``, on the
        reader) and one for the rest.
        """
        terms = query_terms(text)
        if not terms or not filters.scope_keys or k <= 0:
            return []
        stems = {stem(t) for t in terms}
        counts = self._store._word_counts
        fresh = not rare_words

        def counted(conn: sqlite3.Connection) -> list[tuple[Any, float]]:
            held = counts.read(conn, stems, fresh)
            return lexical_rows(conn, held, terms, filters, k, rare_words)

        try:
            if self._conn is self._store._reader:
                found = await on_thread(self._conn, counted)
            else:
                held = await on_thread(self._store._reader, counts.read, stems, fresh)
                found = await on_thread(
                    self._conn, lexical_rows, held, terms, filters, k, rare_words
                )
        except OPERATIONAL_ERRORS as exc:
            raise storage_error(exc) from exc
        return [Scored(record_of(row), score) for row, score in found]

    async def nearest(
        self, vector: Vector, embedder: str, filters: Filters, k: int, *, exact: bool = False
    ) -> list[Scored]:
        """The ``k`` records nearest to ``vector``, best first.

        A record's similarity is the best cosine of its passages. Scope, corpus
        and kind filter the rows scored; filters the vectors do not carry (tags,
        time, excluded ids) are applied to a deepening list of the best rows, so
        that they act before the limit. Stopping once ``k`` records pass loses
        nothing: a record's first row in the list is its best passage.

        The rows come from the in-memory copy of the vector table (``dense``):
        those of a clustered scope's nearest clusters unless ``exact``, then
        every row if too few of those pass the filters. Without a copy, from
        vec0's own k-nearest search (exact).
        """
        table = await self._store._vector_table(self._conn, embedder)
        if table is None or not filters.scope_keys:
            return []
        if not exact and self._reads_committed():
            found = await self._store._on_copy(
                table,
                filters.scope_keys,
                lambda conn, index: nearest_rows(conn, index, vector, filters, k),
            )
            if found is not None:
                return [Scored(record_of(row), score) for row, score in found]
        scored: list[Scored] = []
        for every_row in (exact, True):
            ranked = await self._store._rank(table, embedder, vector, filters, exact=every_row)
            if ranked is None:
                return await self._nearest_vec0(table, vector, filters, k)
            rowids, sims, every = ranked
            rowids, sims = await self._with_own_writes(
                table, embedder, vector, filters, rowids, sims
            )
            scored = await self._best_records(rowids, sims, filters, k)
            if len(scored) >= k or every:
                break
            # the nearest clusters hold too few records that pass the filters: every row
        return scored

    async def _best_records(
        self, rowids: npt.NDArray[np.int64], sims: Vector, filters: Filters, k: int
    ) -> list[Scored]:
        """The ``k`` best records among these rows that pass the filters, best first
        (``best_rows``, on the connection's thread)."""
        where, params = filters_sql(filters)
        try:
            found = await on_thread(self._conn, best_rows, rowids, sims, where, params, k)
        except OPERATIONAL_ERRORS as exc:
            raise storage_error(exc) from exc
        return [Scored(record_of(row), score) for row, score in found]

    def _reads_committed(self) -> bool:
        """Whether this reads what is committed only (the reader, not a transaction that
        wrote vectors): what the in-memory copy holds."""
        return self._conn is self._store._reader

    async def _with_own_writes(
        self,
        table: str,
        embedder: str,
        vector: Vector,
        filters: Filters,
        rowids: npt.NDArray[np.int64],
        sims: Vector,
    ) -> tuple[npt.NDArray[np.int64], Vector]:
        """The in-memory copy's rows, with this transaction's own writes in place.

        The copy holds committed vectors only; records whose vectors this
        transaction wrote (a batch of stores) are read from vec0 instead.
        """
        import numpy as np

        own = await self._own_writes()
        if not own:
            return rowids, sims
        where, params = filters_sql(filters)
        slots = await self.fetch(
            f"SELECT r.seq, r.vec_rows FROM records r NOT INDEXED WHERE r.seq IN ({marks(own)}) "
            f"AND r.embedder = ? AND r.vec_rows > 0 AND {where}",
            [*own, embedder, *params],
        )
        mine = await self._cosines_vec0(
            table, vector, [r for seq, n in slots for r in rowids_of(int(seq), int(n))]
        )
        keep = ~np.isin(rowids // MAX_PASSAGES, np.fromiter(own, np.int64))
        return (
            np.concatenate([rowids[keep], np.fromiter(mine, np.int64, len(mine))]),
            np.concatenate([sims[keep], np.fromiter(mine.values(), np.float32, len(mine))]),
        )

    async def _nearest_vec0(
        self, table: str, vector: Vector, filters: Filters, k: int
    ) -> list[Scored]:
        """``nearest`` through vec0's k-nearest search, deepening as filters need."""
        blob = to_blob(vector)
        clauses = [
            "embedding MATCH ?",
            "k = ?",
            f"scope_key IN ({marks(filters.scope_keys)})",
            f"corpus IN ({marks(filters.corpora)})",
        ]
        params: list[Any] = [blob, 0, *filters.scope_keys, *filters.corpora]
        if filters.kinds:
            clauses.append(f"kind IN ({marks(filters.kinds)})")
            params.extend(filters.kinds)
        sql = f"SELECT rowid, distance FROM {table} WHERE {' AND '.join(clauses)}"
        depth = min(_KNN_MAX, max(k * _FIRST_DEPTH, 32))
        while True:
            params[1] = depth
            hits = await self.fetch(sql, params)
            best: dict[int, float] = {}
            for rowid, distance in hits:
                seq = owner_of(rowid)
                best[seq] = max(best.get(seq, -1.0), 1.0 - float(distance))
            scored = await self._records_by_seq(best, filters, k)
            if len(scored) >= k or len(hits) < depth or depth >= _KNN_MAX:
                return scored
            depth = min(_KNN_MAX, depth * 2)

    async def _records_by_seq(
        self, best: dict[int, float], filters: Filters, k: int
    ) -> list[Scored]:
        """The ``k`` best of these records (by ``seq``, with their scores) that pass
        the filters, best first; only those are made records from their rows."""
        if not best:
            return []
        where, params = filters_sql(filters)
        # only records that hold vectors: a retired record's rows wait in vec0 until
        # they are swept, and its seq may be a record's without vectors again
        held = f"{where} AND r.vec_rows > 0"
        rows = await self.fetch(by_seq_sql(best, held), [*best, *params])
        return [Scored(record_of(row), score) for row, score in by_seq(rows, best, k)]

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
        """``nearest`` and ``dense_scores`` of ``record_ids``: on a current copy, one trip
        to the reader's thread for both, in the ``probes`` clusters nearest
        (``NEIGHBOUR_PROBES`` unless given), ranked already if ``ahead`` (from
        ``SqliteStore.rank_ahead``) still holds."""
        found = await self.candidate_reads(
            vector, embedder, filters, k, record_ids, probes=probes, ahead=ahead
        )
        return found.near, found.scores

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
        """``nearest_with_scores``, and what a search reads next of the records found and
        of ``record_ids`` (their conversations unless ``within_seconds`` is None, their
        open conflicts if ``conflicts``), on a current copy in the same trip to the
        reader's thread; off one, those are not read (None)."""
        table = await self._store._vector_table(self._conn, embedder)
        if table is not None and filters.scope_keys and self._reads_committed():
            from memory_mcp.storage.sqlite.dense import Ahead

            ranked = ahead if isinstance(ahead, Ahead) else None

            def read(conn: sqlite3.Connection, index: DenseIndex) -> _Found | None:
                scores = cosines_by_id(conn, index, vector, embedder, record_ids)
                if scores is None:
                    return None
                near = nearest_rows(
                    conn, index, vector, filters, k, probes or NEIGHBOUR_PROBES, ranked
                )
                near_ids = [str(row[0]) for row, _ in near]
                around = None
                if within_seconds is not None:
                    ids = list(dict.fromkeys([*near_ids, *scores]))
                    around = around_rows(conn, index, table, ids, within_seconds, embedder)
                held = None
                if conflicts:
                    ids = list(dict.fromkeys([*near_ids, *record_ids]))
                    where, params = open_conflicts_where(ids)
                    held = [Conflict(*row) for row in conn.execute(conflicts_sql(where), params)]
                return near, scores, around, held

            found = await self._store._on_copy(table, filters.scope_keys, read)
            if found is not None:
                rows, scores, around, held = found
                near = [Scored(record_of(row), score) for row, score in rows]
                return CandidateReads(near, scores, around, held)
        near = await self.nearest(vector, embedder, filters, k)
        return CandidateReads(near, await self.dense_scores(vector, embedder, record_ids))

    async def dense_scores(
        self, vector: Vector, embedder: str, record_ids: Sequence[str]
    ) -> dict[str, float]:
        """The best passage cosine of each given record that has a vector."""
        table = await self._store._vector_table(self._conn, embedder)
        if table is None or not record_ids:
            return {}
        if self._reads_committed():
            fast = await self._store._on_copy(
                table,
                (),
                lambda conn, index: cosines_by_id(conn, index, vector, embedder, record_ids),
            )
            if fast is not None:
                return fast
        slots = await self.fetch(slots_sql(record_ids), [*record_ids, embedder])
        if not slots:
            return {}
        rowids = [r for seq, _, n, _ in slots for r in rowids_of(int(seq), int(n))]
        scopes = {str(key) for *_, key in slots}
        held = await self._store._cosines(table, embedder, vector, scopes, rowids)
        own = await self._own_writes()
        found = {r: s for r, s in held.items() if owner_of(r) not in own}
        rows = await self._cosines_vec0(table, vector, [r for r in rowids if r not in found])
        found.update(rows)
        return best_of(found, {int(seq): str(record_id) for seq, record_id, *_ in slots})

    async def in_conversation(
        self, record_ids: Sequence[str], within_seconds: float, embedder: str
    ) -> dict[str, Around]:
        """Each record's whole-text vector from ``embedder``, with its neighbours in time.

        A record's neighbours are the current records of its scope and corpus
        written just before and just after it (by creation time, then write
        order), when no more than ``within_seconds`` apart from it. Records (and
        neighbours) without a vector from ``embedder`` are left out. One query
        finds them all: each record's row of the table the triggers keep
        (``neighbours``); whether a neighbour has vectors is known from the copy (or
        vec0) when its vector is read. Reading its row to ask cost 0.2 ms of a
        search's 1.2 at 50,000 memories.
        """

        table = await self._store._vector_table(self._conn, embedder)
        if table is None or not record_ids:
            return {}
        rows = await self.fetch(*_neighbours_query(record_ids, within_seconds, embedder))
        if not rows:
            return {}
        found, rowids = _conversations(rows)
        rowid, vectors = await self._store._vectors(table, rowids)
        own = await self._own_writes()
        vector_of = {
            seq: vector
            for seq, vector in zip((rowid // MAX_PASSAGES).tolist(), vectors, strict=True)
            if seq not in own
        }
        rest = [r for r in rowids if owner_of(r) not in vector_of]
        for r, vector in (await self._vectors_vec0(table, rest)).items():
            vector_of[owner_of(r)] = vector
        return _arounds(found, vector_of)

    async def _vectors_vec0(self, table: str, rowids: Sequence[int]) -> dict[int, Vector]:
        """These vec0 rows' vectors, by rowid (in the order asked), read from vec0."""
        if not rowids:
            return {}
        return _vec0_vectors(await self.fetch(*_vec0_query(table, rowids)))

    async def _own_writes(self) -> Collection[int]:
        """Records whose vectors this connection wrote and has not committed."""
        return ()

    async def _cosines_vec0(
        self, table: str, vector: Vector, rowids: Sequence[int]
    ) -> dict[int, float]:
        """The cosine of each of these vec0 rows with ``vector``, read from vec0."""
        if not rowids:
            return {}
        # A join on rowid is a point lookup in vec0 (a range or IN list is a full scan).
        rows = await self.fetch(
            f"SELECT j.value, 1.0 - vec_distance_cosine(v.embedding, ?) "
            f"FROM json_each(?) j JOIN {table} v ON v.rowid = j.value",
            [to_blob(vector), json.dumps(list(rowids))],
        )
        return {int(rowid): float(similarity) for rowid, similarity in rows}

    async def find_by_hash(self, content_hash: str, filters: Filters) -> list[Record]:
        where, params = filters_sql(filters)
        rows = await self.fetch(hash_sql(where), [content_hash, *params])
        return [record_of(row) for row in rows]

    async def current(self, filters: Filters, limit: int, offset: int = 0) -> list[Record]:
        """Current records matching ``filters``, newest first (after the first ``offset``)."""
        where, params = filters_sql(filters)
        rows = await self.fetch(
            f"SELECT {SELECT} FROM records r WHERE {where} "
            "ORDER BY r.created_at DESC, r.seq DESC LIMIT ? OFFSET ?",
            [*params, limit, offset],
        )
        return [record_of(row) for row in rows]
