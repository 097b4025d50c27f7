"""Vector tables: one vec0 table per embedder, its rowids, and the in-memory copies.

Record ``seq`` owns rowids ``seq * MAX_PASSAGES + i`` for ``i < vec_rows``. vec0
finds a row quickly only by rowid equality, so every per-record read joins on
rowid, and deletes go one rowid at a time. Every vector change is logged in
``vector_changes``, so that the in-memory copies (``dense``) of other
processes catch up.
"""

from __future__ import annotations

import functools
import logging
import re
import sqlite3
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import aiosqlite
import anyio

from memory_mcp.errors import StorageError
from memory_mcp.passages import MAX_PASSAGES
from memory_mcp.storage.base import Filters, Vector
from memory_mcp.storage.sqlite.driver import OPERATIONAL_ERRORS, Driver, on_thread
from memory_mcp.storage.sqlite.sql import storage_error

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from memory_mcp.storage.sqlite.dense import DenseIndex
    from memory_mcp.storage.sqlite.queries import Queries

log = logging.getLogger(__name__)
R = TypeVar("R")

_STOP_WAIT_S = 10.0  # how long a closing store waits for its clusterings to stop


def to_blob(vector: Vector) -> bytes:
    import numpy as np

    return np.ascontiguousarray(vector, dtype=np.float32).tobytes()


def rowids_of(seq: int, count: int, *, start: int = 0) -> list[int]:
    """The vec0 rowids of passages ``start`` .. ``start + count - 1`` of record ``seq``."""
    first = seq * MAX_PASSAGES + start
    return list(range(first, first + count))


def owner_of(rowid: int) -> int:
    """The ``seq`` of the record that owns a vec0 rowid (the inverse of ``rowids_of``)."""
    return int(rowid) // MAX_PASSAGES


@dataclass(frozen=True)
class Slot:
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


TABLE_NAME = re.compile(r"^vec_[0-9]+$")


@dataclass
class Written:
    """The vector rows a write transaction gave a record: added to those it had, or,
    once ``cleared`` (its rows deleted in the transaction), all it has."""

    partition: tuple[str, str, str]  # scope key, corpus, kind
    rows: dict[int, bytes] = field(default_factory=dict)  # rowid -> float32 vector
    cleared: bool = False


@dataclass
class Journal:
    """What one write transaction did to vector rows, for this process's in-memory
    copies (``dense``): after the commit they take it as it is
    (``DenseIndex.apply_written``) instead of the next search reading it back from
    vec0 (0.6-2 ms a store at 50,000 memories, beside the model)."""

    first: int = 0  # its first and last ``vector_changes`` entries (0: none)
    last: int = 0
    records: dict[tuple[str, int], Written] = field(default_factory=dict)  # (embedder, seq)
    followed: bool = True  # False: a change it cannot replay (a bare ``log_change``)
    # The lowest entry of ``retired_vectors`` it took over (``write_rows``), less one: the
    # queue's rowids are reused, so an entry it queues next may get that rowid again.
    retired_floor: int | None = None

    def logged(self, change: int) -> None:
        self.first = self.first or change
        self.last = change

    def wrote(
        self, embedder: str, slot: Slot, rowids: Sequence[int], blobs: Sequence[bytes]
    ) -> None:
        written = self.records.setdefault((embedder, slot.seq), Written(slot.partition))
        written.partition = slot.partition
        written.rows.update(zip(rowids, blobs, strict=True))

    def deleted(self, embedder: str, seq: int) -> None:
        written = self.records.setdefault((embedder, seq), Written(("", "", "")))
        written.rows.clear()
        written.cleared = True

    def of(self, embedder: str) -> dict[int, Written]:
        """The records whose rows of ``embedder``'s table changed, by seq."""
        return {seq: w for (name, seq), w in self.records.items() if name == embedder}


# The routines below run on a connection's own thread (``driver.on_thread``), several
# statements in one round trip, inside the caller's write transaction; a ``journal``
# notes what they did to vector rows.

TABLE_SQL = "SELECT table_name, dim FROM vector_indexes WHERE embedder = ?"
SLOT_SQL = "SELECT seq, scope_key, corpus, kind, live, embedder, vec_rows FROM records WHERE id = ?"


