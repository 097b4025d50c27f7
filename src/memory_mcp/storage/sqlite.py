"""The SQLite store: one file, WAL, FTS5 for words, sqlite-vec for vectors.

Two connections per process: a writer, whose transactions are ``BEGIN
IMMEDIATE`` (the database's write lock, shared by every process on the file)
and serialized in-process by a lock; and a reader, which in WAL mode never
waits for writers.

Vectors live in one vec0 table per (embedder, dimension), partitioned by scope
key, with the corpus and kind of each record as metadata so that
nearest-neighbour queries filter inside the index. Only current records have
vectors: record ``seq`` owns rowids ``seq * MAX_PASSAGES + i`` for ``i <
vec_rows``. vec0 finds a row quickly only by rowid equality (a rowid range or
IN list scans the whole index), so every per-record read joins on rowid, and
deletes go one rowid at a time. Triggers keep FTS5 in step with ``records``
and queue the vectors of a record that stops being current; ``write()``
deletes them before its transaction commits.

Searches score an in-memory copy of the vector table (``dense.DenseIndex``),
which every vector write keeps current through the ``vector_changes`` log;
vec0's own k-nearest search answers when there is no copy.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sqlite3
import tempfile
import time
from collections.abc import AsyncIterator, Collection, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiosqlite
import anyio

from memory_mcp.errors import StorageError
from memory_mcp.lexical import query_terms, stem
from memory_mcp.passages import MAX_PASSAGES
from memory_mcp.ranker import (
    DURABLE_KINDS,
    KIND_IMPORTANCE,
    RECENCY_FLOOR,
    REINFORCEMENT_FLOOR,
    RankerConfig,
)
from memory_mcp.records import (
    Conflict,
    MergedEntry,
    Record,
    derived,
    merged_text,
    utcnow,
)
from memory_mcp.storage.base import (
    Around,
    Diagnosis,
    Filters,
    Position,
    Scored,
    StoreStats,
    TaskState,
    Vector,
)
from memory_mcp.storage.driver import (
    DATABASE_ERRORS,
    ERRORS,
    OPERATIONAL_ERRORS,
    Driver,
    DriverName,
    choose_driver,
)
from memory_mcp.storage.migrations import copy_database, migrate

if TYPE_CHECKING:
    from collections.abc import Callable
    from datetime import datetime

if TYPE_CHECKING:  # numpy and the vector copy load only when vectors are used
    import numpy as np
    import numpy.typing as npt

    from memory_mcp.storage.dense import DenseIndex

log = logging.getLogger(__name__)

_COLUMNS = (
    "id",
    "corpus",
    "kind",
    "scope",
    "scope_key",
    "content",
    "tags",
    "importance",
    "pinned",
    "agent",
    "created_at",
    "updated_at",
    "access_count",
    "last_access_at",
    "fold_count",
    "merged_from",
    "supersedes",
    "replaced_by",
    "embedder",
    "meta",
    "archived_at",
    "archived_reason",
)
_SELECT = ", ".join(f"r.{c}" for c in _COLUMNS)
_BUSY_HINT = (
    "the database is busy: another memory-mcp process held its write lock longer than "
    "storage.busy_timeout_ms"
)


def _record(row: Sequence[Any]) -> Record:
    values = dict(zip(_COLUMNS, row, strict=False))
    return Record(
        id=values["id"],
        corpus=values["corpus"],
        kind=values["kind"],
        scope=values["scope"],
        scope_key=values["scope_key"],
        content=values["content"],
        tags=json.loads(values["tags"]),
        importance=values["importance"],
        pinned=bool(values["pinned"]),
        agent=values["agent"],
        created_at=values["created_at"],
        updated_at=values["updated_at"],
        access_count=values["access_count"],
        last_access_at=values["last_access_at"],
        fold_count=values["fold_count"],
        merged_from=[MergedEntry.from_json(m) for m in json.loads(values["merged_from"])],
        supersedes=json.loads(values["supersedes"]),
        replaced_by=values["replaced_by"],
        embedder=values["embedder"],
        meta=json.loads(values["meta"]),
        archived_at=values["archived_at"],
        archived_reason=values["archived_reason"],
    )


def _record_params(record: Record) -> tuple[Any, ...]:
    columns = derived(record)
    return (
        record.id,
        record.corpus,
        record.kind,
        record.scope,
        record.scope_key,
        record.content,
        columns.content_hash,
        json.dumps(record.tags, ensure_ascii=False),
        record.importance,
        int(record.pinned),
        record.agent,
        record.created_at,
        record.updated_at,
        record.access_count,
        record.last_access_at,
        record.fold_count,
        json.dumps([m.to_json() for m in record.merged_from], ensure_ascii=False),
        columns.merged_text,
        json.dumps(record.supersedes),
        record.replaced_by,
        record.embedder,
        json.dumps(record.meta, ensure_ascii=False),
        record.archived_at,
        record.archived_reason,
        columns.emphasis,
    )


_INSERT = (
    "INSERT INTO records (id, corpus, kind, scope, scope_key, content, content_hash, tags, "
    "importance, pinned, agent, created_at, updated_at, access_count, last_access_at, "
    "fold_count, merged_from, merged_text, supersedes, replaced_by, embedder, meta, "
    "archived_at, archived_reason, emphasis) VALUES (" + ", ".join("?" * 25) + ")"
)


def _seq(position: Position | None) -> int:
    """The write order number a position stands for (0: before the first record).

    Cursors saved before positions were text hold the number itself.
    """
    return int(position or 0)


def _marks(values: Collection[Any]) -> str:
    return ", ".join("?" * len(values))


def _where(f: Filters, *, live_only: bool = True) -> tuple[str, list[Any]]:
    clauses = [f"r.scope_key IN ({_marks(f.scope_keys)})", f"r.corpus IN ({_marks(f.corpora)})"]
    params: list[Any] = [*f.scope_keys, *f.corpora]
    if live_only:
        clauses.append("r.live = 1")
    if f.kinds:
        clauses.append(f"r.kind IN ({_marks(f.kinds)})")
        params.extend(f.kinds)
    if f.tags:
        clauses.append(
            f"EXISTS (SELECT 1 FROM json_each(r.tags) WHERE json_each.value IN ({_marks(f.tags)}))"
        )
        params.extend(f.tags)
    if f.since:
        clauses.append("r.created_at >= ?")
        params.append(f.since)
    if f.until:
        clauses.append("r.created_at < ?")
        params.append(f.until)
    if f.exclude_ids:
        clauses.append(f"r.id NOT IN ({_marks(f.exclude_ids)})")
        params.extend(f.exclude_ids)
    return " AND ".join(clauses), params


def _by_seq_sql(seqs: Collection[int], where: str) -> str:
    """Given records (by ``seq``) that pass the filters ``where``.

    Left to itself, SQLite reads them through ``records_live`` (the filters'
    equalities), i.e. every live record of the project: 14-18 ms at 50,000.
    NOT INDEXED leaves it the rowid lookups.
    """
    return (
        f"SELECT {_SELECT}, r.seq FROM records r NOT INDEXED "
        f"WHERE r.seq IN ({_marks(seqs)}) AND {where}"
    )


def _slots_sql(record_ids: Collection[str]) -> str:
    """Where the vectors of the given records are, by id.

    The unary ``+`` keeps SQLite from reading them through ``records_embedder``,
    i.e. every record with a vector: 48 ms at 50,000 memories.
    """
    return (
        f"SELECT seq, id, vec_rows, scope_key FROM records WHERE id IN ({_marks(record_ids)}) "
        "AND +embedder = ? AND vec_rows > 0"
    )


def _hash_sql(where: str) -> str:
    """Records with a given content hash, newest first.

    Without statistics, SQLite picks ``records_live`` (three equalities too) and
    tests the hash of every live record of the project: 26 ms at 50,000.
    """
    return (
        f"SELECT {_SELECT} FROM records r INDEXED BY records_hash "
        f"WHERE r.content_hash = ? AND {where} ORDER BY r.created_at DESC"
    )


def _lexical_sql(where: str) -> str:
    """The full-text query: BM25 over the matches of ``?``, filtered by ``where``.

    CROSS JOIN keeps the full-text match as the outer loop: with a time bound the
    planner otherwise walks the date index and runs MATCH once per row (161 ms
    instead of 29 ms per search at 1,000 memories).
    """
    return (
        f"SELECT {_SELECT}, bm25(records_fts, 1.0, 0.8, 0.3) AS s FROM records_fts "
        "CROSS JOIN records r ON r.seq = records_fts.rowid "
        f"WHERE records_fts MATCH ? AND {where} ORDER BY s LIMIT ?"
    )


def fts_query(text: str | list[str]) -> str:
    """An FTS5 MATCH expression: any of the text's ``query_terms`` (or these), quoted.

    Quoting every term makes FTS5 syntax in user text (``AND``, ``NEAR``, ``*``,
    ``:``, quotes, parentheses) plain words.
    """
    terms = query_terms(text) if isinstance(text, str) else text
    return " OR ".join(f'"{term}"' for term in terms)


_JULIAN_UNIX_EPOCH = 2440587.5


def _prior_sql(config: RankerConfig, now: datetime) -> tuple[str, list[object]]:
    """``ranker.prior`` as an SQL expression over ``records r`` (with its parameters).

    The same formula, term for term, reading the emphasis count stored with each
    record, so the top records by prior come from SQLite without reading every
    record into Python. The contract suite holds it to ``ranker.prior``.
    """
    kinds = " ".join(f"WHEN '{kind}' THEN {value}" for kind, value in KIND_IMPORTANCE.items())
    importance = (
        f"COALESCE(r.importance, MIN(1.0, (CASE r.kind {kinds} ELSE 0.5 END) + 0.1 * r.emphasis))"
    )
    durable = ", ".join(f"'{kind}'" for kind in sorted(DURABLE_KINDS))
    age = "MAX(0.0, ? - julianday(r.created_at))"
    half_life = f"(CASE WHEN r.kind IN ({durable}) THEN ? ELSE ? END)"
    decay = f"exp(-0.6931471805599453 * {age} / {half_life})"
    recency = (
        f"(CASE WHEN r.pinned THEN 1.0 ELSE {RECENCY_FLOOR} + {1 - RECENCY_FLOOR} * {decay} END)"
    )
    signal = "(r.fold_count + r.access_count / 2.0)"
    reinforcement = f"(1.0 - 1.0 / (1.0 + {signal} / 3.0))"
    boost = f"({REINFORCEMENT_FLOOR} + {1 - REINFORCEMENT_FLOOR} * {reinforcement})"
    julian = now.timestamp() / 86400 + _JULIAN_UNIX_EPOCH
    params: list[object] = [julian, config.durable_half_life_days, config.half_life_days]
    return f"{importance} * {recency} * {boost}", params


def _blob(vector: Vector) -> bytes:
    import numpy as np

    return np.ascontiguousarray(vector, dtype=np.float32).tobytes()


def _rowids(seq: int, count: int, *, start: int = 0) -> list[int]:
    """The vec0 rowids of passages ``start`` .. ``start + count - 1`` of record ``seq``."""
    first = seq * MAX_PASSAGES + start
    return list(range(first, first + count))


def _owner(rowid: int) -> int:
    """The ``seq`` of the record that owns a vec0 rowid (the inverse of ``_rowids``)."""
    return int(rowid) // MAX_PASSAGES


@dataclass(frozen=True)
class _Slot:
    """Where a record's vectors live."""

    seq: int
    scope_key: str
    corpus: str
    kind: str
    live: int
    embedder: str | None
    vec_rows: int

    @property
    def partition(self) -> tuple[str, str, str]:
        """The vec0 partition key and metadata columns of its vector rows."""
        return self.scope_key, self.corpus, self.kind


