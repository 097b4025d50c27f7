"""Ordered, named, transactional, forward-only schema migrations.

Each migration runs in its own ``BEGIN IMMEDIATE`` transaction together with
its row in ``schema_migrations``, so a database is always on one schema or the
next, never half-way. Migrations apply at start-up; before the first pending
one runs on a database that already has data, the file is copied with SQLite's
online backup. A database that knows migrations this code does not is refused
(fail-closed) instead of being used by an older memory-mcp.

Vector tables are not created here: there is one per (embedder, dimension),
made when an embedder first writes (see ``sqlite.SqliteStore``). A record's
vectors are rows ``seq * MAX_PASSAGES + i`` for ``i < vec_rows`` of its
embedder's table.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from memory_mcp.errors import SchemaTooNew, StorageError
from memory_mcp.records import format_time, utcnow
from memory_mcp.storage.sqlite.driver import (
    DATABASE_ERRORS,
    ERRORS,
    OPERATIONAL_ERRORS,
    Driver,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Migration:
    name: str
    apply: Callable[[sqlite3.Connection], None]


def _statements(sql: str) -> list[str]:
    """Split a script into complete statements (trigger bodies hold semicolons too)."""
    statements: list[str] = []
    current = ""
    for line in sql.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            statements.append(current.strip())
            current = ""
    if current.strip():
        statements.append(current.strip())
    return statements


def _script(sql: str) -> Callable[[sqlite3.Connection], None]:
    statements = _statements(sql)

    def run(conn: sqlite3.Connection) -> None:
        # executescript() would COMMIT first; run statement by statement to stay
        # inside the migration's transaction.
        for statement in statements:
            conn.execute(statement)

    return run


M001_RECORDS = """
CREATE TABLE records (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    corpus TEXT NOT NULL CHECK (corpus IN ('facts', 'journal', 'docs', 'knowledge', 'insights')),
    kind TEXT NOT NULL,
    scope TEXT NOT NULL CHECK (scope IN ('project', 'global')),
    scope_key TEXT NOT NULL,
    content TEXT NOT NULL,
    content_hash TEXT NOT NULL,
    tags TEXT NOT NULL DEFAULT '[]',
    importance REAL CHECK (importance IS NULL OR (importance >= 0 AND importance <= 1)),
    pinned INTEGER NOT NULL DEFAULT 0,
    agent TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    access_count INTEGER NOT NULL DEFAULT 0,
    last_access_at TEXT,
    fold_count INTEGER NOT NULL DEFAULT 0,
    merged_from TEXT NOT NULL DEFAULT '[]',
    merged_text TEXT NOT NULL DEFAULT '',
    supersedes TEXT NOT NULL DEFAULT '[]',
    replaced_by TEXT,
    embedder TEXT,
    vec_rows INTEGER NOT NULL DEFAULT 0,
    meta TEXT NOT NULL DEFAULT '{}',
    archived_at TEXT,
    archived_reason TEXT,
    live INTEGER GENERATED ALWAYS AS (archived_at IS NULL AND replaced_by IS NULL) VIRTUAL,
    CHECK ((scope = 'global') = (scope_key = ''))
);
CREATE INDEX records_live ON records (scope_key, corpus, live, created_at);
CREATE INDEX records_hash ON records (scope_key, corpus, content_hash);
CREATE INDEX records_embedder ON records (embedder);
CREATE INDEX records_archived ON records (archived_at) WHERE archived_at IS NOT NULL;
CREATE VIRTUAL TABLE records_fts USING fts5(
    content, merged_text, tags,
    content = 'records', content_rowid = 'seq',
    tokenize = 'porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER records_fts_insert AFTER INSERT ON records BEGIN
    INSERT INTO records_fts (rowid, content, merged_text, tags)
    VALUES (new.seq, new.content, new.merged_text, new.tags);
END;
CREATE TRIGGER records_fts_delete AFTER DELETE ON records BEGIN
    INSERT INTO records_fts (records_fts, rowid, content, merged_text, tags)
    VALUES ('delete', old.seq, old.content, old.merged_text, old.tags);
END;
CREATE TRIGGER records_fts_update AFTER UPDATE OF content, merged_text, tags ON records BEGIN
    INSERT INTO records_fts (records_fts, rowid, content, merged_text, tags)
    VALUES ('delete', old.seq, old.content, old.merged_text, old.tags);
    INSERT INTO records_fts (rowid, content, merged_text, tags)
    VALUES (new.seq, new.content, new.merged_text, new.tags);
END;
-- Only current records have vectors. vec0 finds rows fast only by rowid
-- equality (a range or IN list scans the whole index), so a trigger queues the
-- vector rows of a record that stops being current, and the store deletes them
-- one rowid at a time before the same transaction commits.
CREATE TABLE retired_vectors (
    seq INTEGER NOT NULL,
    embedder TEXT NOT NULL,
    vec_rows INTEGER NOT NULL
);
CREATE TRIGGER records_retire_vectors AFTER UPDATE OF archived_at, replaced_by ON records
WHEN old.live = 1 AND new.live = 0 AND old.embedder IS NOT NULL BEGIN
    INSERT INTO retired_vectors (seq, embedder, vec_rows)
    VALUES (old.seq, old.embedder, old.vec_rows);
    UPDATE records SET embedder = NULL, vec_rows = 0 WHERE seq = old.seq;
END;
CREATE TRIGGER records_delete_vectors AFTER DELETE ON records
WHEN old.embedder IS NOT NULL AND old.vec_rows > 0 BEGIN
    INSERT INTO retired_vectors (seq, embedder, vec_rows)
    VALUES (old.seq, old.embedder, old.vec_rows);
END;
CREATE TABLE conflicts (
    id INTEGER PRIMARY KEY,
    scope_key TEXT NOT NULL,
    record_id TEXT NOT NULL,
    other_id TEXT NOT NULL,
    reason TEXT NOT NULL,
    created_at TEXT NOT NULL,
    resolved_at TEXT,
    resolution TEXT
);
CREATE INDEX conflicts_open ON conflicts (scope_key) WHERE resolved_at IS NULL;
CREATE TABLE vector_indexes (
    table_name TEXT PRIMARY KEY,
    embedder TEXT NOT NULL,
    dim INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    UNIQUE (embedder, dim)
);
CREATE TABLE store_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""


def _m002_emphasis(conn: sqlite3.Connection) -> None:
    """Store each record's emphatic-word count, so SQL can compute the ranker's prior.

    The index of current records by scope and corpus also carries every column
    the prior reads, so the spawn brief ranks 50,000 facts from the index alone.
    """
    from memory_mcp.records import emphasis

    conn.execute("ALTER TABLE records ADD COLUMN emphasis INTEGER NOT NULL DEFAULT 0")
    conn.execute("DROP INDEX records_live")
    conn.execute(
        "CREATE INDEX records_live ON records (scope_key, corpus, live, created_at, kind, "
        "importance, emphasis, pinned, fold_count, access_count, id)"
    )
    rows = conn.execute("SELECT seq, content FROM records").fetchall()
    conn.executemany(
        "UPDATE records SET emphasis = ? WHERE seq = ?",
        [(emphasis(content), seq) for seq, content in rows if emphasis(content)],
    )


M003_VECTOR_CHANGES = """
-- Every write or delete of a record's vectors, so that the in-memory copies of
-- the vector tables (storage/sqlite/dense.py) in every process can catch up.
CREATE TABLE vector_changes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    embedder TEXT NOT NULL,
    seq INTEGER NOT NULL
);
"""


M004_MAINTENANCE = """
-- One row per maintenance task (maintenance.py): the lease that lets one process
-- at a time run it, what its last run did, its back-off after a failure, and
-- where an incremental task stopped.
CREATE TABLE maintenance (
    task TEXT PRIMARY KEY,
    holder TEXT,
    lease_until TEXT,
    last_started_at TEXT,
    last_finished_at TEXT,
    last_summary TEXT NOT NULL DEFAULT '{}',
    last_error TEXT,
    failures INTEGER NOT NULL DEFAULT 0,
    retry_after TEXT,
    cursor TEXT NOT NULL DEFAULT '{}'
);
-- Activity in a scope that its records do not show (a restore), for staleness.
CREATE TABLE scope_activity (
    scope_key TEXT PRIMARY KEY,
    last_at TEXT NOT NULL
);
"""


M005_SCOPE_ALIASES = """
-- Scope keys read as another project's key (identity.py): the path keys a project had
-- before it was keyed by its identity, and keys an operator attached. Records keep the
-- key they were stored under. A detached alias keeps its row (detached_at), so that
-- automatic adoption does not attach it again; attaching it by hand clears it.
CREATE TABLE scope_aliases (
    alias TEXT PRIMARY KEY,
    key TEXT NOT NULL,
    attached_at TEXT NOT NULL,
    detached_at TEXT
);
CREATE INDEX scope_aliases_key ON scope_aliases (key);
"""


# Who wrote each record (the local login, or a team's database role) and whether it
# is theirs alone (team mode shows a private record to its writer only).
M006_USERS = """
ALTER TABLE records ADD COLUMN user_name TEXT NOT NULL DEFAULT '';
ALTER TABLE records ADD COLUMN private INTEGER NOT NULL DEFAULT 0;
"""


# A record stored with its whole text's vector only (``write``: one embedding on the
# hot path); its sentence windows follow after the acknowledgement, or from
# maintenance's re-embedding after a crash. The index finds them without a scan.
M007_VECTORS_DUE = """
ALTER TABLE records ADD COLUMN vectors_due INTEGER NOT NULL DEFAULT 0;
CREATE INDEX records_vectors_due ON records (seq) WHERE vectors_due = 1;
"""


def _m008_postings(conn: sqlite3.Connection) -> None:
    """The impact-ordered word index beside FTS5 (``postings``), for every current record."""
    from memory_mcp.storage.sqlite import postings

    _script(postings.SCHEMA)(conn)
    conn.execute("INSERT INTO postings_due (seq) SELECT seq FROM records WHERE live = 1")
    postings.index_due_sync(conn)


def _m009_worth(conn: sqlite3.Connection) -> None:
    """An index of each current record's worth (``rows.worth_sql``) by scope and corpus,
    from which the brief reads its top records without computing every prior."""
    from memory_mcp.storage.rows import WORTH_COVERS, worth_sql

    conn.execute(
        "CREATE INDEX records_worth ON records "
        f"(scope_key, corpus, live, {worth_sql(table='')} DESC, {WORTH_COVERS})"
    )


def _m010_postings_kind(conn: sqlite3.Connection) -> None:
    """Each posting keeps its record's kind (``postings.top_sql``: a search for some kinds
    walks their postings only). A database that m008 gave them already is left alone.

    The postings are copied with their records' kinds (a few seconds a million), in key
    order, into the table made again; the old one is renamed out of the way first, with
    the triggers that name ``postings`` left as they are.
    """
    from memory_mcp.storage.sqlite import postings

    if "kind" in {str(row[1]) for row in conn.execute("PRAGMA table_info(postings)")}:
        return
    legacy = conn.execute("PRAGMA legacy_alter_table").fetchone()[0]
    conn.execute("PRAGMA legacy_alter_table = ON")  # leaves the triggers' text as it is
    try:
        conn.execute("ALTER TABLE postings RENAME TO postings_before_kind")
    finally:
        conn.execute(f"PRAGMA legacy_alter_table = {int(legacy)}")
    conn.execute("DROP INDEX postings_seq")
    _script(postings.POSTINGS)(conn)
    conn.execute(
        "INSERT INTO postings (list, term, impact, seq, tf, dl, kind) "
        "SELECT p.list, p.term, p.impact, p.seq, p.tf, p.dl, r.kind "
        "FROM postings_before_kind p JOIN records r ON r.seq = p.seq"
    )
    conn.execute("DROP TABLE postings_before_kind")


def _m011_live_by_seq(conn: sqlite3.Connection) -> None:
    """``records_live`` orders each scope's records of one creation time by write order
    (``seq`` after ``created_at``), as a search's neighbours in time are ordered
    (``Queries.in_conversation``).

    Ordered by ``kind`` there, the index left each neighbour's look-up a sort of the
    rows of its record's creation time (a temporary b-tree per look-up): 1.25 ms of
    a search's 120 candidates at 200,000 memories, 0.92 ms with ``seq`` in place.
    Every other column stays, so the brief still ranks from the index alone.
    """
    conn.execute("DROP INDEX records_live")
    conn.execute(
        "CREATE INDEX records_live ON records (scope_key, corpus, live, created_at, seq, kind, "
        "importance, emphasis, pinned, fold_count, access_count, id)"
    )


def _m012_neighbours(conn: sqlite3.Connection) -> None:
    """Each current record's neighbours in time, in a table the triggers keep
    (``neighbours``): a search reads them instead of seeking them (0.76 ms of its
    120 candidates at 200,000 memories, 0.20 read). Made from the records: 1.5 s at
    262,000."""
    from memory_mcp.storage.sqlite import neighbours

    _script(neighbours.SCHEMA)(conn)
    for statement in neighbours.REBUILD:
        conn.execute(statement)


def _m013_embedder_live(conn: sqlite3.Connection) -> None:
    """``records_embedder`` holds ``live`` after the embedder: the records that await
    vectors are counted from it alone (``sql.awaiting_sql``: 0.1 ms instead of a scan of
    every record, 60-70 ms at 200,000 memories). 0.9 s at 294,000 records."""
    conn.execute("DROP INDEX records_embedder")
    conn.execute("CREATE INDEX records_embedder ON records (embedder, live)")


def _m014_embedder_held(conn: sqlite3.Connection) -> None:
    """``records_embedder`` also holds each record's scope, vector rows, corpus and
    kind, so that a scope's records with vectors (``dense.HELD``) are read from it
    alone: the check of a kept vector copy when a process starts read every record of
    the scope from the table, 1.3 s of a first search at 200,000 memories with the
    store's pages not yet cached (80 ms cached); 0.13 s from the index. 1.2 s at
    294,000 records."""
    conn.execute("DROP INDEX records_embedder")
    conn.execute(
        "CREATE INDEX records_embedder ON records "
        "(embedder, live, scope_key, vec_rows, corpus, kind)"
    )


MIGRATIONS: tuple[Migration, ...] = (
    Migration("m001_records", _script(M001_RECORDS)),
    Migration("m002_emphasis", _m002_emphasis),
    Migration("m003_vector_changes", _script(M003_VECTOR_CHANGES)),
    Migration("m004_maintenance", _script(M004_MAINTENANCE)),
    Migration("m005_scope_aliases", _script(M005_SCOPE_ALIASES)),
    Migration("m006_users", _script(M006_USERS)),
    Migration("m007_vectors_due", _script(M007_VECTORS_DUE)),
    Migration("m008_postings", _m008_postings),
    Migration("m009_worth", _m009_worth),
    Migration("m010_postings_kind", _m010_postings_kind),
    Migration("m011_live_by_seq", _m011_live_by_seq),
    Migration("m012_neighbours", _m012_neighbours),
    Migration("m013_embedder_live", _m013_embedder_live),
    Migration("m014_embedder_held", _m014_embedder_held),
)


def applied_migrations(conn: sqlite3.Connection) -> list[str]:
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
    ).fetchone()
    if not exists:
        return []
    return [row[0] for row in conn.execute("SELECT name FROM schema_migrations ORDER BY rowid")]