def slot_of(conn: sqlite3.Connection, record_id: str) -> Slot | None:
    """Where a record's vectors live (None: no such record)."""
    row = conn.execute(SLOT_SQL, [record_id]).fetchone()
    return Slot(*row) if row else None


def log_change(conn: sqlite3.Connection, embedder: str, seq: int) -> int:
    """Note that record ``seq``'s vectors changed, for the in-memory copies (``dense``);
    the log entry's id."""
    from memory_mcp.storage.sqlite.dense import KEEP_CHANGES

    cursor = conn.execute(
        "INSERT INTO vector_changes (embedder, seq) VALUES (?, ?)", [embedder, seq]
    )
    last = cursor.lastrowid or 0
    if last % 1000 == 0:
        conn.execute("DELETE FROM vector_changes WHERE id <= ?", [last - KEEP_CHANGES])
    return last


def write_rows(
    conn: sqlite3.Connection,
    journal: Journal,
    tables: Callable[[], Mapping[str, str]],
    table: str,
    embedder: str,
    slot: Slot,
    start: int,
    blobs: Sequence[bytes],
) -> None:
    """Write passage vectors ``start``.. of a record; it then owns ``start + len`` rows.

    Rows the record held before it stopped being current, still waiting to be swept
    (``announce_retired``), are deleted first: a record made current again, or a
    deleted record's ``seq`` given to a new one, takes the same rowids.
    """
    if queued := conn.execute(RETIRED_ROWS_OF_SQL, [slot.seq]).fetchall():
        _delete_retired(conn, tables(), queued, journal)
    rowids = rowids_of(slot.seq, len(blobs), start=start)
    journal.logged(log_change(conn, embedder, slot.seq))
    journal.wrote(embedder, slot, rowids, blobs)
    conn.executemany(
        f"INSERT INTO {table} (rowid, scope_key, corpus, kind, embedding) VALUES (?, ?, ?, ?, ?)",
        [(rowid, *slot.partition, blob) for rowid, blob in zip(rowids, blobs, strict=True)],
    )
    conn.execute(
        "UPDATE records SET embedder = ?, vec_rows = ? WHERE seq = ?",
        [embedder, start + len(blobs), slot.seq],
    )


def delete_rows(
    conn: sqlite3.Connection,
    journal: Journal | None,
    tables: Mapping[str, str],
    embedder: str,
    seq: int,
    count: int,
) -> None:
    """Delete a record's passage vectors, one rowid at a time (vec0's only fast delete),
    and with a ``journal`` announce them gone (``announce``; without, they were).

    ``tables``: the vec0 table of each embedder whose vectors can be read (none
    when sqlite-vec is not loaded: the rows are then left alone).
    """
    table = tables.get(embedder)
    if table is None or count <= 0:
        return
    conn.executemany(f"DELETE FROM {table} WHERE rowid = ?", [(r,) for r in rowids_of(seq, count)])
    if journal is not None:
        announce(conn, journal, embedder, seq)


def announce(conn: sqlite3.Connection, journal: Journal, embedder: str, seq: int) -> None:
    """Tell this process's copies (``journal``) and other processes' (the change log)
    that record ``seq``'s rows of ``embedder`` are gone."""
    journal.logged(log_change(conn, embedder, seq))
    journal.deleted(embedder, seq)


