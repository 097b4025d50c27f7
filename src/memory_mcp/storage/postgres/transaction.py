"""One write transaction: a pooled connection holding the store's write lock."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memory_mcp.passages import MAX_PASSAGES
from memory_mcp.records import Record, merged_text
from memory_mcp.storage.base import IVF_PROBES, Vector
from memory_mcp.storage.bm25 import document_terms, indexed_columns
from memory_mcp.storage.history import unfold
from memory_mcp.storage.postgres.queries import Queries, _unit
from memory_mcp.storage.postgres.sql import probes_sql, storage_error
from memory_mcp.storage.rows import (
    INSERT_COLUMNS,
    INSERT_WIDTH,
    content_params,
    merged_params,
    record_params,
    texts_params,
)
from memory_mcp.storage.statements import SharedWrites

if TYPE_CHECKING:
    import psycopg

    from memory_mcp.storage.postgres.store import PgStore


@dataclass(frozen=True)
class WriteMark:
    """``PgStore.write_mark``: the store, and the database's snapshot then."""

    store: PgStore
    snapshot: str


# Transaction ids begun after a write mark that ``unchanged_since`` looks at, at most.
_XID_WINDOW = 1_000
_UNCHANGED_SQL = """
WITH m AS (SELECT %s::pg_snapshot AS mark, pg_current_snapshot() AS now),
x AS (
    SELECT pg_snapshot_xmax(mark)::text::bigint AS since,
           pg_snapshot_xmax(now)::text::bigint AS upto
    FROM m
)
SELECT CASE WHEN x.upto - x.since > %s OR pg_current_xact_id_if_assigned() IS NOT NULL
THEN false ELSE NOT EXISTS (
    SELECT 1 FROM (
        SELECT pg_snapshot_xip(m.mark) AS xid FROM m
        UNION ALL
        SELECT g::text::xid8 FROM generate_series(x.since, x.upto - 1) g
    ) t WHERE pg_xact_status(t.xid) = 'committed'
) END FROM x
"""


