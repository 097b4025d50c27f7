"""``SqliteStore``: the connections, the write lock, and the store-wide reads."""

from __future__ import annotations

import asyncio
import functools
import getpass
import logging
import shutil
import sqlite3
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiosqlite
import anyio

from memory_mcp.errors import InvalidInput
from memory_mcp.ranker import RankerConfig
from memory_mcp.records import Record, utcnow
from memory_mcp.storage import rows
from memory_mcp.storage.base import (
    Around,
    CandidateReads,
    Diagnosis,
    Filters,
    RecordCount,
    Scored,
    StoreStats,
    Vector,
)
from memory_mcp.storage.rows import SQLITE
from memory_mcp.storage.sqlite import postings
from memory_mcp.storage.sqlite.driver import (
    OPERATIONAL_ERRORS,
    Driver,
    DriverName,
    cached_driver,
    on_thread,
)
from memory_mcp.storage.sqlite.migrations import copy_database, prepare_file
from memory_mcp.storage.sqlite.queries import Queries
from memory_mcp.storage.sqlite.sql import (
    SELECT,
    awaiting_sql,
    filters_sql,
    marks,
    record_of,
    storage_error,
)
from memory_mcp.storage.sqlite.transaction import Pipelined, Transaction
from memory_mcp.storage.sqlite.upkeep import UpkeepReads
from memory_mcp.storage.sqlite.vectors import (
    RETIRED_ANY_SQL,
    RETIRED_MAX_SQL,
    TABLE_NAME,
    VectorTables,
    announce_retired,
    delete_retired,
    delete_revived,
    rowids_of,
)

if TYPE_CHECKING:
    from memory_mcp.storage.sqlite.dense import DenseIndex

log = logging.getLogger(__name__)