# The vector rows of records that stop being current (archived, replaced, folded,
# deleted) are queued in ``retired_vectors`` by triggers. The transaction that retires
# them tells the in-memory copies and the change log they are gone
# (``announce_retired``); vec0's rows themselves are deleted later, in a transaction of
# their own, once stores and searches pause (``delete_retired``, run by the engine):
# vec0 reads a row's vector before it deletes it, walking the chunk's overflow pages,
# 0.3 ms a row at 10,000 memories, and a store that supersedes a fact of 2-3 passages
# waited for that inside its commit (0.76 ms of its p50 on the bench's stores).
# Until then the rows belong to no current record, and every read of vec0 skips them:
# it keeps the rows of records that are current and hold vectors (``HELD``).
RETIRED_MAX_SQL = "SELECT coalesce(max(rowid), 0) FROM retired_vectors"
RETIRED_ANY_SQL = "SELECT 1 FROM retired_vectors LIMIT 1"
RETIRED_ROWS_OF_SQL = "SELECT rowid, seq, embedder, vec_rows FROM retired_vectors WHERE seq = ?"
RETIRED_SQL = "SELECT rowid, seq, embedder, vec_rows FROM retired_vectors ORDER BY rowid LIMIT ?"
# Queued rows whose seq is a current record's again (made current again, or a deleted
# record's seq reused): they would pass for its vectors, so they go before the commit.
REVIVED_SQL = (
    "SELECT q.rowid, q.seq, q.embedder, q.vec_rows FROM retired_vectors q "
    "JOIN records r ON r.seq = q.seq WHERE r.live = 1"
)


def announce_retired(conn: sqlite3.Connection, journal: Journal, after: int) -> None:
    """Announce gone (``announce``) the vector rows queued since ``after`` (the queue's
    last rowid when the transaction began, or below an entry it took over); the rows
    stay queued."""
    if journal.retired_floor is not None:
        after = min(after, journal.retired_floor)
    queued = conn.execute(
        "SELECT seq, embedder FROM retired_vectors WHERE rowid > ?", [after]
    ).fetchall()
    for seq, embedder in queued:
        announce(conn, journal, str(embedder), int(seq))


def delete_revived(conn: sqlite3.Connection, tables: Mapping[str, str]) -> None:
    """Delete the queued rows of seqs that are current records' again (``REVIVED_SQL``),
    at the commit (announced already: their records were retired first)."""
    revived = conn.execute(REVIVED_SQL).fetchall()
    if revived:
        _delete_retired(conn, tables, revived)


def delete_retired(conn: sqlite3.Connection, tables: Mapping[str, str], most: int) -> int:
    """Delete the vec0 rows of queued records (announced already), about ``most`` rows
    (the first record's whatever its count), and their queue entries, inside the
    caller's write transaction: how many records'."""
    queued = conn.execute(RETIRED_SQL, [most]).fetchall()
    taken, rows = 0, 0
    for entry in queued:
        if taken and rows + int(entry[3]) > most:
            break
        taken, rows = taken + 1, rows + int(entry[3])
    _delete_retired(conn, tables, queued[:taken])
    return taken


def _delete_retired(
    conn: sqlite3.Connection,
    tables: Mapping[str, str],
    queued: Sequence[Any],
    journal: Journal | None = None,
) -> None:
    """Delete these queue entries (rowid, seq, embedder, vec_rows) and their vec0 rows
    (only with sqlite-vec loaded: the callers make sure); with a ``journal``, announced
    again (their transaction may not have announced them yet), and the floor of what
    its commit announces lowered below them."""
    for rowid, seq, embedder, count in queued:
        delete_rows(conn, journal, tables, str(embedder), int(seq), int(count))
        if journal is not None:
            below = int(rowid) - 1
            if journal.retired_floor is None or below < journal.retired_floor:
                journal.retired_floor = below
    conn.executemany("DELETE FROM retired_vectors WHERE rowid = ?", [(q[0],) for q in queued])