class Transaction(SharedWrites, Queries):
    """The writes, on the connection whose transaction holds the write lock."""

    MARK = "%s"

    def __init__(self, conn: psycopg.AsyncConnection[Any], store: PgStore) -> None:
        self._conn = conn
        self._store = store

    async def unchanged_since(self, mark: object | None) -> bool:
        """Whether no transaction has committed since the snapshot ``mark``
        (``PgStore.write_mark``): none of those it saw running, none begun after it;
        and this one has written nothing yet.

        Asked under the write lock, after every write committed before it. A
        transaction that had committed but was not yet visible when the mark was taken
        is among those it saw running. Any database's transactions count (their ids are
        the cluster's), and past ``_XID_WINDOW`` new ids it is not known (False): the
        reads are made again, as they always were before.
        """
        if not (isinstance(mark, WriteMark) and mark.store is self._store):
            return False
        rows = await self.fetch(_UNCHANGED_SQL, [mark.snapshot, _XID_WINDOW])
        return bool(rows and rows[0][0])

    @property
    def connection(self) -> psycopg.AsyncConnection[Any]:
        """The connection (for statements the store's own helpers do not spell)."""
        return self._conn

    async def fetch(
        self,
        sql: str,
        params: Sequence[Any] = (),
        *,
        binary: bool = False,
        probes: int | None = None,
    ) -> list[Any]:
        """One statement's rows; with ``probes``, ivfflat's for this statement alone."""
        import psycopg

        try:
            if probes is not None:
                await self._conn.execute(probes_sql(probes).encode())
            cursor = await self._conn.cursor(binary=binary).execute(sql.encode(), params)
            rows = await cursor.fetchall() if cursor.description else []
            if probes is not None:
                await self._conn.execute(probes_sql(IVF_PROBES).encode())
            return rows
        except psycopg.Error as exc:
            raise storage_error(exc) from exc

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; how many rows it changed."""
        import psycopg

        try:
            cursor = await self._conn.execute(sql.encode(), params)
        except psycopg.Error as exc:
            raise storage_error(exc) from exc
        return cursor.rowcount

    async def make_index(self, statements: Sequence[str]) -> bool:
        """Run the statements that (re)build an index; False (the transaction going on
        without any of them) when this role may not: a team member's role is not the
        tables' owner (``team init``)."""
        import psycopg
        from psycopg import errors

        try:
            async with self._conn.transaction():  # a savepoint
                for sql in statements:
                    await self._conn.execute(sql.encode())
        except errors.InsufficientPrivilege:
            return False
        except psycopg.Error as exc:
            raise storage_error(exc) from exc
        return True

    async def index_text(self, seq: int, content: str, merged: str, tags: Sequence[str]) -> None:
        """Write a record's stems and length for BM25 (``bm25.document_terms``)."""
        length, terms = document_terms(indexed_columns(content, merged, tags))
        await self.execute("DELETE FROM record_terms WHERE seq = %s", [seq])
        if terms:
            await self.execute(
                "INSERT INTO record_terms (term, seq, tf, doc_len) "
                "SELECT t.term, %s, t.tf, %s FROM unnest(%s::text[], %s::float8[]) AS t(term, tf)",
                [seq, length, list(terms), list(terms.values())],
            )
        await self.execute(
            "UPDATE records SET doc_len = %s WHERE seq = %s AND doc_len <> %s",
            [length, seq, length],
        )

    async def _reindex(self, record: Record) -> None:
        rows = await self.fetch(
            "SELECT seq, content, merged_text, tags FROM records WHERE id = %s", [record.id]
        )
        for seq, content, merged, tags in rows:
            await self.index_text(int(seq), str(content), str(merged), json.loads(tags))

    async def _seq(self, record_id: str) -> tuple[int, bool, str | None, int] | None:
        rows = await self.fetch(
            "SELECT seq, live, embedder, vec_rows FROM records WHERE id = %s", [record_id]
        )
        if not rows:
            return None
        seq, live, embedder, vec_rows = rows[0]
        return int(seq), bool(live), embedder, int(vec_rows)

    async def insert(
        self, record: Record, vectors: Vector | None, *, vectors_due: bool = False
    ) -> None:
        """Insert a new record with its passage vectors (one row per passage)."""
        if vectors is None or not record.embedder:
            await self._insert(record, vectors_due=vectors_due)
        elif record.archived_at is not None or record.replaced_by is not None:
            await self._insert(record, vectors_due=vectors_due)  # only current ones are indexed
            await self._put_vectors(record.id, vectors, record.embedder)
        else:
            matrix = _passages(vectors)
            space = await self._store.space(self, record.embedder, dim=int(matrix.shape[1]))
            assert space is not None  # made when missing, given a dimension
            await self._insert(
                record,
                space=space[0],
                vectors=[_unit(row) for row in matrix],
                vectors_due=vectors_due,
            )

    async def _insert(
        self,
        record: Record,
        *,
        space: int = 0,
        vectors: Sequence[Any] = (),
        unless_known: bool = False,
        vectors_due: bool = False,
    ) -> bool:
        """Insert a record, its stems for BM25 (``index_text``) and its passage
        ``vectors`` (in vector space ``space``) in one statement; False if
        ``unless_known`` and its id exists already (nothing is written)."""
        length, terms = document_terms(
            indexed_columns(record.content, merged_text(record), record.tags)
        )
        placeholders = ", ".join(["%s"] * (INSERT_WIDTH + 3))
        sql = (
            f"WITH r AS (INSERT INTO records ({INSERT_COLUMNS}, doc_len, vec_rows, vectors_due) "
            f"VALUES ({placeholders}) {'ON CONFLICT (id) DO NOTHING ' if unless_known else ''}"
            "RETURNING seq), "
            "t AS (INSERT INTO record_terms (term, seq, tf, doc_len, owner) "
            "SELECT t.term, r.seq, t.tf, %s, %s FROM r, "
            "unnest(%s::text[], %s::float8[]) AS t(term, tf))"
        )
        # The index rows say whose they are (m005); the triggers that would read it from
        # the record cannot see a record inserted by the same statement.
        owner = record.user if record.personal else ""
        params = [
            *record_params(record),
            length,
            len(vectors),
            int(vectors_due),
            length,
            owner,
            list(terms),
            list(terms.values()),
        ]
        if vectors:
            sql += (
                ", v AS (INSERT INTO vectors (seq, passage, space, embedding, owner) "
                "SELECT r.seq, x.n - 1, %s, x.e, %s FROM r, "
                "unnest(%s::vector[]) WITH ORDINALITY AS x(e, n))"
            )
            params += [space, owner, list(vectors)]
            self._store.indexes.wrote(len(vectors))
        return bool(await self.fetch(f"{sql} SELECT seq FROM r", params))

    async def insert_raw(self, record: Record) -> bool:
        """Insert an exported record exactly as it was; False if its id exists."""
        return await self._insert(record, unless_known=True)

    async def _put_vectors(
        self, record_id: str, vectors: Vector, embedder: str, start: int = 0
    ) -> bool:
        """Make ``vectors`` the record's passage vectors; False if it is not current. With a
        ``start``, its passages from there on, after the ``start`` rows it holds from
        ``embedder``: False, writing nothing, if it holds another count."""
        slot = await self._seq(record_id)
        if slot is None:
            return False
        seq, live, held_by, rows = slot
        if start and (not live or held_by != embedder or rows != start):
            return False
        if not start:
            await self.execute("DELETE FROM vectors WHERE seq = %s", [seq])
        if not live:
            await self.execute(
                "UPDATE records SET embedder = NULL, vec_rows = 0 WHERE seq = %s", [seq]
            )
            return False  # only current records are indexed
        matrix = _passages(vectors)[: MAX_PASSAGES - start]
        space = await self._store.space(self, embedder, dim=int(matrix.shape[1]))
        assert space is not None  # made when missing, given a dimension
        number, _ = space
        await self._write_vectors(seq, number, embedder, start, [_unit(row) for row in matrix])
        return True

    async def _write_vectors(
        self, seq: int, space: int, embedder: str, start: int, rows: Sequence[Any]
    ) -> None:
        """Write passage vectors ``start``.. of a record; it then owns ``start + len`` rows."""
        self._store.indexes.wrote(len(rows))
        for n, row in enumerate(rows):
            await self.execute(
                "INSERT INTO vectors (seq, passage, space, embedding) VALUES (%s, %s, %s, %s)",
                [seq, start + n, space, row],
            )
        await self.execute(
            "UPDATE records SET embedder = %s, vec_rows = %s WHERE seq = %s",
            [embedder, start + len(rows), seq],
        )

    async def carry_vectors(self, from_id: str, to_id: str, embedder: str) -> int:
        """Append ``from_id``'s passage vectors to ``to_id``'s (a fold keeps both findable);
        a record without vectors takes them (an exact repeat, which is not embedded)."""
        space = await self._store.space(self, embedder)
        source, target = await self._seq(from_id), await self._seq(to_id)
        if space is None or source is None or target is None or not target[1]:
            return 0
        if source[2] != embedder or target[2] not in (None, embedder):
            return 0
        await self._inherit_due(from_id, to_id)
        free = MAX_PASSAGES - target[3]
        rows = await self.fetch(
            "SELECT embedding FROM vectors WHERE seq = %s ORDER BY passage LIMIT %s",
            [source[0], max(0, min(source[3], free))],
            binary=True,
        )
        await self._write_vectors(target[0], space[0], embedder, target[3], [r[0] for r in rows])
        return len(rows)

    async def add_conflict(
        self, scope_key: str, record_id: str, other_id: str, reason: str, at: str
    ) -> int:
        rows = await self.fetch(
            "INSERT INTO conflicts (scope_key, record_id, other_id, reason, created_at) "
            "VALUES (%s, %s, %s, %s, %s) RETURNING id",
            [scope_key, record_id, other_id, reason, at],
        )
        return int(rows[0][0])

    async def update_merged(self, record: Record, at: str) -> bool:
        """Write what a fold into a current record changed (``write.absorb``)."""
        changed = await self.execute(
            "UPDATE records SET merged_from = %s, merged_text = %s, fold_count = %s, "
            "access_count = %s, last_access_at = %s, supersedes = %s, pinned = %s, "
            "tags = %s, importance = %s, meta = %s, updated_at = %s WHERE id = %s AND live",
            merged_params(record, at),
        )
        if changed:
            await self._reindex(record)
        return changed > 0

    async def set_content(self, record: Record, at: str) -> bool:
        """Replace a current record's text (a refined merge); its vectors must be redone."""
        changed = await self.execute(
            "UPDATE records SET content = %s, content_hash = %s, emphasis = %s, meta = %s, "
            "updated_at = %s WHERE id = %s AND live",
            content_params(record, at),
        )
        if changed:
            await self._reindex(record)
            await self.drop_vectors(record.id)
        return changed > 0

    async def rewrite_texts(self, record: Record) -> bool:
        """Replace a record's texts, current or not (the secrets re-scan): its content,
        folded texts and meta; its vectors are dropped (re-embedding makes them again).
        ``updated_at`` stays: the memory says what it said."""
        changed = await self.execute(
            "UPDATE records SET content = %s, content_hash = %s, emphasis = %s, "
            "merged_from = %s, merged_text = %s, meta = %s WHERE id = %s",
            texts_params(record),
        )
        if changed:
            await self._reindex(record)
            await self.drop_vectors(record.id)
        return changed > 0

    async def drop_vectors(self, record_id: str) -> None:
        """Remove a record's vectors: it awaits embedding again."""
        slot = await self._seq(record_id)
        if slot is None or not slot[2]:
            return
        await self.execute("DELETE FROM vectors WHERE seq = %s", [slot[0]])
        await self.execute(
            "UPDATE records SET embedder = NULL, vec_rows = 0 WHERE seq = %s", [slot[0]]
        )

    async def restore(self, record_id: str, at: str) -> Record | None:
        """Make an archived record current again, exactly as it was; None if not archived
        (``sqlite.transaction`` says what a restore of a folded record undoes)."""
        record = await self.get(record_id)
        if record is None or record.archived_at is None:
            return None
        folded = record.archived_reason == "folded" and record.replaced_by is not None
        if folded:
            await unfold(self, record, at)
        await self.execute(
            "UPDATE records SET archived_at = NULL, archived_reason = NULL, "
            "replaced_by = CASE WHEN %s THEN NULL ELSE replaced_by END WHERE id = %s",
            [folded, record_id],
        )
        await self.touch(record.scope_key, at)
        return await self.get(record_id)

    async def touch(self, scope_key: str, at: str) -> None:
        """Note activity in a scope that leaves no trace in its records (a restore)."""
        await self.execute(
            "INSERT INTO scope_activity (scope_key, last_at) VALUES (%s, %s) "
            "ON CONFLICT (scope_key) DO UPDATE "
            "SET last_at = greatest(scope_activity.last_at, excluded.last_at)",
            [scope_key, at],
        )

    async def purge(self, record_ids: Sequence[str], archived_before: str, at: str) -> int:
        """Hard-delete archived records archived before a time, with their history
        (``sqlite.transaction.purge`` says which)."""
        if not record_ids:
            return 0
        rows = await self.fetch(
            "SELECT id, archived_reason, replaced_by FROM records "
            "WHERE id = ANY(%s) AND archived_at IS NOT NULL AND archived_at < %s",
            [list(record_ids), archived_before],
        )
        ids = [str(row[0]) for row in rows]
        if not ids:
            return 0
        heirs = {str(i): str(r) for i, why, r in rows if why == "folded" and r is not None}
        if heirs:
            await self.execute(
                "UPDATE records SET replaced_by = h.heir "
                "FROM unnest(%s::text[], %s::text[]) AS h(gone, heir) "
                "WHERE records.replaced_by = h.gone AND records.archived_at IS NULL",
                [list(heirs), list(heirs.values())],
            )
        history: list[str] = []
        frontier = [i for i in ids if i not in heirs]
        while frontier:  # history of history: a chain of supersedes
            found = await self.fetch(
                "SELECT id FROM records WHERE replaced_by = ANY(%s) AND archived_at IS NULL",
                [frontier],
            )
            frontier = [str(row[0]) for row in found if str(row[0]) not in history]
            history.extend(frontier)
        deleted = await self.execute("DELETE FROM records WHERE id = ANY(%s)", [[*ids, *history]])
        await self.execute(
            "UPDATE conflicts SET resolved_at = %s, resolution = 'purged' "
            "WHERE resolved_at IS NULL "
            "AND (NOT EXISTS (SELECT 1 FROM records WHERE id = conflicts.record_id) "
            "OR NOT EXISTS (SELECT 1 FROM records WHERE id = conflicts.other_id))",
            [at],
        )
        return deleted

    async def claim(
        self, task: str, holder: str, now: str, until: str, cursor: dict[str, Any] | None = None
    ) -> bool:
        """Take, keep or renew ``task``'s lease until ``until``; False if another holds it."""
        await self.execute(
            "INSERT INTO maintenance (task) VALUES (%s) ON CONFLICT (task) DO NOTHING", [task]
        )
        changed = await self.execute(
            "UPDATE maintenance SET holder = %s, lease_until = %s, "
            "cursor = coalesce(%s, cursor) WHERE task = %s AND (holder IS NULL OR holder = %s "
            "OR lease_until IS NULL OR lease_until < %s)",
            [holder, until, None if cursor is None else json.dumps(cursor), task, holder, now],
        )
        return changed > 0


def _passages(vectors: Vector) -> Any:
    """A record's passage vectors as rows of float32, at most ``MAX_PASSAGES``."""
    import numpy as np

    return np.atleast_2d(np.asarray(vectors, dtype=np.float32))[:MAX_PASSAGES]
