"""``PgStore``: the connection pool, the write lock, and the store-wide reads."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from memory_mcp.errors import StorageError
from memory_mcp.ranker import RankerConfig
from memory_mcp.records import Record, format_time, utcnow
from memory_mcp.storage import rows
from memory_mcp.storage.base import (
    IVF_PROBES,
    Diagnosis,
    Filters,
    RecordCount,
    StoreStats,
)
from memory_mcp.storage.bm25 import CountCache
from memory_mcp.storage.factory import redacted
from memory_mcp.storage.postgres.migrations import WRITE_LOCK, migrate
from memory_mcp.storage.postgres.queries import Queries
from memory_mcp.storage.postgres.sql import filters_sql, probes_sql, storage_error
from memory_mcp.storage.postgres.transaction import Transaction, WriteMark
from memory_mcp.storage.postgres.upkeep import UpkeepReads
from memory_mcp.storage.postgres.vector_index import (
    SPACES_SQL,
    Rebuilder,
    build_statements,
    index_name,
    spaces_due,
)
from memory_mcp.storage.rows import POSTGRES, SELECT, record_of

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import AsyncConnectionPool

log = logging.getLogger(__name__)

DEFAULT_SCHEMA = "memory_mcp"
_POOL_SIZE = 4
_CONNECT_TIMEOUT = 10  # seconds


class PgStore(UpkeepReads, Queries):
    """A store in a PostgreSQL database with pgvector (team mode)."""

    def __init__(
        self,
        url: str,
        schema: str,
        pool: AsyncConnectionPool[Any],
        *,
        server: str,
        vector_version: str,
        search_path: str,
        role: str = "",
        busy_timeout_ms: int = 15000,
    ) -> None:
        self.url = url
        self.schema = schema
        self._pool = pool
        self._server = server
        self._vector_version = vector_version
        self._role = role
        self.busy_timeout_ms = busy_timeout_ms
        self._store = self
        self._write_lock = anyio.Lock()
        self._spaces: dict[str, tuple[int, int]] = {}  # embedder -> (space, dimension)
        self.indexes = Rebuilder(url, search_path)
        self.word_counts = CountCache()  # a memory's rarest words (``document_counts``)

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        busy_timeout_ms: int = 15000,
        backup_dir: Path | None = None,
    ) -> PgStore:
        """Connect to the database ``url`` names, prepare and migrate ``schema``.

        Credentials come from the URL, the environment (``PGPASSWORD``…) or
        libpq's password file; none is ever shown (``factory.redacted``).
        ``backup_dir`` receives a backup (``dump.FORMAT``) before a pending
        migration runs on a schema that holds one already.

        Raises:
            StorageError: the server cannot be reached, refuses, or cannot be migrated.
        """
        import psycopg
        from psycopg_pool import AsyncConnectionPool

        shown = redacted(url)
        try:
            conn = await psycopg.AsyncConnection.connect(
                url, autocommit=True, connect_timeout=_CONNECT_TIMEOUT
            )
        except psycopg.Error as exc:
            raise StorageError(f"cannot connect to {shown}: {exc}") from exc
        try:
            async with conn:
                await conn.execute(f"SET search_path TO {_ident(schema)}, public".encode())
                applied = await migrate(
                    conn, schema, backup=_backup_before(url, schema, backup_dir)
                )
                if applied:
                    log.info("applied migrations to %s: %s", shown, ", ".join(applied))
                cursor = await conn.execute(
                    "SELECT current_setting('server_version'), e.extversion, n.nspname, "
                    "session_user FROM pg_extension e "
                    "JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'vector'"
                )
                server, vector_version, extension_schema, role = await _one(cursor)
        except psycopg.Error as exc:
            raise StorageError(f"cannot use the database at {shown}: {exc}") from exc
        path = f"{_ident(schema)}, {_ident(str(extension_schema))}"

        async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
            from pgvector.psycopg import register_vector_async

            await conn.execute(
                f"SET search_path TO {path}; SET ivfflat.probes = {IVF_PROBES}".encode()
            )
            await register_vector_async(conn)

        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            url,
            min_size=1,
            max_size=_POOL_SIZE,
            open=False,
            kwargs={"autocommit": True, "connect_timeout": _CONNECT_TIMEOUT},
            configure=configure,
            name="memory-mcp",
        )
        try:
            await pool.open(wait=True, timeout=_CONNECT_TIMEOUT)
        except Exception as exc:
            await pool.close()
            raise StorageError(f"cannot open connections to {shown}: {exc}") from exc
        store = cls(
            url,
            schema,
            pool,
            server=str(server),
            vector_version=str(vector_version),
            search_path=path,
            role=str(role),
            busy_timeout_ms=busy_timeout_ms,
        )
        async with store.write() as tx:
            await store.ensure_indexes(tx)
        return store

    @property
    def backend(self) -> str:
        return "postgres"

    @property
    def user(self) -> str:
        return self._role

    @property
    def location(self) -> str:
        shown = redacted(self.url)
        return shown if self.schema == DEFAULT_SCHEMA else f"{shown} (schema {self.schema})"

    @property
    def details(self) -> str:
        return f"PostgreSQL {self._server}, pgvector {self._vector_version} (ivfflat, cosine)"

    @property
    def vectors_available(self) -> bool:
        return True

    async def close(self) -> None:
        self.indexes.close()
        with anyio.CancelScope(shield=True):
            await self._pool.close()

    async def fetch(
        self,
        sql: str,
        params: Sequence[Any] = (),
        *,
        binary: bool = False,
        probes: int | None = None,
    ) -> list[Any]:
        """One statement's rows, on a pooled connection; with ``probes``, ivfflat's for
        this statement (in a transaction of its own: ``SET LOCAL`` ends with it)."""
        import psycopg

        try:
            async with self._pool.connection() as conn:
                if probes is not None:
                    await conn.execute(f"BEGIN; {probes_sql(probes)}".encode())
                try:
                    cursor = await conn.cursor(binary=binary).execute(sql.encode(), params)
                    return await cursor.fetchall() if cursor.description else []
                finally:
                    if probes is not None:
                        await conn.execute(b"ROLLBACK")  # it wrote nothing
        except psycopg.Error as exc:
            raise storage_error(exc) from exc

    @asynccontextmanager
    async def write(self) -> AsyncIterator[Transaction]:
        """A transaction holding the store's write lock, for every process on the database.

        The lock is one transaction-scoped advisory lock for the whole store
        (``pg_advisory_xact_lock``): ``write()`` is not told which scope it will
        write, a fold decision reads the global scope beside the project's, and
        maintenance writes across scopes; so, as SQLite's ``BEGIN IMMEDIATE``,
        one writer at a time, each for milliseconds. Statements after the lock
        see every write committed before it (READ COMMITTED).
        """
        import psycopg
        from psycopg import errors

        async with self._write_lock:
            spaces = dict(self._spaces)
            try:
                async with self._pool.connection() as conn, conn.transaction():
                    try:  # one round trip: three statements, two of them constant
                        await conn.execute(
                            f"SELECT set_config('lock_timeout', '{int(self.busy_timeout_ms)}ms', "
                            f"true); SELECT pg_advisory_xact_lock({WRITE_LOCK}); "
                            "SELECT set_config('lock_timeout', '0', true)".encode()
                        )
                    except errors.LockNotAvailable as exc:
                        raise StorageError(
                            "the database is busy: another memory-mcp process held its write "
                            "lock longer than storage.busy_timeout_ms"
                        ) from exc
                    yield Transaction(conn, self)
            except psycopg.Error as exc:
                self._spaces = spaces
                raise storage_error(exc) from exc
            except BaseException:
                self._spaces = spaces
                raise

    # Vector spaces -------------------------------------------------------------------

    async def space(
        self, reads: Queries, embedder: str, *, dim: int | None = None
    ) -> tuple[int, int] | None:
        """The vector space (number, dimension) of ``embedder``; made in the caller's
        transaction when ``dim`` is given and there is none (its index comes once it
        holds enough rows: ``vector_index``)."""
        known = self._spaces.get(embedder)
        if known is None:
            rows = await reads.fetch(
                "SELECT id, dim FROM vector_indexes WHERE embedder = %s", [embedder]
            )
            if rows:
                known = (int(rows[0][0]), int(rows[0][1]))
                self._spaces[embedder] = known
        if known is not None:
            if dim is not None and dim != known[1]:
                raise StorageError(
                    f"embedder {embedder} returned {dim}-dimensional vectors, but its index "
                    f"holds {known[1]}; give a changed model a new name"
                )
            return known
        if dim is None:
            return None
        if not isinstance(reads, Transaction):
            raise StorageError("a vector index is made only inside a write transaction")
        rows = await reads.fetch(
            "INSERT INTO vector_indexes (embedder, dim, created_at) VALUES (%s, %s, %s) "
            "RETURNING id",
            [embedder, dim, format_time(utcnow())],
        )
        known = (int(rows[0][0]), dim)
        self._spaces[embedder] = known
        return known

    async def ensure_indexes(self, tx: Transaction, *, grown: bool = False) -> list[str]:
        """Build, in this transaction, the ivfflat index of every vector space that holds
        rows enough for one and has none (a restored copy, an upgraded store), and with
        ``grown`` also those that outgrew theirs (``vector_index.due``); their names."""
        made = []
        for space, dim, lists in spaces_due(await tx.fetch(SPACES_SQL, [grown])):
            log.info("building %s with %d lists", index_name(space), lists)
            if not await tx.make_index(build_statements(space, dim, lists, concurrently=False)):
                log.warning(
                    "no vector index for the %d-dimensional vectors yet (searches read "
                    "every row): this role may not create indexes; `memory-mcp team init` "
                    "as the database's owner makes it",
                    dim,
                )
                break
            made.append(index_name(space))
        return made

    async def load_vectors(
        self, embedder: str, scope_keys: Collection[str], *, settle: float = 0.0
    ) -> bool:
        """Nothing to warm (the index lives in the database), but build it again in the
        background if the space has outgrown it (``vector_index.Rebuilder``)."""
        running = self.indexes.check()
        if running is None or settle <= 0:
            return running is None
        return await anyio.to_thread.run_sync(self.indexes.wait, settle, abandon_on_cancel=True)

    async def write_mark(self) -> object | None:
        """The database's snapshot now (``pg_current_snapshot()``, as text): a write
        transaction tells from it whether anything was committed since
        (``Transaction.unchanged_since``), so that a store's reads made before it (a
        new memory's rarest words, beside the model) stand under it."""
        rows = await self.fetch("SELECT pg_current_snapshot()::text")
        return WriteMark(self, str(rows[0][0]))

    # Reads ---------------------------------------------------------------------------

    async def top_by_prior(
        self, filters: Filters, ranking: RankerConfig, now: datetime, limit: int
    ) -> list[tuple[Record, float]]:
        """Current records by ``ranker.prior``, highest first, with it (``rows.top_by_prior``:
        from the records worth the most, not every record's prior)."""
        return await rows.top_by_prior(
            self.fetch, filters_sql, POSTGRES, filters, ranking, now, limit
        )

    async def record_counts(self, filters: Filters) -> list[RecordCount]:
        return await rows.record_counts(self.fetch, filters_sql, filters)

    async def get_many(self, record_ids: Sequence[str]) -> list[Record]:
        if not record_ids:
            return []
        rows = await self.fetch(
            f"SELECT {SELECT} FROM records r WHERE r.id = ANY(%s)", [list(record_ids)]
        )
        by_id = {row[0]: record_of(row) for row in rows}
        return [by_id[i] for i in record_ids if i in by_id]

    async def record_access(self, accesses: Mapping[str, tuple[int, str]]) -> None:
        """Count returned hits as accesses (ranking and staleness read these)."""
        if not accesses:
            return
        ids = list(accesses)
        async with self.write() as tx:
            # A search need not wait for its access counts to reach the disk (10 ms a
            # search at 1,000 memories here): a crash may lose the last few counts, as
            # SQLite's WAL (synchronous NORMAL) may; it never loses a memory.
            await tx.execute("SET LOCAL synchronous_commit TO off")
            await tx.execute(
                "UPDATE records r SET access_count = r.access_count + a.times, "
                "last_access_at = GREATEST(coalesce(r.last_access_at, a.at), a.at) "
                "FROM unnest(%s::text[], %s::int[], %s::text[]) AS a (id, times, at) "
                "WHERE r.id = a.id",
                [ids, [accesses[i][0] for i in ids], [accesses[i][1] for i in ids]],
            )

    def forget_word_counts(self) -> None:
        self.word_counts.forget()

    async def prune_caches(self) -> int:
        """Nothing: the server keeps nothing beside the database."""
        return 0

    async def analyze(self) -> None:
        """ANALYZE the tables an import fills. Until autovacuum gets to them (up to a
        minute), the planner knows them as the migrations left them, empty: searches
        right after importing 1,000 memories had p95 456-495 ms in eight runs of
        twelve (their lexical statement 220-230 ms), 17-18 / 24-25 ms once analyzed.
        A table the role may not analyze is skipped (a warning)."""
        await self.fetch(
            "ANALYZE records, record_terms, term_counts, posting_lists, postings, vectors"
        )

    async def needing_embedding(self, embedder: str, limit: int) -> list[Record]:
        rows = await self.fetch(
            f"SELECT {SELECT} FROM records r WHERE r.live "
            "AND (r.embedder IS NULL OR r.embedder <> %s OR r.vectors_due = 1) "
            "ORDER BY r.seq LIMIT %s",
            [embedder, limit],
        )
        return [record_of(row) for row in rows]

    async def count_needing_embedding(
        self, embedder: str | None, *, incomplete: bool = True
    ) -> int:
        if embedder is None:
            return 0
        # as ranges of records_embedder (embedder, live), as SQLite's (sql.awaiting_sql)
        missing = (
            "SELECT count(*) FROM records WHERE live "
            "AND (embedder IS NULL OR embedder < %s OR embedder > %s)"
        )
        due = "SELECT count(*) FROM records WHERE vectors_due = 1 AND live AND embedder = %s"
        sql = f"SELECT ({missing}) + ({due})" if incomplete else missing
        rows = await self.fetch(sql, [embedder] * (3 if incomplete else 2))
        return int(rows[0][0])

    async def dense_embedders(self) -> dict[str, int]:
        rows = await self.fetch(
            "SELECT embedder, count(*) FROM records WHERE embedder IS NOT NULL GROUP BY embedder"
        )
        return {str(name): int(n) for name, n in rows}

    @property
    def vectors_to_sweep(self) -> bool:
        """Never: a record's vectors go with it in the transaction that retires it."""
        return False

    async def sweep_vectors(self, most: int) -> int:
        return 0

    async def iter_records(self, *, batch: int = 500) -> AsyncIterator[Record]:
        """Every record, archived and history included, in write order."""
        after = 0
        while True:
            rows = await self.fetch(
                f"SELECT {SELECT}, r.seq FROM records r WHERE r.seq > %s ORDER BY r.seq LIMIT %s",
                [after, batch],
            )
            if not rows:
                return
            for row in rows:
                yield record_of(row)
            after = int(rows[-1][-1])

    async def now(self) -> datetime:
        """The database server's clock: every process measures leases by it."""
        rows = await self.fetch("SELECT clock_timestamp()")
        value: datetime = rows[0][0]
        return value

    # Admin ---------------------------------------------------------------------------

    async def stats(self) -> StoreStats:
        stats = StoreStats()
        rows = await self.fetch(
            "SELECT corpus, scope, CASE WHEN archived_at IS NOT NULL THEN 'archived' "
            "WHEN replaced_by IS NOT NULL THEN 'history' ELSE 'current' END AS state, count(*) "
            "FROM records GROUP BY corpus, scope, state"
        )
        stats.records = {(c, s, st): int(n) for c, s, st, n in rows}
        stats.embedders = await self.dense_embedders()
        for number, embedder, dim, count in await self.fetch(
            "SELECT i.id, i.embedder, i.dim, (SELECT count(*) FROM vectors v "
            "WHERE v.space = i.id) FROM vector_indexes i ORDER BY i.id"
        ):
            stats.vector_indexes.append((index_name(int(number)), embedder, dim, int(count)))
        conflicts = await self.fetch("SELECT count(*) FROM conflicts WHERE resolved_at IS NULL")
        stats.open_conflicts = int(conflicts[0][0])
        size = await self.fetch(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r'"
        )
        stats.database_bytes = int(size[0][0])
        return stats

    async def doctor(self, *, repair: bool = False) -> Diagnosis:
        from memory_mcp.storage.postgres.doctor import diagnose

        return await diagnose(self, repair=repair)

    async def prepare_team(self, embedder: str | None, dim: int | None) -> list[str]:
        from memory_mcp.storage.postgres.team import prepare

        return await prepare(self, embedder, dim)

    async def add_member(self, name: str, password: str | None) -> str:
        from memory_mcp.storage.postgres.team import add_member

        return await add_member(self, name, password)

    async def backup(self, target: Path, *, force: bool = False) -> Path:
        from memory_mcp.storage.postgres.doctor import backup

        return await backup(self, target, force=force)

    @asynccontextmanager
    async def scratch_copy(self) -> AsyncIterator[PgStore]:
        """A copy of the store of this moment in a schema of its own, dropped on exit."""
        from memory_mcp.storage.postgres.doctor import copy_schema

        schema = f"{self.schema}_dry_run_{uuid.uuid4().hex[:8]}"
        try:
            copy = await PgStore.open(self.url, schema=schema, busy_timeout_ms=self.busy_timeout_ms)
            try:
                await copy_schema(self, copy)
                yield copy
            finally:
                await copy.close()
        finally:
            with anyio.CancelScope(shield=True):
                await self.fetch(f"DROP SCHEMA IF EXISTS {_ident(schema)} CASCADE")

    def connection(self) -> Any:
        """A pooled connection (``async with``), for the doctor's copies."""
        return self._pool.connection()


def _backup_before(
    url: str, schema: str, folder: Path | None
) -> Callable[[str], Awaitable[Path]] | None:
    """What ``migrate`` calls to back ``schema`` up before a migration (None: no folder)."""
    if folder is None:
        return None

    async def backup(migration: str) -> Path:
        import psycopg

        from memory_mcp.storage.postgres.dump import write_dump

        await anyio.to_thread.run_sync(partial(folder.mkdir, parents=True, exist_ok=True))
        stamp = utcnow().strftime("%Y%m%dT%H%M%S%fZ")
        target = folder / f"memory-{schema}-{stamp}-before-{migration}.sql"
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute(f"SET search_path TO {_ident(schema)}, public".encode())
            await write_dump(conn, schema, target)
        return target

    return backup


def _ident(name: str) -> str:
    """A schema name, quoted as an SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


async def _one(cursor: psycopg.AsyncCursor[Any]) -> Any:
    row = await cursor.fetchone()
    if row is None:
        raise StorageError("the pgvector extension is missing from the database")
    return row