def migrate(
    conn: sqlite3.Connection,
    *,
    db_path: Path | None,
    connect: Callable[[str], sqlite3.Connection],
    migrations: tuple[Migration, ...] = MIGRATIONS,
) -> list[str]:
    """Apply pending migrations in order; return the names applied.

    Safe when several processes start at once: the check and each migration run
    under the write lock, so the second process finds the work done.

    Args:
        conn: an autocommit connection to the database.
        db_path: the database file (None for an in-memory database: no backup).
        connect: opens another connection with the same driver (for the backup).
        migrations: the migrations, in order.

    Raises:
        SchemaTooNew: the database has migrations this code does not know.
        StorageError: a migration failed (it was rolled back; nothing changed).
    """
    known = [m.name for m in migrations]
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations "
        "(name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)"
    )
    applied_now: list[str] = []
    backed_up = False
    for migration in migrations:
        conn.execute("BEGIN IMMEDIATE")
        try:
            done = applied_migrations(conn)
            unknown = [name for name in done if name not in known]
            if unknown:
                raise SchemaTooNew(
                    f"the database was migrated by a newer memory-mcp ({', '.join(unknown)}); "
                    "upgrade memory-mcp to use it"
                )
            if migration.name in done:
                conn.execute("COMMIT")
                continue
            if done and not applied_now and db_path is not None and not backed_up:
                backup = backup_before(db_path, migration.name, connect)
                log.warning("backed up %s to %s before migrating", db_path, backup)
                backed_up = True
            migration.apply(conn)
            conn.execute(
                "INSERT INTO schema_migrations (name, applied_at) VALUES (?, ?)",
                (migration.name, format_time(utcnow())),
            )
            conn.execute("COMMIT")
            applied_now.append(migration.name)
        except SchemaTooNew:
            conn.execute("ROLLBACK")
            raise
        except Exception as exc:
            conn.execute("ROLLBACK")
            raise StorageError(
                f"migration {migration.name} failed and was rolled back: {exc}"
            ) from exc
    return applied_now


