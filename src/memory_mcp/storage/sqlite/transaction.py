"""One write transaction (``BEGIN IMMEDIATE`` on the writer connection)."""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

import aiosqlite

from memory_mcp.passages import MAX_PASSAGES
from memory_mcp.records import Record
from memory_mcp.storage.base import Vector
from memory_mcp.storage.history import unfold
from memory_mcp.storage.rows import (
    content_params,
    merged_params,
    texts_params,
)
from memory_mcp.storage.sqlite.driver import OPERATIONAL_ERRORS, on_thread
from memory_mcp.storage.sqlite.queries import Queries
from memory_mcp.storage.sqlite.sql import (
    INSERT,
    marks,
    record_params,
    storage_error,
)
from memory_mcp.storage.sqlite.vectors import (
    Journal,
    Slot,
    delete_rows,
    log_change,
    rowids_of,
    slot_of,
    to_blob,
    write_rows,
)
from memory_mcp.storage.statements import INHERIT_DUE, SharedWrites

if TYPE_CHECKING:
    from memory_mcp.storage.sqlite.store import SqliteStore

log = logging.getLogger(__name__)
T = TypeVar("T")


class Pipelined(aiosqlite.Connection):
    """The writer's connection: a write whose result no one awaits (``queue``) waits and
    runs on the connection's thread just before the next call, in the same round trip
    (``on_thread``): a store's insert travels with its commit.

    Every call goes through ``_execute``, so nothing reads past a queued write;
    ``unqueued`` is for a call whose answer does not depend on them (the write
    mark, which other tasks ask for while a transaction is open). A queued write
    that fails fails the call it travelled with, and its transaction
    (``Transaction.failure``); ``discard`` drops what is queued (a rollback).
    """

    def __init__(self, connector: Callable[[], sqlite3.Connection], iter_chunk_size: int) -> None:
        super().__init__(connector, iter_chunk_size)
        self.queued: list[Callable[[sqlite3.Connection], object]] = []

    def queue(self, routine: Callable[[sqlite3.Connection], object]) -> None:
        self.queued.append(routine)

    def discard(self) -> None:
        self.queued = []

    async def unqueued(self, routine: Callable[..., T], *args: Any) -> T:
        """``routine(connection, *args)`` on the thread, without what is queued."""
        return cast(T, await super()._execute(lambda: routine(self._conn, *args)))  # type: ignore[no-untyped-call]

    async def _execute(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if not self.queued:
            return cast(T, await super()._execute(fn, *args, **kwargs))  # type: ignore[no-untyped-call]
        queued, self.queued = self.queued, []

        def queued_first() -> T:
            for routine in queued:
                routine(self._conn)
            return fn(*args, **kwargs)

        return cast(T, await super()._execute(queued_first))  # type: ignore[no-untyped-call]


class Transaction(SharedWrites, Queries):
    """One ``BEGIN IMMEDIATE`` transaction on the writer connection."""

    MARK = "?"

    def __init__(self, conn: Pipelined, store: SqliteStore, began: object | None = None) -> None:
        super().__init__(conn, store)
        self._writer = conn
        self._began = began  # the store's ``write_mark`` at its start
        self.words_before: bytes | None = None  # FTS5's structure at its start
        self.retired_after = 0  # the retired vectors' queue's last entry at its start
        self._touched: set[int] = set()  # records whose vectors this transaction changed
        self._changes_at_start = conn.total_changes
        self._queued = False  # it queued a write (``Pipelined``)
        self.failure: BaseException | None = None  # what a queued write of it raised
        self.journal = Journal()  # what it did to vector rows (``vectors.Journal``)

    @property
    def began(self) -> object | None:
        """The store's ``write_mark`` at its start."""
        return self._began

    async def _own_writes(self) -> Collection[int]:
        if self._writer.queued:  # the records a queued write changes are known once it ran
            await on_thread(self._writer, _nothing)
        return self._touched

    async def unchanged_since(self, mark: object | None) -> bool:
        """The store's ``write_mark`` at this transaction's start is ``mark``, and it has
        written nothing yet. The write lock held, nothing else can commit."""
        if mark is None or self._touched or self._queued:
            return False
        if self._conn.total_changes != self._changes_at_start:
            return False
        return mark == self._began

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        try:
            cursor = await self._conn.execute(sql, params)
        except OPERATIONAL_ERRORS as exc:
            raise storage_error(exc) from exc
        return cursor.rowcount

    async def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """One statement for each of ``rows``."""
        await self._conn.executemany(sql, rows)

    async def log_change(self, embedder: str, seq: int) -> None:
        """Note that record ``seq``'s vectors changed (``vectors.log_change``): the copies
        read them back (the journal cannot say what changed)."""
        self.journal.followed = False
        await on_thread(self._conn, log_change, embedder, seq)

    async def _on_thread(self, routine: Callable[..., tuple[int | None, T]], *args: Any) -> T:
        """Run a routine of this module on the writer's thread (``driver.on_thread``) with
        the transaction's journal and the vec0 tables it may delete from (read when it
        does: ``VectorTables._table_names``); it returns the
        ``seq`` of the record whose vectors it changed (if any) and its result."""
        store, journal = self._store, self.journal

        def run(conn: sqlite3.Connection) -> tuple[int | None, T]:
            return routine(conn, journal, lambda: store._table_names(conn), *args)

        seq, result = await on_thread(self._conn, run)
        if seq is not None:
            self._touched.add(seq)
        return result

    def _queue(self, routine: Callable[..., tuple[int | None, object]], *args: Any) -> None:
        """Run a routine of this module with the writer's next round trip (``Pipelined``),
        as ``_on_thread`` would: for a write whose result is not wanted."""
        store, journal, touched = self._store, self.journal, self._touched

        def run(conn: sqlite3.Connection) -> None:
            seq, _ = routine(conn, journal, lambda: store._table_names(conn), *args)
            if seq is not None:
                touched.add(seq)

        self._later(run)

    async def _write(self, sql: str, params: Sequence[Any]) -> None:
        """A statement whose result is not wanted, sent with the next round trip."""
        self._later(lambda conn: conn.execute(self._sql(sql), params))

    def _later(self, write: Callable[[sqlite3.Connection], object]) -> None:
        """Queue ``write`` on the writer's connection; if it fails, so does the commit,
        whatever call carried it (one whose caller went on regardless)."""

        def run(conn: sqlite3.Connection) -> None:
            try:
                write(conn)
            except BaseException as exc:
                self.failure = exc
                raise

        self._queued = True
        self._writer.queue(run)

    async def insert(
        self, record: Record, vectors: Vector | None, *, vectors_due: bool = False
    ) -> None:
        """Insert a new record with its passage vectors (one row per passage), with the
        writer's next round trip (a store's: its commit)."""
        rows = None
        if vectors is not None and record.embedder and record.current:  # only current ones
            table, blobs = await self._blobs(vectors, record.embedder)
            rows = (table, record.embedder, blobs)
        self._queue(_insert, record_params(record), rows, vectors_due)

    async def _blobs(self, vectors: Vector, embedder: str) -> tuple[str, list[bytes]]:
        """The vec0 table for ``embedder``'s vectors (made if new), and the record's rows."""
        import numpy as np

        matrix = np.atleast_2d(vectors)[:MAX_PASSAGES]
        table = await self._store._vector_table(self._conn, embedder, dim=int(matrix.shape[1]))
        assert table is not None
        return table, [to_blob(row) for row in matrix]

    async def _put_vectors(
        self, record_id: str, vectors: Vector, embedder: str, start: int = 0
    ) -> bool:
        """Make ``vectors`` the record's passage vectors (from ``start``: ``_put``); False
        if it is not current."""
        table, blobs = await self._blobs(vectors, embedder)
        return await self._on_thread(_put, record_id, table, embedder, blobs, start)

    async def carry_vectors(self, from_id: str, to_id: str, embedder: str) -> int:
        """Append ``from_id``'s passage vectors to ``to_id``'s (a fold keeps both findable);
        a record without vectors takes them (an exact repeat, which is not embedded)."""
        table = await self._store._vector_table(self._conn, embedder)
        if table is None:
            return 0
        return await self._on_thread(_carry, from_id, to_id, table, embedder)

    async def add_conflict(
        self, scope_key: str, record_id: str, other_id: str, reason: str, at: str
    ) -> int:
        cursor = await self._conn.execute(
            "INSERT INTO conflicts (scope_key, record_id, other_id, reason, created_at) "
            "VALUES (?, ?, ?, ?, ?)",
            [scope_key, record_id, other_id, reason, at],
        )
        return int(cursor.lastrowid or 0)

    async def insert_raw(self, record: Record) -> bool:
        """Insert an exported record exactly as it was; False if its id exists."""
        exists = await self.fetch("SELECT 1 FROM records WHERE id = ?", [record.id])
        if exists:
            return False
        await self.execute(INSERT, record_params(record))
        return True

    async def update_merged(self, record: Record, at: str) -> bool:
        """Write what a fold into a current record changed (``write.absorb``)."""
        changed = await self.execute(
            "UPDATE records SET merged_from = ?, merged_text = ?, fold_count = ?, "
            "access_count = ?, last_access_at = ?, supersedes = ?, pinned = ?, "
            "tags = ?, importance = ?, meta = ?, updated_at = ? WHERE id = ? AND live = 1",
            merged_params(record, at),
        )
        return changed > 0

    async def set_content(self, record: Record, at: str) -> bool:
        """Replace a current record's text (a refined merge); its vectors must be redone."""
        changed = await self.execute(
            "UPDATE records SET content = ?, content_hash = ?, emphasis = ?, meta = ?, "
            "updated_at = ? WHERE id = ? AND live = 1",
            content_params(record, at),
        )
        if changed:
            await self.drop_vectors(record.id)
        return changed > 0

    async def rewrite_texts(self, record: Record) -> bool:
        """Replace a record's texts, current or not (the secrets re-scan): its content,
        folded texts and meta. Triggers redo its full-text row; a current record's
        vectors are dropped, since they were made from the old texts, and re-embedding
        makes them again. ``updated_at`` stays: the memory says what it said."""
        changed = await self.execute(
            "UPDATE records SET content = ?, content_hash = ?, emphasis = ?, "
            "merged_from = ?, merged_text = ?, meta = ? WHERE id = ?",
            texts_params(record),
        )
        if changed:
            await self.drop_vectors(record.id)
        return changed > 0

    async def drop_vectors(self, record_id: str) -> None:
        """Remove a record's vectors: it awaits embedding again (re-embed redoes them)."""
        await self._on_thread(_drop, record_id)

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
            await unfold(self, record, at)
        await self.execute(
            "UPDATE records SET archived_at = NULL, archived_reason = NULL, "
            "replaced_by = CASE WHEN ? THEN NULL ELSE replaced_by END WHERE id = ?",
            [int(folded), record_id],
        )
        await self.touch(record.scope_key, at)
        return await self.get(record_id)

    async def touch(self, scope_key: str, at: str) -> None:
        """Note activity in a scope that leaves no trace in its records (a restore)."""
        await self.execute(
            "INSERT INTO scope_activity (scope_key, last_at) VALUES (?, ?) "
            "ON CONFLICT (scope_key) DO UPDATE SET last_at = max(last_at, excluded.last_at)",
            [scope_key, at],
        )

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
        rows = await self.fetch(
            "SELECT id, archived_reason, replaced_by FROM records "
            f"WHERE id IN ({marks(record_ids)}) AND archived_at IS NOT NULL AND archived_at < ?",
            [*record_ids, archived_before],
        )
        ids = [str(row[0]) for row in rows]
        if not ids:
            return 0
        heirs = {str(i): str(r) for i, why, r in rows if why == "folded" and r is not None}
        if heirs:  # one pass over the records: replaced_by has no index
            cases = " ".join("WHEN ? THEN ?" for _ in heirs)
            await self.execute(
                f"UPDATE records SET replaced_by = CASE replaced_by {cases} END "
                f"WHERE replaced_by IN ({marks(heirs)}) AND archived_at IS NULL",
                [*(x for pair in heirs.items() for x in pair), *heirs],
            )
        doomed = [i for i in ids if i not in heirs]
        history: list[str] = []
        frontier = doomed
        while frontier:  # history of history: a chain of supersedes
            found = await self.fetch(
                f"SELECT id FROM records WHERE replaced_by IN ({marks(frontier)}) "
                "AND archived_at IS NULL",
                frontier,
            )
            frontier = [str(row[0]) for row in found if str(row[0]) not in history]
            history.extend(frontier)
        gone = [*ids, *history]
        deleted = 0
        for start in range(0, len(gone), 500):
            chunk = gone[start : start + 500]
            deleted += await self.execute(
                f"DELETE FROM records WHERE id IN ({marks(chunk)})", chunk
            )
        await self.execute(
            "UPDATE conflicts SET resolved_at = ?, resolution = 'purged' WHERE resolved_at IS NULL "
            "AND (NOT EXISTS (SELECT 1 FROM records WHERE id = conflicts.record_id) "
            "OR NOT EXISTS (SELECT 1 FROM records WHERE id = conflicts.other_id))",
            [at],
        )
        return deleted

    async def claim(
        self, task: str, holder: str, now: str, until: str, cursor: dict[str, Any] | None = None
    ) -> bool:
        """Take, keep or renew ``task``'s lease until ``until``; False if another holds it.

        A lease whose time is past is free. ``cursor`` saves where the task is.
        """
        await self.execute("INSERT OR IGNORE INTO maintenance (task) VALUES (?)", [task])
        changed = await self.execute(
            "UPDATE maintenance SET holder = ?, lease_until = ?, cursor = coalesce(?, cursor) "
            "WHERE task = ? AND (holder IS NULL OR holder = ? OR lease_until IS NULL "
            "OR lease_until < ?)",
            [holder, until, None if cursor is None else json.dumps(cursor), task, holder, now],
        )
        return changed > 0


def _nothing(conn: sqlite3.Connection) -> None:
    """A trip that only carries what is queued (``Pipelined``)."""


# Routines run on the writer's thread (``Transaction._on_thread``): each takes the
# connection, the transaction's journal and the vec0 tables, and returns the seq of
# the record whose vectors it changed (if any) with its result.


def _insert(
    conn: sqlite3.Connection,
    journal: Journal,
    tables: Callable[[], Mapping[str, str]],
    params: Sequence[Any],
    rows: tuple[str, str, list[bytes]] | None,
    vectors_due: bool,
) -> tuple[int | None, None]:
    """Insert a record (``INSERT``'s parameters), with its vectors (table, embedder, rows)."""
    seq = conn.execute(INSERT, params).lastrowid
    assert seq is not None
    if vectors_due:
        conn.execute("UPDATE records SET vectors_due = 1 WHERE seq = ?", [seq])
    if rows is None:
        return None, None
    table, embedder, blobs = rows
    slot = Slot(seq, *_partition(params), 1, None, 0)
    write_rows(conn, journal, tables, table, embedder, slot, 0, blobs)
    return seq, None


def _partition(params: Sequence[Any]) -> tuple[str, str, str]:
    """(scope_key, corpus, kind) of a record from ``INSERT``'s parameters."""
    return params[4], params[1], params[2]


def _put(
    conn: sqlite3.Connection,
    journal: Journal,
    tables: Callable[[], Mapping[str, str]],
    record_id: str,
    table: str,
    embedder: str,
    blobs: list[bytes],
    start: int = 0,
) -> tuple[int | None, bool]:
    """Make ``blobs`` the record's passage vectors; False if it is not current. With a
    ``start``, its passages from there on, after the ``start`` rows it holds from
    ``embedder``: False, writing nothing, if it holds another count."""
    slot = slot_of(conn, record_id)
    if slot is None:
        return None, False
    if start and (not slot.live or slot.embedder != embedder or slot.vec_rows != start):
        return None, False
    if not start and slot.embedder and slot.vec_rows:
        delete_rows(conn, journal, tables(), slot.embedder, slot.seq, slot.vec_rows)
    if not slot.live:
        return slot.seq, False  # only current records are indexed
    write_rows(conn, journal, tables, table, embedder, slot, start, blobs[: MAX_PASSAGES - start])
    return slot.seq, True


def _carry(
    conn: sqlite3.Connection,
    journal: Journal,
    tables: Callable[[], Mapping[str, str]],
    from_id: str,
    to_id: str,
    table: str,
    embedder: str,
) -> tuple[int | None, int]:
    """Append ``from_id``'s passage vectors to ``to_id``'s; how many."""
    source, target = slot_of(conn, from_id), slot_of(conn, to_id)
    if source is None or target is None or not target.live:
        return None, 0
    if source.embedder != embedder or target.embedder not in (None, embedder):
        return None, 0
    conn.execute(INHERIT_DUE, [to_id, from_id])
    wanted = rowids_of(source.seq, min(source.vec_rows, MAX_PASSAGES - target.vec_rows))
    rows = conn.execute(
        f"SELECT j.value, v.embedding FROM json_each(?) j JOIN {table} v ON v.rowid = j.value "
        "ORDER BY j.key",
        [json.dumps(wanted)],
    ).fetchall()
    blobs = [bytes(b) for _, b in rows]
    write_rows(conn, journal, tables, table, embedder, target, target.vec_rows, blobs)
    return target.seq, len(rows)


def _drop(
    conn: sqlite3.Connection,
    journal: Journal,
    tables: Callable[[], Mapping[str, str]],
    record_id: str,
) -> tuple[int | None, None]:
    """Remove a record's vectors (it awaits embedding again)."""
    slot = slot_of(conn, record_id)
    if slot is None or not slot.embedder or not slot.vec_rows:
        return None, None
    delete_rows(conn, journal, tables(), slot.embedder, slot.seq, slot.vec_rows)
    conn.execute("UPDATE records SET embedder = NULL, vec_rows = 0 WHERE seq = ?", [slot.seq])
    return slot.seq, None