_TABLE_NAME = re.compile(r"^vec_[0-9]+$")
# sqlite-vec's largest k; past as many rows, the in-memory search stops
# deepening and masks the rows of the records that pass the filters instead.
_KNN_MAX = 4096
# Rows asked for per wanted record, doubled while filters reject: vec0's
# k-nearest search costs grow with k as much as with the rows scanned (10.6 ms
# at k=240 vs 4.6 ms at k=60 over 3,650 vectors), and each round of the
# in-memory search reads its records.
_FIRST_DEPTH = 2
# The write path looks for lexical candidates with a memory's rarest words: its
# common ones matched most of a 50,000-memory project (92 ms of a store).
_RARE_TERMS = 8
_RARE_POSTINGS = 5_000
_COUNTS_TTL = 600.0  # seconds a word's record count is reused
_COUNTS_MAX = 100_000  # words remembered at most


class _Queries:
    """Read queries shared by the reader connection and write transactions."""

    def __init__(self, conn: aiosqlite.Connection, store: SqliteStore) -> None:
        self._conn = conn
        self._store = store

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        try:
            return list(await self._conn.execute_fetchall(sql, params))
        except OPERATIONAL_ERRORS as exc:
            raise _storage_error(exc) from exc

    async def lexical(
        self, text: str, filters: Filters, k: int, *, rare_words: bool = False
    ) -> list[Scored]:
        """Records matching words of ``text``, best BM25 first.

        ``rare_words`` matches on the text's rarest words only (``_rarest``):
        what the write path wants from a whole memory, whose common words
        match most of a project.
        """
        terms = query_terms(text)
        if rare_words and len(terms) > 2:
            terms = await self._rarest(terms)
        if not terms or not filters.scope_keys:
            return []
        where, params = _where(filters)
        rows = await self._fetch(_lexical_sql(where), [fts_query(terms), *params, k])
        return [Scored(_record(row), -float(row[-1])) for row in rows]

    async def _rarest(self, terms: list[str]) -> list[str]:
        """The rarest of ``terms`` by the number of records that hold them (FTS5's vocabulary).

        Up to ``_RARE_TERMS`` words, fewer once they match ``_RARE_POSTINGS``
        records together (at least two). Words the vocabulary does not know
        match nothing, cost nothing, and stay. The counts need not be exact:
        they are remembered for ``_COUNTS_TTL`` seconds.
        """
        stems = {term: stem(term) for term in terms}
        held = await self._store._document_counts(set(stems.values()))
        kept = [t for t in terms if stems[t] not in held]
        known = sorted((t for t in terms if stems[t] in held), key=lambda t: held[stems[t]])
        total = 0
        for count, term in enumerate(known):
            if count >= _RARE_TERMS or (count >= 2 and total + held[stems[term]] > _RARE_POSTINGS):
                break
            kept.append(term)
            total += held[stems[term]]
        return kept

    async def nearest(
        self, vector: Vector, embedder: str, filters: Filters, k: int
    ) -> list[Scored]:
        """The ``k`` records nearest to ``vector``, best first.

        A record's similarity is the best cosine of its passages. Scope, corpus
        and kind filter the rows scored; filters the vectors do not carry (tags,
        time, excluded ids) are applied to a deepening list of the best rows, so
        that they act before the limit. Stopping once ``k`` records pass loses
        nothing: a record's first row in the list is its best passage.

        The rows come from the in-memory copy of the vector table (``dense``),
        or from vec0's own k-nearest search when there is none.
        """
        import numpy as np

        table = await self._store._vector_table(self._conn, embedder)
        if table is None or not filters.scope_keys:
            return []
        ranked = await self._store._rank(table, embedder, vector, filters)
        if ranked is None:
            return await self._nearest_vec0(table, vector, filters, k)
        rowids, sims = await self._with_own_writes(table, embedder, vector, filters, *ranked)
        where, params = _where(filters)
        depth = max(k * _FIRST_DEPTH, 32)
        while True:
            top = np.argpartition(-sims, depth)[:depth] if depth < len(sims) else None
            chosen = slice(None) if top is None else top
            best: dict[int, float] = {}
            for rowid, similarity in zip(
                rowids[chosen].tolist(), sims[chosen].tolist(), strict=True
            ):
                seq = _owner(rowid)
                best[seq] = max(best.get(seq, -1.0), similarity)
            scored = await self._records_by_seq(best, filters)
            if len(scored) >= k or top is None:
                scored.sort(key=lambda s: -s.score)
                return scored[:k]
            depth *= 2
            if depth > _KNN_MAX:  # a selective filter: keep the rows of records that pass it
                passing = await self._fetch(f"SELECT r.seq FROM records r WHERE {where}", params)
                keep = np.isin(
                    rowids // MAX_PASSAGES, np.fromiter((p[0] for p in passing), np.int64)
                )
                rowids, sims = rowids[keep], sims[keep]

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

        own = self._own_writes()
        if not own:
            return rowids, sims
        where, params = _where(filters)
        slots = await self._fetch(
            f"SELECT r.seq, r.vec_rows FROM records r NOT INDEXED WHERE r.seq IN ({_marks(own)}) "
            f"AND r.embedder = ? AND r.vec_rows > 0 AND {where}",
            [*own, embedder, *params],
        )
        mine = await self._cosines_vec0(
            table, vector, [r for seq, n in slots for r in _rowids(int(seq), int(n))]
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
        blob = _blob(vector)
        clauses = [
            "embedding MATCH ?",
            "k = ?",
            f"scope_key IN ({_marks(filters.scope_keys)})",
            f"corpus IN ({_marks(filters.corpora)})",
        ]
        params: list[Any] = [blob, 0, *filters.scope_keys, *filters.corpora]
        if filters.kinds:
            clauses.append(f"kind IN ({_marks(filters.kinds)})")
            params.extend(filters.kinds)
        sql = f"SELECT rowid, distance FROM {table} WHERE {' AND '.join(clauses)}"
        depth = min(_KNN_MAX, max(k * _FIRST_DEPTH, 32))
        while True:
            params[1] = depth
            hits = await self._fetch(sql, params)
            best: dict[int, float] = {}
            for rowid, distance in hits:
                seq = _owner(rowid)
                best[seq] = max(best.get(seq, -1.0), 1.0 - float(distance))
            scored = await self._records_by_seq(best, filters)
            if len(scored) >= k or len(hits) < depth or depth >= _KNN_MAX:
                scored.sort(key=lambda s: -s.score)
                return scored[:k]
            depth = min(_KNN_MAX, depth * 2)

    async def _records_by_seq(self, best: dict[int, float], filters: Filters) -> list[Scored]:
        if not best:
            return []
        where, params = _where(filters)
        rows = await self._fetch(
            _by_seq_sql(best, where),
            [*best, *params],
        )
        return [Scored(_record(row), best[int(row[-1])]) for row in rows]

    async def dense_scores(
        self, vector: Vector, embedder: str, record_ids: Sequence[str]
    ) -> dict[str, float]:
        """The best passage cosine of each given record that has a vector."""
        table = await self._store._vector_table(self._conn, embedder)
        if table is None or not record_ids:
            return {}
        slots = await self._fetch(_slots_sql(record_ids), [*record_ids, embedder])
        if not slots:
            return {}
        rowids = [r for seq, _, n, _ in slots for r in _rowids(int(seq), int(n))]
        scopes = {str(key) for *_, key in slots}
        held = await self._store._cosines(table, embedder, vector, scopes, rowids)
        own = self._own_writes()
        found = {r: s for r, s in held.items() if _owner(r) not in own}
        rows = await self._cosines_vec0(table, vector, [r for r in rowids if r not in found])
        found.update(rows)
        id_of = {int(seq): str(record_id) for seq, record_id, *_ in slots}
        scores: dict[str, float] = {}
        for rowid, similarity in found.items():
            record_id = id_of[_owner(rowid)]
            scores[record_id] = max(scores.get(record_id, -1.0), similarity)
        return scores

    async def in_conversation(
        self, record_ids: Sequence[str], within_seconds: float, embedder: str
    ) -> dict[str, Around]:
        """Each record's whole-text vector from ``embedder``, with its neighbours in time.

        A record's neighbours are the current records of its scope and corpus
        written just before and just after it (by creation time, then write
        order), when no more than ``within_seconds`` apart from it. Records (and
        neighbours) without a vector from ``embedder`` are left out. One query
        finds them all: the nearest record on each side is an index seek.
        """

        table = await self._store._vector_table(self._conn, embedder)
        if table is None or not record_ids:
            return {}
        side = (
            "(SELECT CASE WHEN abs(julianday(o.created_at) - julianday(c.created_at)) "
            "* 86400.0 <= ? AND o.embedder = ? AND o.vec_rows > 0 "
            "THEN json_array(o.id, o.seq) END FROM records o "
            "WHERE o.scope_key = c.scope_key AND o.corpus = c.corpus AND o.live = 1 "
            "AND o.created_at {cmp}= c.created_at "
            "AND (o.created_at {cmp} c.created_at OR o.seq {cmp} c.seq) "
            "ORDER BY o.created_at {order}, o.seq {order} LIMIT 1)"
        )
        near = [within_seconds, embedder] if within_seconds > 0 else []
        sides = (
            f", {side.format(cmp='<', order='DESC')}, {side.format(cmp='>', order='ASC')}"
            if within_seconds > 0
            else ""
        )
        rows = await self._fetch(
            f"SELECT c.id, c.seq{sides} FROM records c "
            f"WHERE c.id IN ({_marks(record_ids)}) AND +c.embedder = ? AND c.vec_rows > 0",
            [*near, *near, *record_ids, embedder],
        )
        if not rows:
            return {}
        found: dict[str, tuple[int, list[tuple[str, int]]]] = {}
        for record_id, seq, *around in rows:
            others = [tuple(json.loads(value)) for value in around if value]
            found[str(record_id)] = (int(seq), [(str(i), int(q)) for i, q in others])
        seqs = {seq for seq, _ in found.values()}
        seqs.update(q for _, others in found.values() for _, q in others)
        rowids = sorted(_rowids(seq, 1)[0] for seq in seqs)
        rowid, vectors = await self._store._vectors(table, rowids)
        own = self._own_writes()
        vector_of = {
            _owner(r): vectors[i] for i, r in enumerate(rowid.tolist()) if _owner(r) not in own
        }
        rest = [r for r in rowids if _owner(r) not in vector_of]
        for r, vector in (await self._vectors_vec0(table, rest)).items():
            vector_of[_owner(r)] = vector
        return {
            record_id: Around(
                vector_of[seq],
                {i: vector_of[q] for i, q in others if q in vector_of},
            )
            for record_id, (seq, others) in found.items()
            if seq in vector_of
        }

    async def _vectors_vec0(self, table: str, rowids: Sequence[int]) -> dict[int, Vector]:
        """These vec0 rows' vectors, by rowid (in the order asked), read from vec0."""
        import numpy as np

        if not rowids:
            return {}
        # A join on rowid is a point lookup in vec0 (a range or IN list is a full scan).
        rows = await self._fetch(
            f"SELECT j.value, v.embedding FROM json_each(?) j "
            f"JOIN {table} v ON v.rowid = j.value ORDER BY j.key",
            [json.dumps(list(rowids))],
        )
        return {int(r): np.frombuffer(bytes(blob), dtype=np.float32) for r, blob in rows}

    def _own_writes(self) -> Collection[int]:
        """Records whose vectors this connection wrote and has not committed."""
        return ()

    async def _cosines_vec0(
        self, table: str, vector: Vector, rowids: Sequence[int]
    ) -> dict[int, float]:
        """The cosine of each of these vec0 rows with ``vector``, read from vec0."""
        if not rowids:
            return {}
        # A join on rowid is a point lookup in vec0 (a range or IN list is a full scan).
        rows = await self._fetch(
            f"SELECT j.value, 1.0 - vec_distance_cosine(v.embedding, ?) "
            f"FROM json_each(?) j JOIN {table} v ON v.rowid = j.value",
            [_blob(vector), json.dumps(list(rowids))],
        )
        return {int(rowid): float(similarity) for rowid, similarity in rows}

    async def find_by_hash(self, content_hash: str, filters: Filters) -> list[Record]:
        where, params = _where(filters)
        rows = await self._fetch(_hash_sql(where), [content_hash, *params])
        return [_record(row) for row in rows]

    async def current(self, filters: Filters, limit: int) -> list[Record]:
        """Current records matching ``filters``, newest first."""
        where, params = _where(filters)
        rows = await self._fetch(
            f"SELECT {_SELECT} FROM records r WHERE {where} "
            "ORDER BY r.created_at DESC, r.seq DESC LIMIT ?",
            [*params, limit],
        )
        return [_record(row) for row in rows]


class _Transaction(_Queries):
    """One ``BEGIN IMMEDIATE`` transaction on the writer connection."""

    def __init__(self, conn: aiosqlite.Connection, store: SqliteStore) -> None:
        super().__init__(conn, store)
        self._touched: set[int] = set()  # records whose vectors this transaction changed

    def _own_writes(self) -> Collection[int]:
        return self._touched

    async def _exec(self, sql: str, params: Sequence[Any] = ()) -> int:
        try:
            cursor = await self._conn.execute(sql, params)
        except OPERATIONAL_ERRORS as exc:
            raise _storage_error(exc) from exc
        return cursor.rowcount

    async def _slot(self, record_id: str) -> _Slot | None:
        rows = await self._fetch(
            "SELECT seq, scope_key, corpus, kind, live, embedder, vec_rows FROM records "
            "WHERE id = ?",
            [record_id],
        )
        return _Slot(*rows[0]) if rows else None

    async def insert(self, record: Record, vectors: Vector | None) -> None:
        """Insert a new record with its passage vectors (one row per passage)."""
        await self._exec(_INSERT, _record_params(record))
        if vectors is not None and record.embedder:
            await self._put_vectors(record.id, vectors, record.embedder)

    async def _put_vectors(self, record_id: str, vectors: Vector, embedder: str) -> bool:
        """Make ``vectors`` the record's passage vectors; False if it is not current."""
        import numpy as np

        slot = await self._slot(record_id)
        if slot is None:
            return False
        if slot.embedder and slot.vec_rows:
            await self._store._delete_vectors(self._conn, slot.embedder, slot.seq, slot.vec_rows)
            self._touched.add(slot.seq)
        if not slot.live:
            return False  # only current records are indexed
        matrix = np.atleast_2d(vectors)[:MAX_PASSAGES]
        table = await self._store._vector_table(self._conn, embedder, dim=int(matrix.shape[1]))
        assert table is not None
        await self._write_vectors(table, embedder, slot, 0, [_blob(row) for row in matrix])
        return True

    async def _write_vectors(
        self, table: str, embedder: str, slot: _Slot, start: int, blobs: Sequence[bytes]
    ) -> None:
        """Write passage vectors ``start``.. of a record; it then owns ``start + len`` rows."""
        rowids = _rowids(slot.seq, len(blobs), start=start)
        self._touched.add(slot.seq)
        await _log_change(self._conn, embedder, slot.seq)
        await self._conn.executemany(
            f"INSERT INTO {table} (rowid, scope_key, corpus, kind, embedding) "
            "VALUES (?, ?, ?, ?, ?)",
            [(rowid, *slot.partition, blob) for rowid, blob in zip(rowids, blobs, strict=True)],
        )
        await self._exec(
            "UPDATE records SET embedder = ?, vec_rows = ? WHERE seq = ?",
            [embedder, start + len(blobs), slot.seq],
        )

    async def carry_vectors(self, from_id: str, to_id: str, embedder: str) -> int:
        """Append ``from_id``'s passage vectors to ``to_id``'s (a fold keeps both findable)."""
        table = await self._store._vector_table(self._conn, embedder)
        source, target = await self._slot(from_id), await self._slot(to_id)
        if table is None or source is None or target is None or not target.live:
            return 0
        if source.embedder != embedder or target.embedder != embedder:
            return 0
        free = MAX_PASSAGES - target.vec_rows
        rows = await self._fetch(
            f"SELECT v.embedding FROM json_each(?) j JOIN {table} v ON v.rowid = j.value "
            "ORDER BY j.key",
            [json.dumps(_rowids(source.seq, min(source.vec_rows, free)))],
        )
        blobs = [bytes(row[0]) for row in rows]
        await self._write_vectors(table, embedder, target, target.vec_rows, blobs)
        return len(blobs)

    async def set_vectors(self, items: Sequence[tuple[Record, Vector]], embedder: str) -> int:
        """Replace the vectors of records (re-embedding); returns how many were updated.

        A record whose text or folded texts changed since it was read (another
        process refined or unfolded it meanwhile) is left for the next round.
        """
        done = 0
        for record, vectors in items:
            unchanged = await self._fetch(
                "SELECT 1 FROM records WHERE id = ? AND content = ? AND merged_text = ?",
                [record.id, record.content, merged_text(record)],
            )
            if unchanged:
                done += await self._put_vectors(record.id, vectors, embedder)
        return done

    async def fold_into(self, old: Record, new_id: str, entry: MergedEntry, at: str) -> None:
        """Retire ``old`` after its text moved into record ``new_id``'s ``merged_from``."""
        del entry  # the entry lives in the new record; the old row points at it
        # updated_at stays: restoring the record gives it back exactly as it was.
        await self._exec(
            "UPDATE records SET archived_at = ?, archived_reason = 'folded', replaced_by = ? "
            "WHERE id = ?",
            [at, new_id, old.id],
        )

    async def replace(self, old: Record, new_id: str) -> None:
        """Make ``old`` history of ``new_id`` (superseded fact, previous goal or plan)."""
        await self._exec("UPDATE records SET replaced_by = ? WHERE id = ?", [new_id, old.id])

    async def archive(self, record_id: str, reason: str, at: str) -> bool:
        changed = await self._exec(
            "UPDATE records SET archived_at = ?, archived_reason = ? "
            "WHERE id = ? AND archived_at IS NULL",
            [at, reason, record_id],
        )
        return changed > 0

    async def add_conflict(
        self, scope_key: str, record_id: str, other_id: str, reason: str, at: str
    ) -> int:
        cursor = await self._conn.execute(
            "INSERT INTO conflicts (scope_key, record_id, other_id, reason, created_at) "
            "VALUES (?, ?, ?, ?, ?)",
            [scope_key, record_id, other_id, reason, at],
        )
        return int(cursor.lastrowid or 0)

    async def import_conflict(self, conflict: Conflict) -> bool:
        """Insert an exported conflict unless the same one is already there."""
        exists = await self._fetch(
            "SELECT 1 FROM conflicts WHERE record_id = ? AND other_id = ? AND created_at = ?",
            [conflict.record_id, conflict.other_id, conflict.created_at],
        )
        if exists:
            return False
        await self._exec(
            "INSERT INTO conflicts (scope_key, record_id, other_id, reason, created_at, "
            "resolved_at, resolution) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                conflict.scope_key,
                conflict.record_id,
                conflict.other_id,
                conflict.reason,
                conflict.created_at,
                conflict.resolved_at,
                conflict.resolution,
            ],
        )
        return True

    async def insert_raw(self, record: Record) -> bool:
        """Insert an exported record exactly as it was; False if its id exists."""
        exists = await self._fetch("SELECT 1 FROM records WHERE id = ?", [record.id])
        if exists:
            return False
        await self._exec(_INSERT, _record_params(record))
        return True

    async def get(self, record_id: str) -> Record | None:
        """A record as this transaction sees it."""
        rows = await self._fetch(f"SELECT {_SELECT} FROM records r WHERE r.id = ?", [record_id])
        return _record(rows[0]) if rows else None

    async def update_merged(self, record: Record, at: str) -> bool:
        """Write what a fold into a current record changed (``write.absorb``)."""
        columns = derived(record)
        changed = await self._exec(
            "UPDATE records SET merged_from = ?, merged_text = ?, fold_count = ?, "
            "access_count = ?, last_access_at = ?, supersedes = ?, pinned = ?, tags = ?, "
            "importance = ?, meta = ?, updated_at = ? WHERE id = ? AND live = 1",
            [
                json.dumps([m.to_json() for m in record.merged_from], ensure_ascii=False),
                columns.merged_text,
                record.fold_count,
                record.access_count,
                record.last_access_at,
                json.dumps(record.supersedes),
                int(record.pinned),
                json.dumps(record.tags, ensure_ascii=False),
                record.importance,
                json.dumps(record.meta, ensure_ascii=False),
                at,
                record.id,
            ],
        )
        return changed > 0

    async def set_content(self, record: Record, at: str) -> bool:
        """Replace a current record's text (a refined merge); its vectors must be redone."""
        columns = derived(record)
        changed = await self._exec(
            "UPDATE records SET content = ?, content_hash = ?, emphasis = ?, meta = ?, "
            "updated_at = ? WHERE id = ? AND live = 1",
            [
                record.content,
                columns.content_hash,
                columns.emphasis,
                json.dumps(record.meta, ensure_ascii=False),
                at,
                record.id,
            ],
        )
        if changed:
            await self.drop_vectors(record.id)
        return changed > 0

    async def rewrite_texts(self, record: Record) -> bool:
        """Replace a record's texts, current or not (the secrets re-scan): its content,
        folded texts and meta. Triggers redo its full-text row; a current record's
        vectors are dropped, since they were made from the old texts, and re-embedding
        makes them again. ``updated_at`` stays: the memory says what it said."""
        columns = derived(record)
        changed = await self._exec(
            "UPDATE records SET content = ?, content_hash = ?, emphasis = ?, merged_from = ?, "
            "merged_text = ?, meta = ? WHERE id = ?",
            [
                record.content,
                columns.content_hash,
                columns.emphasis,
                json.dumps([m.to_json() for m in record.merged_from], ensure_ascii=False),
                columns.merged_text,
                json.dumps(record.meta, ensure_ascii=False),
                record.id,
            ],
        )
        if changed:
            await self.drop_vectors(record.id)
        return changed > 0

    async def drop_vectors(self, record_id: str) -> None:
        """Remove a record's vectors: it awaits embedding again (re-embed redoes them)."""
        slot = await self._slot(record_id)
        if slot is None or not slot.embedder or not slot.vec_rows:
            return
        await self._store._delete_vectors(self._conn, slot.embedder, slot.seq, slot.vec_rows)
        self._touched.add(slot.seq)
        await self._exec(
            "UPDATE records SET embedder = NULL, vec_rows = 0 WHERE seq = ?", [slot.seq]
        )

    async def restore(self, record_id: str, at: str) -> Record | None:
        """Make an archived record current again, exactly as it was; None if not archived.

        A record archived by a fold also leaves the ``merged_from`` of the record
        that absorbed it (followed to the current one), whose vectors are then
        redone without the restored texts. A restore counts as activity in the
        record's project (so staleness does not archive it again at once).
        """
        record = await self.get(record_id)
        if record is None or record.archived_at is None:
            return None
        folded = record.archived_reason == "folded" and record.replaced_by is not None
        if folded:
            await self._unfold(record, at)
        await self._exec(
            "UPDATE records SET archived_at = NULL, archived_reason = NULL, "
            "replaced_by = CASE WHEN ? THEN NULL ELSE replaced_by END WHERE id = ?",
            [int(folded), record_id],
        )
        await self.touch(record.scope_key, at)
        return await self.get(record_id)

    async def touch(self, scope_key: str, at: str) -> None:
        """Note activity in a scope that leaves no trace in its records (a restore)."""
        await self._exec(
            "INSERT INTO scope_activity (scope_key, last_at) VALUES (?, ?) "
            "ON CONFLICT (scope_key) DO UPDATE SET last_at = max(last_at, excluded.last_at)",
            [scope_key, at],
        )

    async def _unfold(self, record: Record, at: str) -> None:
        """Take a folded record's texts out of the current record that holds them.

        The holder loses the entry of the record and the entries the record had
        absorbed itself, and the folds and accesses they brought; tags and
        importance it took over stay.
        """
        holder_id = record.replaced_by
        seen: set[str] = set()
        while holder_id is not None and holder_id not in seen:
            seen.add(holder_id)
            holder = await self.get(holder_id)
            if holder is None:
                return
            if holder.current:
                gone = {record.id, *(m.id for m in record.merged_from)}
                kept = [m for m in holder.merged_from if m.id not in gone]
                if len(kept) != len(holder.merged_from):
                    holder.merged_from = kept
                    holder.fold_count = max(0, holder.fold_count - record.fold_count - 1)
                    holder.access_count = max(0, holder.access_count - record.access_count)
                    await self.update_merged(holder, at)
                    await self.drop_vectors(holder.id)
                return
            holder_id = holder.replaced_by

    async def purge(self, record_ids: Sequence[str], archived_before: str, at: str) -> int:
        """Hard-delete archived records archived before a time, with their history.

        The only hard delete there is (the purge task). Triggers remove the full-text
        rows; archived records have no vectors left. The history of a purged record
        (what it superseded) goes with it, except that of a folded record, which
        moves to the record that absorbed it (its ``supersedes`` lists it already).
        Open conflicts that lose a record close as ``purged``.
        """
        if not record_ids:
            return 0
        rows = await self._fetch(
            "SELECT id, archived_reason, replaced_by FROM records "
            f"WHERE id IN ({_marks(record_ids)}) AND archived_at IS NOT NULL AND archived_at < ?",
            [*record_ids, archived_before],
        )
        ids = [str(row[0]) for row in rows]
        if not ids:
            return 0
        heirs = {str(i): str(r) for i, why, r in rows if why == "folded" and r is not None}
        if heirs:  # one pass over the records: replaced_by has no index
            cases = " ".join("WHEN ? THEN ?" for _ in heirs)
            await self._exec(
                f"UPDATE records SET replaced_by = CASE replaced_by {cases} END "
                f"WHERE replaced_by IN ({_marks(heirs)}) AND archived_at IS NULL",
                [*(x for pair in heirs.items() for x in pair), *heirs],
            )
        doomed = [i for i in ids if i not in heirs]
        history: list[str] = []
        frontier = doomed
        while frontier:  # history of history: a chain of supersedes
            found = await self._fetch(
                f"SELECT id FROM records WHERE replaced_by IN ({_marks(frontier)}) "
                "AND archived_at IS NULL",
                frontier,
            )
            frontier = [str(row[0]) for row in found if str(row[0]) not in history]
            history.extend(frontier)
        gone = [*ids, *history]
        deleted = 0
        for start in range(0, len(gone), 500):
            chunk = gone[start : start + 500]
            deleted += await self._exec(f"DELETE FROM records WHERE id IN ({_marks(chunk)})", chunk)
        await self._exec(
            "UPDATE conflicts SET resolved_at = ?, resolution = 'purged' WHERE resolved_at IS NULL "
            "AND (NOT EXISTS (SELECT 1 FROM records WHERE id = conflicts.record_id) "
            "OR NOT EXISTS (SELECT 1 FROM records WHERE id = conflicts.other_id))",
            [at],
        )
        return deleted

    async def resolve_conflict(self, conflict_id: int, resolution: str, at: str) -> bool:
        changed = await self._exec(
            "UPDATE conflicts SET resolved_at = ?, resolution = ? "
            "WHERE id = ? AND resolved_at IS NULL",
            [at, resolution, conflict_id],
        )
        return changed > 0

    async def claim(
        self, task: str, holder: str, now: str, until: str, cursor: dict[str, Any] | None = None
    ) -> bool:
        """Take, keep or renew ``task``'s lease until ``until``; False if another holds it.

        A lease whose time is past is free. ``cursor`` saves where the task is.
        """
        await self._exec("INSERT OR IGNORE INTO maintenance (task) VALUES (?)", [task])
        changed = await self._exec(
            "UPDATE maintenance SET holder = ?, lease_until = ?, cursor = coalesce(?, cursor) "
            "WHERE task = ? AND (holder IS NULL OR holder = ? OR lease_until IS NULL "
            "OR lease_until < ?)",
            [holder, until, None if cursor is None else json.dumps(cursor), task, holder, now],
        )
        return changed > 0

    async def release(self, task: str, holder: str) -> None:
        """Give a task's lease back without recording a run."""
        await self._exec(
            "UPDATE maintenance SET holder = NULL, lease_until = NULL "
            "WHERE task = ? AND holder = ?",
            [task, holder],
        )

    async def finish(self, state: TaskState, holder: str) -> bool:
        """Record a run of a task and give its lease back; False if the lease was lost."""
        changed = await self._exec(
            "UPDATE maintenance SET holder = NULL, lease_until = NULL, last_started_at = ?, "
            "last_finished_at = ?, last_summary = ?, last_error = ?, failures = ?, "
            "retry_after = ?, cursor = ? WHERE task = ? AND holder = ?",
            [
                state.last_started_at,
                state.last_finished_at,
                json.dumps(state.last_summary),
                state.last_error,
                state.failures,
                state.retry_after,
                json.dumps(state.cursor),
                state.task,
                holder,
            ],
        )
        return changed > 0