def backup_before(
    db_path: Path, migration: str, connect: Callable[[str], sqlite3.Connection]
) -> Path:
    """Copy the database before ``migration`` runs; return the copy's path.

    The caller holds the write lock, and a second connection reads the last
    committed state (WAL), so the copy is exactly the pre-migration database.
    """
    stamp = utcnow().strftime("%Y%m%dT%H%M%S%fZ")
    target = db_path.with_name(f"{db_path.name}.backup-{stamp}-before-{migration}")
    copy_database(db_path, target, connect)
    return target


def copy_database(
    source_path: Path, target: Path, connect: Callable[[str], sqlite3.Connection]
) -> None:
    """A consistent copy of a database file (SQLite's online backup; writers go on).

    Written owner-only under a temporary name and renamed when complete, so a
    copy that exists is a whole one.
    """
    partial = target.with_name(f".{target.name}.partial")
    partial.unlink(missing_ok=True)
    os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    try:
        source = connect(str(source_path))
        try:
            dest = connect(str(partial))
            try:
                source.backup(dest)
            finally:
                dest.close()
        finally:
            source.close()
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


def journal_wal(conn: sqlite3.Connection, busy_timeout_ms: int) -> str:
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


def prepare_file(path: Path, driver: Driver, busy_timeout_ms: int) -> None:
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
        mode = journal_wal(conn, busy_timeout_ms)
        if str(mode).lower() != "wal":
            log.warning("the database at %s is in %s mode, not WAL", path, mode)
        applied = migrate(conn, db_path=path, connect=connect)
        if applied:
            log.info("applied migrations: %s", ", ".join(applied))
    except DATABASE_ERRORS as exc:
        raise StorageError(f"cannot use the database at {path}: {exc}") from exc
    finally:
        conn.close()