class VectorTables:
    """The store's vec0 tables and their in-memory copies (``SqliteStore`` is one)."""

    path: Path
    driver: Driver
    reads: Queries
    _tables: dict[str, str]
    _copies: dict[str, DenseIndex]
    _copy_off: str
    _reader: aiosqlite.Connection

    async def _copy(self, table: str, embedder: str) -> DenseIndex | None:
        """The in-memory copy of a vector table the reader can see, if copies are on."""
        from memory_mcp.storage.sqlite.dense import DenseIndex

        if self._copy_off:
            return None
        index = self._copies.get(table)
        if index is None:
            dims = await self.reads.fetch(
                "SELECT dim FROM vector_indexes WHERE table_name = ?", [table]
            )
            if not dims:  # created by a transaction that has not committed yet
                return None
            # setdefault: another search may have made it while this one waited
            folder = None if str(self.path) == ":memory:" else self.path.parent
            made = DenseIndex(table, embedder, int(dims[0][0]), folder, self.kept_folder)
            index = self._copies.setdefault(table, made)
        return index

    @property
    def kept_folder(self) -> Path | None:
        """Where clustered scopes' copies are kept for the next process (``dense``)."""
        if str(self.path) == ":memory:":
            return None
        return self.path.parent / f"{self.path.name}-vectors"

    async def prune_caches(self) -> int:
        """Remove the kept copies of vector tables the store no longer has and of scopes
        that no longer hold vectors (a project archived or purged, an embedder replaced
        by a re-embedding); the bytes freed."""
        from memory_mcp.storage.sqlite import dense

        folder = self.kept_folder
        if folder is None or not folder.is_dir():
            return 0
        tables = dict(await self.reads.fetch("SELECT table_name, embedder FROM vector_indexes", []))
        freed = 0
        for path, meta in await anyio.to_thread.run_sync(dense.kept_copies, folder):
            wanted = meta is not None and tables.get(meta.get("table")) == meta.get("embedder")
            if wanted and meta is not None:
                held = await self.reads.fetch(
                    f"SELECT 1 FROM records WHERE {dense.HELD} LIMIT 1",
                    [meta.get("scope"), meta.get("embedder")],
                )
                wanted = bool(held)
            if not wanted:
                freed += await anyio.to_thread.run_sync(dense.drop_kept, path)
        return freed

    async def _prepared(self, index: DenseIndex, scope_keys: Collection[str]) -> bool:
        """Bring ``index`` up to date for these scopes (hold its lock); False: copies are off."""
        from memory_mcp.storage.sqlite.dense import LayoutError, Moved

        try:
            await index.prepare(self.reads.fetch, scope_keys)
        except LayoutError as exc:
            log.warning("searching vectors through vec0, without an in-memory copy: %s", exc)
            self._copy_off = str(exc)
            dropped = list(self._copies.values())
            self._copies.clear()
            await self._stop_clusterings(dropped)
            return False
        except Moved as exc:
            log.info("a scope changed while its vectors loaded (%s); searching through vec0", exc)
            return False
        return True

    async def _stop_clusterings(self, indexes: Sequence[DenseIndex]) -> None:
        """Stop these copies' clusterings and wait for their threads (``_Clustering``
        says why a process must not exit while one runs)."""
        for index in indexes:
            if not await anyio.to_thread.run_sync(index.close, _STOP_WAIT_S):
                log.warning("a clustering of %s's vectors did not stop", index.embedder)

    async def load_vectors(
        self, embedder: str, scope_keys: Collection[str], *, settle: float = 0.0
    ) -> bool:
        """Bring the in-memory copy of these scopes' vectors up to date (a no-op without one).

        A store calls this before its write transaction, so that loading a
        scope (0.35 s at 50,000 memories) does not hold every process's writes.
        ``settle``: wait up to as many seconds for the scopes' clusterings
        (``dense``); False if one is still running then.
        """
        table = await self._vector_table(self._reader, embedder)
        if table is None:
            return True
        async with self._ready_copy(table, embedder, scope_keys) as index:
            if index is None or settle <= 0:
                return True
            return await index.settle(self.reads.fetch, scope_keys, settle)

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
        self, table: str, embedder: str, vector: Vector, filters: Filters, *, exact: bool
    ) -> tuple[npt.NDArray[np.int64], Vector, bool] | None:
        """The rows of the filters' scopes, corpora and kinds with their cosines (every
        row, or the nearest clusters' unless ``exact``: ``DenseIndex.rank``); None:
        no copy."""
        async with self._ready_copy(table, embedder, filters.scope_keys) as index:
            if index is None:
                return None
            return await anyio.to_thread.run_sync(
                functools.partial(
                    index.rank,
                    vector,
                    filters.scope_keys,
                    filters.corpora,
                    filters.kinds,
                    exact=exact,
                )
            )

    async def rank_ahead(
        self, vector: Vector, embedder: str, filters: Filters, probes: int
    ) -> object | None:
        """The copy's ranking for ``nearest_with_scores`` (``DenseIndex.rank_ahead``), made
        now on a worker thread, while the reader's thread reads the lexical branch's
        candidates: at 200,000 memories a search's lexical read often ends after its
        query's embedding, and the ranking (about 1 ms there) fits between the two.

        Only from a copy that holds these scopes already and a table known already: the
        reader's thread is busy, and a ranking that must wait for it gains nothing.
        None: no such copy (the read ranks as before)."""
        table = self._tables.get(embedder)
        if table is None or not filters.scope_keys:
            return None
        async with self._held_copy(table, filters.scope_keys) as index:
            if index is None:
                return None
            return await anyio.to_thread.run_sync(
                index.rank_ahead,
                vector,
                filters.scope_keys,
                filters.corpora,
                filters.kinds,
                probes,
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

    async def _on_copy(
        self,
        table: str,
        scope_keys: Collection[str],
        routine: Callable[[sqlite3.Connection, DenseIndex], R | None],
    ) -> R | None:
        """``routine(connection, copy)`` on the reader's thread, with the in-memory copy of
        ``table`` locked, if it holds these scopes and is current: checked in the same
        trip (``DenseIndex.current``, ``holds``), where catching up first (``_ready_copy``) takes a
        trip of its own, and ranking another. None: no copy, a scope to load, a change
        to catch up on, or the routine declined (the caller's other path does it).

        Raises:
            StorageError: the database could not be read.
        """
        async with self._held_copy(table, scope_keys) as index:
            if index is None:
                return None
            held = index

            def run(conn: sqlite3.Connection) -> R | None:
                return routine(conn, held) if held.current(conn) else None

            try:
                return await on_thread(self._reader, run)
            except OPERATIONAL_ERRORS as exc:
                raise storage_error(exc) from exc

    @asynccontextmanager
    async def _held_copy(
        self, table: str, scope_keys: Collection[str]
    ) -> AsyncIterator[DenseIndex | None]:
        """The in-memory copy of ``table``, locked, with the clusterings of these scopes
        that finished installed, if it holds them already (not brought up to date:
        ``_ready_copy`` does that); None: copies are off, or it does not hold them.
        They are asked again under the lock: a reload for another scope (a copy far
        behind) may have dropped them while this waited for it."""
        index = None if self._copy_off else self._copies.get(table)
        if index is None or not index.holds(scope_keys):
            yield None
            return
        async with index.lock:
            if not index.holds(scope_keys):
                yield None
                return
            await index.keep_clustered(self.reads.fetch, scope_keys)
            yield index

    def _apply_written(self, journal: Journal) -> None:
        """Give this process's copies what a committed transaction wrote and deleted
        (``Journal``), where they had caught up to just before it; a copy that is busy
        (its lock taken) or behind catches up from the log as before."""
        if not journal.last or not journal.followed:
            return
        for index in list(self._copies.values()):
            try:
                index.lock.acquire_nowait()
            except anyio.WouldBlock:
                continue
            try:
                index.apply_written(journal.first - 1, journal.last, journal.of(index.embedder))
            except Exception:  # the copy starts again from the chunk tables
                log.warning("vector index of %s: reloading after an error", index.embedder)
                index.forget()
            finally:
                index.lock.release()

    def _table_names(self, conn: sqlite3.Connection) -> dict[str, str]:
        """Every embedder's vec0 table (on the connection's thread), none without sqlite-vec:
        what ``delete_rows`` deletes from."""
        if not self.driver.vectors:
            return {}
        rows = conn.execute("SELECT embedder, table_name FROM vector_indexes").fetchall()
        return {str(embedder): str(table) for embedder, table in rows if TABLE_NAME.match(table)}

    async def _vector_table(
        self, conn: aiosqlite.Connection, embedder: str, *, dim: int | None = None
    ) -> str | None:
        """The vec0 table of ``embedder``; created (in the caller's transaction) if ``dim``."""
        if not self.driver.vectors:
            return None
        cached = self._tables.get(embedder)
        if cached is not None:
            return cached
        rows = list(await conn.execute_fetchall(TABLE_SQL, [embedder]))
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