@functools.cache
def local_user() -> str:
    """This machine's login name (what a record stored in a local file says of its writer),
    or "" when there is none to find; looked up once (the password database, where no
    variable names it, on every store otherwise)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry (a bare container)
        return ""


_NO_TEAM = (
    "a SQLite file has no database users of its own: team mode runs on Postgres "
    '(storage.url = "postgresql://…"; see the README\'s Team mode)'
)
# Commits, or rows written, between two checkpoints of the WAL (``_committed``). A
# checkpoint costs about 6.5 ms (its two fsyncs) plus 0.55 ms a store's commit at
# 50,000 memories, and the store after it waits: every 8th store waited 11 ms, every
# 32nd waits 24 ms, and the checkpoints take 0.75 ms a store instead of 1.3.
_CHECKPOINT_COMMITS = 32
_CHECKPOINT_CHANGES = 2_000
_WAL_KEEP_BYTES = 64 * 1024 * 1024  # the WAL file's size kept when it starts over


class SqliteStore(VectorTables, UpkeepReads):
    """The default store."""

    def __init__(
        self,
        path: Path,
        driver: Driver,
        writer: Pipelined,
        reader: aiosqlite.Connection,
        *,
        vector_copy: bool = True,
        busy_timeout_ms: int = 15000,
        clock: Callable[[], datetime] = utcnow,
        connector: Callable[[], sqlite3.Connection] | None = None,
    ) -> None:
        self.path = path
        self.driver = driver
        self.busy_timeout_ms = busy_timeout_ms
        self._clock = clock
        self._writer = writer
        self._reader = reader
        self._write_lock = anyio.Lock()
        self.reads = Queries(reader, self)
        self._tables: dict[str, str] = {}
        self._copies: dict[str, DenseIndex] = {}  # by vector table
        self._word_counts = postings.WordCounts()  # read on the reader's thread
        self._copy_off = "" if vector_copy else "turned off"
        # The WAL is checkpointed after the writes, not inside them (``_committed``).
        self._own_commits = 0  # this process's, counted on the writer's thread
        self._commits = 0  # since the last checkpoint
        self._changes_at_checkpoint = 0
        self._checkpoint_behind = False  # the last one did not reach the WAL's end
        self._closing = False  # close() has begun
        self._connector = connector  # for the checkpoints' connection, opened when needed
        self._checkpointer: aiosqlite.Connection | None = None
        self._checkpointing: asyncio.Task[None] | None = None
        # Vector rows of retired records wait to be deleted (``vectors.announce_retired``).
        self._retired_waiting = False

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
        chosen = driver if isinstance(driver, Driver) else await cached_driver(driver)
        await anyio.to_thread.run_sync(prepare_file, path, chosen, busy_timeout_ms)

        def connector() -> sqlite3.Connection:
            conn = chosen.connect(str(path), busy_timeout_ms=busy_timeout_ms)
            conn.execute("PRAGMA synchronous = NORMAL")
            return conn

        def writer_connector() -> sqlite3.Connection:
            conn = connector()
            conn.execute("PRAGMA wal_autocheckpoint = 0")  # after the writes (_committed)
            # a WAL that a long read let grow is cut back when it starts over
            conn.execute(f"PRAGMA journal_size_limit = {_WAL_KEEP_BYTES}")
            conn.executescript(postings.WORDS_WRITTEN)  # the texts each write changes
            return conn

        writer = Pipelined(writer_connector, iter_chunk_size=256)
        await writer  # its thread starts, the connection opens
        reader = await aiosqlite.Connection(connector, iter_chunk_size=256)
        store = cls(
            path,
            chosen,
            writer,
            reader,
            vector_copy=vector_copy,
            busy_timeout_ms=busy_timeout_ms,
            clock=clock,
            connector=connector,
        )
        # what a process that ended before it swept left (``sweep_vectors``)
        waiting = await reader.execute_fetchall(RETIRED_ANY_SQL)
        store._retired_waiting = bool(list(waiting)) and chosen.vectors
        return store

    @property
    def backend(self) -> str:
        return "sqlite"

    @property
    def user(self) -> str:
        return local_user()

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
        held = f"in-memory copy, {self.vector_copy_bytes / 1e6:.1f} MB loaded"
        filed = sum(i.file_bytes for i in self._copies.values())
        return f"{held} (and {filed / 1e6:.1f} MB in files)" if filed else held

    @property
    def vector_copy_bytes(self) -> int:
        """The memory the in-memory copy of the vectors holds now."""
        return sum(i.nbytes for i in self._copies.values())

    @property
    def vectors_available(self) -> bool:
        return self.driver.vectors

    async def close(self) -> None:
        with anyio.CancelScope(shield=True):
            self._closing = True  # a write still finishing starts no checkpoint of its own
            await self._stop_clusterings(list(self._copies.values()))
            if self._checkpointing is not None:
                await self._checkpointing
            if self._commits:
                await self._checkpoint()  # what it committed since the last one
            if self._checkpointer not in (None, self._writer):
                await self._checkpointer.close()
            await self._writer.close()
            await self._reader.close()

    @asynccontextmanager
    async def write(self) -> AsyncIterator[Transaction]:
        """A write transaction holding the database's write lock (all processes)."""
        async with self._write_lock:
            try:
                # shielded: the writer's thread begins it even if this is cancelled while
                # BEGIN waits for another process's lock, and the rollback below must end it
                with anyio.CancelScope(shield=True):
                    began, words, retired = await on_thread(self._writer, self._begin)
            except OPERATIONAL_ERRORS as exc:
                raise storage_error(exc) from exc
            pending = dict(self._tables)
            try:
                tx = Transaction(self._writer, self, began)
                tx.words_before = words
                tx.retired_after = retired
                yield tx
                with anyio.CancelScope(shield=True):
                    await on_thread(self._writer, self._commit, tx)
            except BaseException as exc:
                self._writer.discard()  # the queued writes it would have sent
                with anyio.CancelScope(shield=True):
                    if self._writer.in_transaction:  # SQLite may have rolled back already
                        await self._writer.execute("ROLLBACK")
                self._tables = pending
                if isinstance(exc, OPERATIONAL_ERRORS):  # from a routine, or the commit
                    raise storage_error(exc) from exc
                raise
            self._apply_written(tx.journal)
            self._committed()

    def _committed(self) -> None:
        """Count a commit: after ``_CHECKPOINT_COMMITS`` commits, or
        ``_CHECKPOINT_CHANGES`` rows written (an import's batches), a checkpoint of
        the WAL starts in the background (``_checkpoint``), unless one still runs.

        The writer does not checkpoint at its commits (``wal_autocheckpoint = 0``):
        SQLite's own, every 1,000 pages (about 13 stores), copied them into the
        database and waited for the disk inside a store's commit, the most of a
        store's p95 (22-24 ms at 50,000 memories, 16.6-18 ms without).
        """
        self._commits += 1
        changed = self._writer.total_changes - self._changes_at_checkpoint
        due = self._commits >= _CHECKPOINT_COMMITS or changed >= _CHECKPOINT_CHANGES
        if not (due or self._checkpoint_behind) or self._closing:
            return
        if self._checkpointing is None or self._checkpointing.done():
            self._commits, self._changes_at_checkpoint = 0, self._writer.total_changes
            self._checkpointing = asyncio.get_running_loop().create_task(self._checkpoint())

    async def _checkpoint(self) -> None:
        """Checkpoint the WAL holding this process's write lock: with no write of its own
        meanwhile, a checkpoint can reach the WAL's end, and the next write starts the
        WAL over instead of growing it (one beside the writes never did: 7.6 GB of WAL
        after 40,000 imported memories). The write that comes next waits for it, not
        the one before. It runs on a connection of its own, so that the writer's thread
        stays free for the next write's mark (``write_mark``)."""
        try:
            async with self._write_lock:
                if self._checkpointer is None:
                    connector = self._connector
                    self._checkpointer = (
                        self._writer
                        if connector is None
                        else await aiosqlite.Connection(connector, iter_chunk_size=64)
                    )
                rows = list(
                    await self._checkpointer.execute_fetchall("PRAGMA wal_checkpoint(PASSIVE)")
                )
            busy, frames, copied = rows[0] if rows else (0, -1, -1)
            # A read of an older snapshot (another process's, or this one's reader)
            # kept it from the WAL's end: the next commit tries again, as SQLite's own
            # checkpoint does at every commit while the WAL is long.
            self._checkpoint_behind = bool(busy) or frames > copied
        except OPERATIONAL_ERRORS as exc:  # busy, or the disk: the next one tries again
            log.info("checkpoint of %s put off: %s", self.path, exc)
        except Exception:  # never the writes' concern, nor close's
            log.warning("checkpoint of %s failed", self.path, exc_info=True)

    def _begin(self, conn: sqlite3.Connection) -> tuple[tuple[int, int], bytes, int]:
        """Begin a write transaction on the writer's thread, with its ``write_mark``,
        FTS5's structure at its start (``_words_written``) and the last entry of the
        retired vectors' queue (``vectors.announce_retired``)."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(postings.WORDS_CLEAR_SQL)  # what a rolled-back one left
            retired = int(conn.execute(RETIRED_MAX_SQL).fetchone()[0])
            return self._mark(conn), postings.fts_structure(conn), retired
        except BaseException:  # no transaction left open to hold the lock
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _commit(self, conn: sqlite3.Connection, tx: Transaction) -> None:
        """End a write transaction on the writer's thread, in one round trip: its queued
        writes first (``Pipelined``), then make the postings of the records it queued
        (``postings``), announce that the vectors its retired records held are gone
        (deleted later: ``sweep_vectors``), and commit."""
        if tx.failure is not None:  # a queued write failed with a call that went on
            raise tx.failure
        postings.index_due_sync(conn)
        announce_retired(conn, tx.journal, tx.retired_after)
        waiting = False  # without sqlite-vec, the rows wait for a process with it
        if self.driver.vectors:
            delete_revived(conn, self._table_names(conn))
            waiting = conn.execute(RETIRED_ANY_SQL).fetchone() is not None
        texts = conn.execute(postings.WORDS_WRITTEN_SQL).fetchall()
        conn.execute("COMMIT")
        self._retired_waiting = waiting
        self._own_commits += 1
        self._words_written(conn, tx, texts)

    def _words_written(self, conn: sqlite3.Connection, tx: Transaction, texts: list[Any]) -> None:
        """Tell the word counts (``WordCounts.written``) which texts a committed write
        changed, if nothing else was committed since it began: FTS5's structure now is
        then what this write made of it. Searches after a store then count none of their
        words again (a search's words counted again took 2.3 ms at 200,000 memories)."""
        try:
            after = postings.fts_structure(conn)
            version = int(conn.execute("PRAGMA data_version").fetchone()[0])
        except Exception:  # committed all the same: the counts start over
            log.info("word counts of %s: counted again after a write", self.path, exc_info=True)
            return
        began = tx.began
        if tx.words_before is not None and isinstance(began, tuple) and began[0] == version:
            self._word_counts.written(tx.words_before, after, postings.text_changes(texts))

    async def write_mark(self) -> object | None:
        """What has been committed, as the writer sees it (``_mark``)."""
        return await self._writer.unqueued(self._mark)  # an open transaction's queue stays

    def _mark(self, conn: sqlite3.Connection) -> tuple[int, int]:
        """The writer's ``PRAGMA data_version``, which every other connection's commit
        changes, and this process's own commits: both read on the writer's thread,
        so a transaction can tell at its start (``_begin``) whether anything was
        committed since a mark without asking again."""
        return int(conn.execute("PRAGMA data_version").fetchone()[0]), self._own_commits

    # Reads ---------------------------------------------------------------------------

    async def lexical(
        self, text: str, filters: Filters, k: int, *, rare_words: bool = False
    ) -> list[Scored]:
        return await self.reads.lexical(text, filters, k, rare_words=rare_words)

    async def nearest(
        self, vector: Vector, embedder: str, filters: Filters, k: int, *, exact: bool = False
    ) -> list[Scored]:
        return await self.reads.nearest(vector, embedder, filters, k, exact=exact)

    async def dense_scores(
        self, vector: Vector, embedder: str, record_ids: Sequence[str]
    ) -> dict[str, float]:
        return await self.reads.dense_scores(vector, embedder, record_ids)

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
        return await self.reads.nearest_with_scores(
            vector, embedder, filters, k, record_ids, probes=probes, ahead=ahead
        )

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
        return await self.reads.candidate_reads(
            vector,
            embedder,
            filters,
            k,
            record_ids,
            within_seconds=within_seconds,
            conflicts=conflicts,
            probes=probes,
            ahead=ahead,
        )

    async def in_conversation(
        self, record_ids: Sequence[str], within_seconds: float, embedder: str
    ) -> dict[str, Around]:
        return await self.reads.in_conversation(record_ids, within_seconds, embedder)

    async def current(self, filters: Filters, limit: int, offset: int = 0) -> list[Record]:
        return await self.reads.current(filters, limit, offset)

    async def record_counts(self, filters: Filters) -> list[RecordCount]:
        return await rows.record_counts(self.reads.fetch, filters_sql, filters)

    async def find_by_hash(self, content_hash: str, filters: Filters) -> list[Record]:
        return await self.reads.find_by_hash(content_hash, filters)

    async def top_by_prior(
        self, filters: Filters, ranking: RankerConfig, now: datetime, limit: int
    ) -> list[tuple[Record, float]]:
        """Current records by ``ranker.prior``, highest first, with it (``rows.top_by_prior``:
        from the records worth the most, not every record's prior)."""
        return await rows.top_by_prior(
            self.reads.fetch, filters_sql, SQLITE, filters, ranking, now, limit
        )

    async def get(self, record_id: str) -> Record | None:
        found = await self.get_many([record_id])
        return found[0] if found else None

    async def get_many(self, record_ids: Sequence[str]) -> list[Record]:
        if not record_ids:
            return []
        rows = await self.reads.fetch(
            f"SELECT {SELECT} FROM records r WHERE r.id IN ({marks(record_ids)})", list(record_ids)
        )
        by_id = {row[0]: record_of(row) for row in rows}
        return [by_id[i] for i in record_ids if i in by_id]

    async def record_access(self, accesses: Mapping[str, tuple[int, str]]) -> None:
        """Count returned hits as accesses (ranking and staleness read these)."""
        if not accesses:
            return
        async with self.write() as tx:
            await tx.execute_many(
                "UPDATE records SET access_count = access_count + ?, "
                "last_access_at = max(coalesce(last_access_at, ?), ?) WHERE id = ?",
                [(times, at, at, record_id) for record_id, (times, at) in accesses.items()],
            )

    async def needing_embedding(self, embedder: str, limit: int) -> list[Record]:
        """Current records whose vectors are missing or from another embedder, oldest first."""
        rows = await self.reads.fetch(
            f"SELECT {SELECT}, r.seq FROM records r "
            "WHERE r.live = 1 AND (r.embedder IS NULL OR r.embedder != ? OR r.vectors_due = 1) "
            "ORDER BY r.seq LIMIT ?",
            [embedder, limit],
        )
        return [record_of(row) for row in rows]

    async def count_needing_embedding(
        self, embedder: str | None, *, incomplete: bool = True
    ) -> int:
        if embedder is None:
            return 0
        rows = await self.reads.fetch(*awaiting_sql(embedder, incomplete))
        return int(rows[0][0])

    async def dense_embedders(self) -> dict[str, int]:
        """Embedders that have vectors in this store, with their record counts."""
        rows = await self.reads.fetch(
            "SELECT embedder, count(*) FROM records WHERE embedder IS NOT NULL GROUP BY embedder"
        )
        return {str(name): int(n) for name, n in rows}

    @property
    def vectors_to_sweep(self) -> bool:
        return self._retired_waiting

    async def sweep_vectors(self, most: int) -> int:
        """Delete about ``most`` vec0 rows of retired records (a record's at least),
        announced gone by the commits that retired them (``vectors.announce_retired``):
        how many records'. Never without sqlite-vec: the rows wait for a process that
        can delete them."""
        if not self._retired_waiting or not self.driver.vectors:
            return 0

        def sweep(conn: sqlite3.Connection) -> int:
            return delete_retired(conn, self._table_names(conn), most)

        async with self.write():
            done = await on_thread(self._writer, sweep)
        return done

    async def iter_records(self, *, batch: int = 500) -> AsyncIterator[Record]:
        """Every record, archived and history included, in write order."""
        after = 0
        while True:
            rows = await self.reads.fetch(
                f"SELECT {SELECT}, r.seq FROM records r WHERE r.seq > ? ORDER BY r.seq LIMIT ?",
                [after, batch],
            )
            if not rows:
                return
            for row in rows:
                yield record_of(row)
            after = int(rows[-1][-1])

    async def vectors_of(self, record_id: str, embedder: str) -> Vector | None:
        """A current record's passage vectors from ``embedder`` (whole text first), if any."""
        import numpy as np

        rows = await self.reads.fetch(
            "SELECT seq, vec_rows FROM records WHERE id = ? AND +embedder = ? AND vec_rows > 0",
            [record_id, embedder],
        )
        table = self._tables.get(embedder) or await self._vector_table(self._reader, embedder)
        if not rows or table is None:
            return None
        seq, count = int(rows[0][0]), int(rows[0][1])
        found = await self.reads._vectors_vec0(table, rowids_of(seq, count))
        if not found:
            return None
        return np.stack(list(found.values()))

    async def now(self) -> datetime:
        """The store's time: SQLite runs in this process, on this machine's clock."""
        return self._clock()

    async def doctor(self, *, repair: bool = False) -> Diagnosis:
        from memory_mcp.storage.sqlite.doctor import diagnose

        return await diagnose(self, repair=repair)

    async def prepare_team(self, embedder: str | None, dim: int | None) -> list[str]:
        raise InvalidInput(_NO_TEAM)

    async def add_member(self, name: str, password: str | None) -> str:
        raise InvalidInput(_NO_TEAM)

    async def backup(self, target: Path, *, force: bool = False) -> Path:
        from memory_mcp.storage.sqlite.doctor import backup

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
        rows = await self.reads.fetch(
            "SELECT corpus, scope, CASE WHEN archived_at IS NOT NULL THEN 'archived' "
            "WHEN replaced_by IS NOT NULL THEN 'history' ELSE 'current' END AS state, count(*) "
            "FROM records GROUP BY corpus, scope, state"
        )
        stats.records = {(c, s, st): int(n) for c, s, st, n in rows}
        stats.embedders = await self.dense_embedders()
        for table, embedder, dim in await self.reads.fetch(
            "SELECT table_name, embedder, dim FROM vector_indexes ORDER BY table_name"
        ):
            if not TABLE_NAME.match(table):
                continue
            count = await self.reads.fetch(f"SELECT count(*) FROM {table}")
            stats.vector_indexes.append((table, embedder, int(dim), int(count[0][0])))
        conflicts = await self.reads.fetch(
            "SELECT count(*) FROM conflicts WHERE resolved_at IS NULL"
        )
        stats.open_conflicts = int(conflicts[0][0])
        stats.database_bytes = sum(
            p.stat().st_size
            for p in (self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm"))
            if p.exists()
        )
        from memory_mcp.storage.sqlite.dense import folder_bytes

        stats.cache_bytes = await anyio.to_thread.run_sync(folder_bytes, self.kept_folder)
        return stats

    def forget_word_counts(self) -> None:
        """Drop the cached record counts of words (the write path's rare words)."""
        self._word_counts.forget()

    async def analyze(self) -> None:
        """Nothing: the statements name their indexes and join order themselves."""