async def _log_change(conn: aiosqlite.Connection, embedder: str, seq: int) -> None:
    """Note that record ``seq``'s vectors changed, for the in-memory copies (``dense``)."""
    from memory_mcp.storage.dense import KEEP_CHANGES

    cursor = await conn.execute(
        "INSERT INTO vector_changes (embedder, seq) VALUES (?, ?)", [embedder, seq]
    )
    last = cursor.lastrowid or 0
    if last % 1000 == 0:
        await conn.execute("DELETE FROM vector_changes WHERE id <= ?", [last - KEEP_CHANGES])


def _storage_error(exc: Exception) -> StorageError:
    text = str(exc)
    if "locked" in text or "busy" in text:
        return StorageError(_BUSY_HINT)
    if "full" in text:
        return StorageError(
            "the disk is full (or the database reached its size limit); nothing was written. "
            "Free some space and try again"
        )
    if "readonly" in text or "read-only" in text:
        return StorageError(
            "the database is read-only (file or folder permissions, or a read-only disk); "
            "nothing was written. Searches still work"
        )
    return StorageError(f"database error: {text}")


class SqliteStore:
    """The default store."""

    def __init__(
        self,
        path: Path,
        driver: Driver,
        writer: aiosqlite.Connection,
        reader: aiosqlite.Connection,
        *,
        vector_copy: bool = True,
        busy_timeout_ms: int = 15000,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.path = path
        self.driver = driver
        self.busy_timeout_ms = busy_timeout_ms
        self._clock = clock
        self._writer = writer
        self._reader = reader
        self._write_lock = anyio.Lock()
        self._queries = _Queries(reader, self)
        self._tables: dict[str, str] = {}
        self._copies: dict[str, DenseIndex] = {}  # by vector table
        self._vocab_ready = False  # the reader has temp.records_vocab
        self._counts: dict[str, tuple[int, float]] = {}  # stem -> (records, when read)
        self._copy_off = "" if vector_copy else "turned off"

    @classmethod
    async def open(
        cls,
        path: Path,
        *,
        driver: DriverName | Driver = "auto",
        busy_timeout_ms: int = 15000,
        vector_copy: bool = True,
        clock: Callable[[], datetime] = utcnow,
    ) -> SqliteStore:
        """Open (creating and migrating as needed) the database at ``path``.

        ``vector_copy=False`` answers vector searches through vec0 alone,
        without the in-memory copy of the vector tables (``dense``). ``clock`` is
        the store's time (``now``): the database is a file on this machine, so its
        clock is this machine's (tests give a fake one).

        Raises:
            StorageError: the file cannot be created, opened or migrated.
        """
        chosen = driver if isinstance(driver, Driver) else await _driver(driver)
        await anyio.to_thread.run_sync(_prepare_file, path, chosen, busy_timeout_ms)

        def connector() -> sqlite3.Connection:
            conn = chosen.connect(str(path), busy_timeout_ms=busy_timeout_ms)
            conn.execute("PRAGMA synchronous = NORMAL")
            return conn

        writer = await aiosqlite.Connection(connector, iter_chunk_size=256)
        reader = await aiosqlite.Connection(connector, iter_chunk_size=256)
        return cls(
            path,
            chosen,
            writer,
            reader,
            vector_copy=vector_copy,
            busy_timeout_ms=busy_timeout_ms,
            clock=clock,
        )

    @property
    def backend(self) -> str:
        return "sqlite"

    @property
    def location(self) -> str:
        return str(self.path)

    @property
    def details(self) -> str:
        return self.driver.describe()

    @property
    def vector_copy(self) -> str:
        """How vector searches run: on the in-memory copy (and its size) or through vec0."""
        if self._copy_off:
            return f"through vec0 ({self._copy_off})"
        return f"in-memory copy, {self.vector_copy_bytes / 1e6:.1f} MB loaded"

    @property
    def vector_copy_bytes(self) -> int:
        """The memory the in-memory copy of the vectors holds now."""
        return sum(i.nbytes for i in self._copies.values())

    @property
    def vectors_available(self) -> bool:
        return self.driver.vectors

    async def close(self) -> None:
        with anyio.CancelScope(shield=True):
            await self._writer.close()
            await self._reader.close()

    @asynccontextmanager
    async def write(self) -> AsyncIterator[_Transaction]:
        """A write transaction holding the database's write lock (all processes)."""
        async with self._write_lock:
            try:
                await self._writer.execute("BEGIN IMMEDIATE")
            except OPERATIONAL_ERRORS as exc:
                raise _storage_error(exc) from exc
            pending = dict(self._tables)
            try:
                yield _Transaction(self._writer, self)
                await self._sweep_retired(self._writer)
            except BaseException as exc:
                with anyio.CancelScope(shield=True):
                    if self._writer.in_transaction:  # SQLite may have rolled back already
                        await self._writer.execute("ROLLBACK")
                self._tables = pending
                if isinstance(exc, OPERATIONAL_ERRORS):  # from outside _exec (executemany)
                    raise _storage_error(exc) from exc
                raise
            try:
                with anyio.CancelScope(shield=True):
                    await self._writer.execute("COMMIT")
            except OPERATIONAL_ERRORS as exc:
                with anyio.CancelScope(shield=True):
                    await self._writer.execute("ROLLBACK")
                self._tables = pending
                raise _storage_error(exc) from exc

    # Reads ---------------------------------------------------------------------------

    async def lexical(
        self, text: str, filters: Filters, k: int, *, rare_words: bool = False
    ) -> list[Scored]:
        return await self._queries.lexical(text, filters, k, rare_words=rare_words)

    async def nearest(
        self, vector: Vector, embedder: str, filters: Filters, k: int
    ) -> list[Scored]:
        return await self._queries.nearest(vector, embedder, filters, k)

    async def dense_scores(
        self, vector: Vector, embedder: str, record_ids: Sequence[str]
    ) -> dict[str, float]:
        return await self._queries.dense_scores(vector, embedder, record_ids)

    async def in_conversation(
        self, record_ids: Sequence[str], within_seconds: float, embedder: str
    ) -> dict[str, Around]:
        return await self._queries.in_conversation(record_ids, within_seconds, embedder)

    async def current(self, filters: Filters, limit: int) -> list[Record]:
        return await self._queries.current(filters, limit)

    async def top_by_prior(
        self, filters: Filters, ranking: RankerConfig, now: datetime, limit: int
    ) -> list[tuple[Record, float]]:
        """Current records by ``ranker.prior`` (``_prior_sql``), highest first, with it."""
        order_sql, params = _prior_sql(ranking, now)
        where, where_params = _where(filters)
        # Rank on (seq, value) alone, then read the few winners whole: sorting whole
        # rows would copy every record's text and JSON into the sorter.
        rows = await self._queries._fetch(
            f"SELECT {_SELECT}, t.o FROM (SELECT r.seq AS seq, r.id AS id, {order_sql} AS o "
            f"FROM records r WHERE {where} ORDER BY o DESC, r.id LIMIT ? OFFSET ?) t "
            "JOIN records r ON r.seq = t.seq ORDER BY t.o DESC, t.id",
            [*params, *where_params, limit, 0],
        )
        return [(_record(row), float(row[-1])) for row in rows]

    async def get(self, record_id: str) -> Record | None:
        found = await self.get_many([record_id])
        return found[0] if found else None

    async def get_many(self, record_ids: Sequence[str]) -> list[Record]:
        if not record_ids:
            return []
        rows = await self._queries._fetch(
            f"SELECT {_SELECT} FROM records r WHERE r.id IN ({_marks(record_ids)})",
            list(record_ids),
        )
        by_id = {row[0]: _record(row) for row in rows}
        return [by_id[i] for i in record_ids if i in by_id]

    async def record_access(self, record_ids: Sequence[str], at: str) -> None:
        """Count returned hits as accesses (ranking and staleness read these)."""
        if not record_ids:
            return
        async with self.write() as tx:
            await tx._exec(
                "UPDATE records SET access_count = access_count + 1, last_access_at = ? "
                f"WHERE id IN ({_marks(record_ids)})",
                [at, *record_ids],
            )

    async def needing_embedding(self, embedder: str, limit: int) -> list[Record]:
        """Current records whose vectors are missing or from another embedder, oldest first."""
        rows = await self._queries._fetch(
            f"SELECT {_SELECT}, r.seq FROM records r "
            "WHERE r.live = 1 AND (r.embedder IS NULL OR r.embedder != ?) "
            "ORDER BY r.seq LIMIT ?",
            [embedder, limit],
        )
        return [_record(row) for row in rows]

    async def count_needing_embedding(self, embedder: str | None) -> int:
        if embedder is None:
            return 0
        rows = await self._queries._fetch(
            "SELECT count(*) FROM records WHERE live = 1 AND (embedder IS NULL OR embedder != ?)",
            [embedder],
        )
        return int(rows[0][0])

    async def dense_embedders(self) -> dict[str, int]:
        """Embedders that have vectors in this store, with their record counts."""
        rows = await self._queries._fetch(
            "SELECT embedder, count(*) FROM records WHERE embedder IS NOT NULL GROUP BY embedder"
        )
        return {str(name): int(n) for name, n in rows}

    async def iter_records(self, *, batch: int = 500) -> AsyncIterator[Record]:
        """Every record, archived and history included, in write order."""
        after = 0
        while True:
            rows = await self._queries._fetch(
                f"SELECT {_SELECT}, r.seq FROM records r WHERE r.seq > ? ORDER BY r.seq LIMIT ?",
                [after, batch],
            )
            if not rows:
                return
            for row in rows:
                yield _record(row)
            after = int(rows[-1][-1])

    async def conflicts(self, *, open_only: bool = False) -> list[Conflict]:
        """Conflicts, oldest first (only unresolved ones if asked)."""
        where = "resolved_at IS NULL" if open_only else "1"
        return await self._conflicts(where, [])

    async def open_conflicts_of(self, record_ids: Sequence[str]) -> list[Conflict]:
        """The open conflicts that any of ``record_ids`` is part of, oldest first."""
        if not record_ids:
            return []
        marks = _marks(record_ids)
        where = f"resolved_at IS NULL AND (record_id IN ({marks}) OR other_id IN ({marks}))"
        return await self._conflicts(where, [*record_ids, *record_ids])

    async def conflict(self, conflict_id: int) -> Conflict | None:
        found = await self._conflicts("id = ?", [conflict_id])
        return found[0] if found else None

    async def _conflicts(self, where: str, params: Sequence[Any]) -> list[Conflict]:
        rows = await self._queries._fetch(
            "SELECT id, scope_key, record_id, other_id, reason, created_at, resolved_at, "
            f"resolution FROM conflicts WHERE {where} ORDER BY id",
            params,
        )
        return [Conflict(*row) for row in rows]

    async def archived(
        self,
        scope_keys: Sequence[str] = (),
        *,
        reason: str | None = None,
        before: str | None = None,
        limit: int = 100,
    ) -> list[Record]:
        """Archived records, most recently archived first.

        Args:
            scope_keys: only these scopes (all when empty).
            reason: only those archived for this reason.
            before: only those archived before this time.
        """
        clauses: list[str] = ["r.archived_at IS NOT NULL"]
        params: list[Any] = []
        if scope_keys:
            clauses.append(f"r.scope_key IN ({_marks(scope_keys)})")
            params.extend(scope_keys)
        if reason is not None:
            clauses.append("r.archived_reason = ?")
            params.append(reason)
        if before is not None:
            clauses.append("r.archived_at < ?")
            params.append(before)
        rows = await self._queries._fetch(
            f"SELECT {_SELECT} FROM records r WHERE {' AND '.join(clauses)} "
            "ORDER BY r.archived_at DESC, r.seq DESC LIMIT ?",
            [*params, limit],
        )
        return [_record(row) for row in rows]

    async def project_activity(self) -> dict[str, str]:
        """Each project scope's last activity: its newest write, access or restore.

        Maintenance's own work does not count: insights are left out, and
        archiving changes neither time.
        """
        rows = await self._queries._fetch(
            "SELECT scope_key, max(max(created_at, coalesce(last_access_at, ''))) FROM records "
            "WHERE scope = 'project' AND corpus != 'insights' GROUP BY scope_key"
        )
        last = {str(key): str(at) for key, at in rows}
        for key, at in await self._queries._fetch("SELECT scope_key, last_at FROM scope_activity"):
            if str(key) in last:
                last[str(key)] = max(last[str(key)], str(at))
        return last

    async def unused_facts(self, scope_key: str, created_before: str, limit: int) -> list[Record]:
        """Current facts of a scope never returned by a search, older than a time, not pinned."""
        rows = await self._queries._fetch(
            f"SELECT {_SELECT} FROM records r WHERE r.scope_key = ? AND r.corpus = 'facts' "
            "AND r.live = 1 AND r.access_count = 0 AND r.pinned = 0 AND r.created_at < ? "
            "ORDER BY r.seq LIMIT ?",
            [scope_key, created_before, limit],
        )
        return [_record(row) for row in rows]

    async def unarchived(self, scope_key: str, limit: int) -> list[str]:
        """Ids of a scope's records not archived (current ones and history)."""
        rows = await self._queries._fetch(
            "SELECT id FROM records WHERE scope_key = ? AND archived_at IS NULL "
            "ORDER BY seq LIMIT ?",
            [scope_key, limit],
        )
        return [str(row[0]) for row in rows]

    async def count_unarchived(self, scope_key: str) -> int:
        rows = await self._queries._fetch(
            "SELECT count(*) FROM records WHERE scope_key = ? AND archived_at IS NULL",
            [scope_key],
        )
        return int(rows[0][0])

    async def scope_keys(self) -> list[str]:
        """Every scope key that has current records."""
        rows = await self._queries._fetch(
            "SELECT DISTINCT scope_key FROM records WHERE live = 1 ORDER BY scope_key"
        )
        return [str(row[0]) for row in rows]

    async def after(
        self,
        corpora: Sequence[str],
        position: Position | None,
        limit: int,
        *,
        current_only: bool = True,
    ) -> list[tuple[Position, Record]]:
        """Records of ``corpora`` past a write position, of every scope, in write order:
        the current ones, or (``current_only`` False) history and archived ones too.
        A position is a record's ``seq``, as text."""
        live = "AND r.live = 1 " if current_only else ""
        rows = await self._queries._fetch(
            f"SELECT {_SELECT}, r.seq FROM records r WHERE r.seq > ? {live}"
            f"AND r.corpus IN ({_marks(corpora)}) ORDER BY r.seq LIMIT ?",
            [_seq(position), *corpora, limit],
        )
        return [(str(row[-1]), _record(row)) for row in rows]

    async def count_after(self, corpora: Sequence[str], position: Position | None) -> int:
        rows = await self._queries._fetch(
            f"SELECT count(*) FROM records WHERE seq > ? AND live = 1 "
            f"AND corpus IN ({_marks(corpora)})",
            [_seq(position), *corpora],
        )
        return int(rows[0][0])

    async def conflict_between(self, a: str, b: str) -> bool:
        """Whether two records were ever flagged as a conflict (open or resolved)."""
        rows = await self._queries._fetch(
            "SELECT 1 FROM conflicts WHERE (record_id = ? AND other_id = ?) "
            "OR (record_id = ? AND other_id = ?) LIMIT 1",
            [a, b, b, a],
        )
        return bool(rows)

    async def vectors_of(self, record_id: str, embedder: str) -> Vector | None:
        """A current record's passage vectors from ``embedder`` (whole text first), if any."""
        import numpy as np

        rows = await self._queries._fetch(
            "SELECT seq, vec_rows FROM records WHERE id = ? AND +embedder = ? AND vec_rows > 0",
            [record_id, embedder],
        )
        table = self._tables.get(embedder) or await self._vector_table(self._reader, embedder)
        if not rows or table is None:
            return None
        seq, count = int(rows[0][0]), int(rows[0][1])
        found = await self._queries._vectors_vec0(table, _rowids(seq, count))
        if not found:
            return None
        return np.stack(list(found.values()))

    async def tasks(self) -> dict[str, TaskState]:
        """Every maintenance task's state, by name."""
        rows = await self._queries._fetch(
            "SELECT task, holder, lease_until, last_started_at, last_finished_at, last_summary, "
            "last_error, failures, retry_after, cursor FROM maintenance ORDER BY task"
        )
        return {
            str(row[0]): TaskState(
                task=str(row[0]),
                holder=row[1],
                lease_until=row[2],
                last_started_at=row[3],
                last_finished_at=row[4],
                last_summary=json.loads(row[5]),
                last_error=row[6],
                failures=int(row[7]),
                retry_after=row[8],
                cursor=json.loads(row[9]),
            )
            for row in rows
        }

    async def now(self) -> datetime:
        """The store's time: SQLite runs in this process, on this machine's clock."""
        return self._clock()

    async def doctor(self, *, repair: bool = False) -> Diagnosis:
        from memory_mcp.storage.doctor import diagnose

        return await diagnose(self, repair=repair)

    async def backup(self, target: Path, *, force: bool = False) -> Path:
        from memory_mcp.storage.doctor import backup

        return await backup(self, target, force=force)

    @asynccontextmanager
    async def scratch_copy(self) -> AsyncIterator[SqliteStore]:
        """A copy of the database of this moment in a folder beside it, deleted on exit."""
        folder = Path(
            await anyio.to_thread.run_sync(
                partial(tempfile.mkdtemp, prefix=".dry-run-", dir=self.path.parent)
            )
        )
        try:
            copy = folder / "memory.db"
            await self.copy_to(copy)
            store = await SqliteStore.open(
                copy, driver=self.driver, busy_timeout_ms=self.busy_timeout_ms, clock=self._clock
            )
            try:
                yield store
            finally:
                await store.close()
        finally:
            await anyio.to_thread.run_sync(shutil.rmtree, folder)

    async def copy_to(self, target: Path) -> None:
        """A consistent copy of the database at ``target`` (SQLite's online backup).

        Writers go on meanwhile; the copy is the state of one moment.
        """

        connect = partial(self.driver.connect, busy_timeout_ms=15000)
        await anyio.to_thread.run_sync(copy_database, self.path, target, connect)

    async def stats(self) -> StoreStats:
        stats = StoreStats()
        rows = await self._queries._fetch(
            "SELECT corpus, scope, CASE WHEN archived_at IS NOT NULL THEN 'archived' "
            "WHEN replaced_by IS NOT NULL THEN 'history' ELSE 'current' END AS state, count(*) "
            "FROM records GROUP BY corpus, scope, state"
        )
        stats.records = {(c, s, st): int(n) for c, s, st, n in rows}
        stats.embedders = await self.dense_embedders()
        for table, embedder, dim in await self._queries._fetch(
            "SELECT table_name, embedder, dim FROM vector_indexes ORDER BY table_name"
        ):
            if not _TABLE_NAME.match(table):
                continue
            count = await self._queries._fetch(f"SELECT count(*) FROM {table}")
            stats.vector_indexes.append((table, embedder, int(dim), int(count[0][0])))
        conflicts = await self._queries._fetch(
            "SELECT count(*) FROM conflicts WHERE resolved_at IS NULL"
        )
        stats.open_conflicts = int(conflicts[0][0])
        stats.database_bytes = sum(
            p.stat().st_size
            for p in (self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm"))
            if p.exists()
        )
        return stats

    def forget_word_counts(self) -> None:
        """Drop the cached record counts of words (the write path's rare words)."""
        self._counts.clear()

    async def _document_counts(self, stems: set[str]) -> dict[str, int]:
        """How many committed records hold each stem FTS5 knows (cached a while).

        Read on the reader connection, which is never inside a transaction that
        could roll its temporary vocabulary table back; fts5vocab counts by
        reading a word's postings, hence the cache.
        """
        now = time.monotonic()
        stale = now - _COUNTS_TTL
        missing = [s for s in stems if self._counts.get(s, (0, stale - 1))[1] < stale]
        if missing:
            if not self._vocab_ready:
                await self._reader.execute(
                    "CREATE VIRTUAL TABLE IF NOT EXISTS temp.records_vocab "
                    "USING fts5vocab(main, records_fts, row)"
                )
                self._vocab_ready = True
            rows = await self._queries._fetch(
                f"SELECT term, doc FROM temp.records_vocab WHERE term IN ({_marks(missing)})",
                missing,
            )
            found = {str(term): int(doc) for term, doc in rows}
            if len(self._counts) > _COUNTS_MAX:
                self._counts.clear()
            for s in missing:
                self._counts[s] = (found.get(s, 0), now)
        return {s: self._counts[s][0] for s in stems if self._counts[s][0] > 0}

    # Vector tables -------------------------------------------------------------------

    async def _copy(self, table: str, embedder: str) -> DenseIndex | None:
        """The in-memory copy of a vector table the reader can see, if copies are on."""
        from memory_mcp.storage.dense import DenseIndex

        if self._copy_off:
            return None
        index = self._copies.get(table)
        if index is None:
            dims = await self._queries._fetch(
                "SELECT dim FROM vector_indexes WHERE table_name = ?", [table]
            )
            if not dims:  # created by a transaction that has not committed yet
                return None
            # setdefault: another search may have made it while this one waited
            index = self._copies.setdefault(table, DenseIndex(table, embedder, int(dims[0][0])))
        return index

    async def _prepared(self, index: DenseIndex, scope_keys: Collection[str]) -> bool:
        """Bring ``index`` up to date for these scopes (hold its lock); False: copies are off."""
        from memory_mcp.storage.dense import LayoutError, Moved

        try:
            await index.prepare(self._queries._fetch, scope_keys)
        except LayoutError as exc:
            log.warning("searching vectors through vec0, without an in-memory copy: %s", exc)
            self._copy_off = str(exc)
            self._copies.clear()
            return False
        except Moved as exc:
            log.info("a scope changed while its vectors loaded (%s); searching through vec0", exc)
            return False
        return True

    async def load_vectors(self, embedder: str, scope_keys: Collection[str]) -> None:
        """Bring the in-memory copy of these scopes' vectors up to date (a no-op without one).

        A store calls this before its write transaction, so that loading a
        scope (0.35 s at 50,000 memories) does not hold every process's writes.
        """
        table = await self._vector_table(self._reader, embedder)
        if table is not None:
            async with self._ready_copy(table, embedder, scope_keys):
                pass

    @asynccontextmanager
    async def _ready_copy(
        self, table: str, embedder: str, scope_keys: Collection[str]
    ) -> AsyncIterator[DenseIndex | None]:
        """The copy of ``table``, current for these scopes and locked; None: use vec0."""
        index = await self._copy(table, embedder)
        if index is None:
            yield None
            return
        async with index.lock:
            yield index if await self._prepared(index, scope_keys) else None

    async def _rank(
        self, table: str, embedder: str, vector: Vector, filters: Filters
    ) -> tuple[npt.NDArray[np.int64], Vector] | None:
        """Every row of the filters' scopes, corpora and kinds with its cosine (None: no copy)."""
        async with self._ready_copy(table, embedder, filters.scope_keys) as index:
            if index is None:
                return None
            return await anyio.to_thread.run_sync(
                index.rank, vector, filters.scope_keys, filters.corpora, filters.kinds
            )

    async def _cosines(
        self,
        table: str,
        embedder: str,
        vector: Vector,
        scope_keys: Collection[str],
        rowids: Sequence[int],
    ) -> dict[int, float]:
        """The cosine of each of these rows the in-memory copy holds."""
        async with self._ready_copy(table, embedder, scope_keys) as index:
            return {} if index is None else index.cosines_of(vector, rowids)

    async def _vectors(
        self, table: str, rowids: Sequence[int]
    ) -> tuple[npt.NDArray[np.int64], Vector]:
        """These rows as the in-memory copy holds them: rowids in order, and vectors.

        The copy is read as it is, not first brought up to date: the rows asked
        for are those of records a search has just found through it, and a row
        it does not hold is read from vec0 by the caller.
        """
        import numpy as np

        index = self._copies.get(table) if not self._copy_off else None
        if index is None:
            return np.zeros(0, np.int64), np.zeros((0, 0), np.float32)
        async with index.lock:
            return index.vectors_of(rowids)

    async def _delete_vectors(
        self, conn: aiosqlite.Connection, embedder: str, seq: int, count: int
    ) -> None:
        """Delete a record's passage vectors, one rowid at a time (vec0's only fast delete)."""
        table = await self._vector_table(conn, embedder)
        if table is None or count <= 0:
            return
        await conn.executemany(
            f"DELETE FROM {table} WHERE rowid = ?", [(r,) for r in _rowids(seq, count)]
        )
        await _log_change(conn, embedder, seq)

    async def _sweep_retired(self, conn: aiosqlite.Connection) -> None:
        """Delete the vectors the retire triggers queued in this transaction."""
        queued = list(
            await conn.execute_fetchall("SELECT seq, embedder, vec_rows FROM retired_vectors")
        )
        if not queued:
            return
        for seq, embedder, count in queued:
            await self._delete_vectors(conn, str(embedder), int(seq), int(count))
        await conn.execute("DELETE FROM retired_vectors")

    async def _vector_table(
        self, conn: aiosqlite.Connection, embedder: str, *, dim: int | None = None
    ) -> str | None:
        """The vec0 table of ``embedder``; created (in the caller's transaction) if ``dim``."""
        if not self.driver.vectors:
            return None
        cached = self._tables.get(embedder)
        if cached is not None:
            return cached
        rows = list(
            await conn.execute_fetchall(
                "SELECT table_name, dim FROM vector_indexes WHERE embedder = ?", [embedder]
            )
        )
        if rows:
            table, existing_dim = str(rows[0][0]), int(rows[0][1])
            if dim is not None and dim != existing_dim:
                raise StorageError(
                    f"embedder {embedder} returned {dim}-dimensional vectors, but its index "
                    f"holds {existing_dim}; give a changed model a new name"
                )
            self._tables[embedder] = table
            return table
        if dim is None:
            return None
        number = list(
            await conn.execute_fetchall(
                "SELECT coalesce(max(CAST(substr(table_name, 5) AS INTEGER)), 0) + 1 "
                "FROM vector_indexes"
            )
        )
        table = f"vec_{int(number[0][0])}"
        await conn.execute(
            f"CREATE VIRTUAL TABLE {table} USING vec0("
            "scope_key TEXT PARTITION KEY, corpus TEXT, kind TEXT, "
            f"embedding FLOAT[{dim}] distance_metric=cosine)"
        )
        await conn.execute(
            "INSERT INTO vector_indexes (table_name, embedder, dim, created_at) "
            "VALUES (?, ?, ?, datetime('now'))",
            [table, embedder, dim],
        )
        self._tables[embedder] = table
        return table


_DRIVERS: dict[str, Driver] = {}


async def _driver(preference: DriverName) -> Driver:
    if preference not in _DRIVERS:
        _DRIVERS[preference] = await anyio.to_thread.run_sync(choose_driver, preference)
    return _DRIVERS[preference]


def _journal_wal(conn: sqlite3.Connection, busy_timeout_ms: int) -> str:
    """Switch to WAL, retrying while another process holds the lock.

    SQLite can answer "database is locked" to this pragma at once, without its
    busy handler, when several processes open a new database together.
    """
    deadline = time.monotonic() + busy_timeout_ms / 1000
    while True:
        try:
            return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        except OPERATIONAL_ERRORS as exc:
            locked = "locked" in str(exc) or "busy" in str(exc)
            if not locked or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _prepare_file(path: Path, driver: Driver, busy_timeout_ms: int) -> None:
    """Create the directory and file owner-only, switch to WAL, and migrate."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.close(fd)
    except FileExistsError:
        pass
    except OSError as exc:
        raise StorageError(f"cannot create the database at {path}: {exc}") from exc

    def connect(target: str) -> sqlite3.Connection:
        return driver.connect(target, busy_timeout_ms=busy_timeout_ms)

    try:
        conn = connect(str(path))
    except ERRORS as exc:
        raise StorageError(f"cannot open the database at {path}: {exc}") from exc
    try:
        mode = _journal_wal(conn, busy_timeout_ms)
        if str(mode).lower() != "wal":
            log.warning("the database at %s is in %s mode, not WAL", path, mode)
        applied = migrate(conn, db_path=path, connect=connect)
        if applied:
            log.info("applied migrations: %s", ", ".join(applied))
    except DATABASE_ERRORS as exc:
        raise StorageError(f"cannot use the database at {path}: {exc}") from exc
    finally:
        conn.close()
