"""Ordered, named, transactional, forward-only migrations: fail-closed, backed up first."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

import pytest

from memory_mcp.errors import SchemaTooNew, StorageError
from memory_mcp.storage.sqlite import SqliteStore
from memory_mcp.storage.sqlite.driver import choose_driver
from memory_mcp.storage.sqlite.migrations import MIGRATIONS, Migration, applied_migrations, migrate

pytestmark = [pytest.mark.anyio, pytest.mark.sqlite_only]

DRIVER = choose_driver()


def connect(path: str) -> sqlite3.Connection:
    return DRIVER.connect(path, busy_timeout_ms=5000)


def test_a_new_database_gets_every_migration_in_order(tmp_path: Path) -> None:
    conn = connect(str(tmp_path / "m.db"))
    applied = migrate(conn, db_path=tmp_path / "m.db", connect=connect)
    assert applied == [m.name for m in MIGRATIONS]
    assert applied_migrations(conn) == applied
    assert migrate(conn, db_path=tmp_path / "m.db", connect=connect) == []  # idempotent
    assert not list(tmp_path.glob("m.db.backup-*"))  # nothing to back up in a new database


def test_a_pending_migration_runs_after_a_backup_of_the_old_database(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    conn = connect(str(db))
    migrate(conn, db_path=db, connect=connect)
    conn.execute(
        "INSERT INTO conflicts (scope_key, record_id, other_id, reason, created_at) "
        "VALUES ('/r', 'a', 'b', 'x', 'now')"
    )
    extra = Migration(
        "m999_test_column", lambda c: c.execute("ALTER TABLE conflicts ADD note TEXT")
    )
    assert migrate(conn, db_path=db, connect=connect, migrations=(*MIGRATIONS, extra)) == [
        extra.name
    ]
    backups = list(tmp_path.glob("m.db.backup-*-before-m999_test_column"))
    assert len(backups) == 1
    assert stat.S_IMODE(backups[0].stat().st_mode) == 0o600  # as private as the database
    assert not list(tmp_path.glob(".*partial*"))  # written whole, then renamed
    old = sqlite3.connect(backups[0])
    assert old.execute("SELECT count(*) FROM conflicts").fetchone()[0] == 1
    columns = [row[1] for row in old.execute("PRAGMA table_info(conflicts)")]
    assert "note" not in columns  # the backup is the pre-migration schema


def test_a_failing_migration_rolls_back_completely(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    conn = connect(str(db))
    migrate(conn, db_path=db, connect=connect)

    def half_then_fail(c: sqlite3.Connection) -> None:
        c.execute("CREATE TABLE half_done (x)")
        c.execute("INSERT INTO no_such_table VALUES (1)")

    broken = Migration("m999_broken", half_then_fail)
    with pytest.raises(StorageError, match="m999_broken failed and was rolled back"):
        migrate(conn, db_path=db, connect=connect, migrations=(*MIGRATIONS, broken))
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "half_done" not in tables
    assert "m999_broken" not in applied_migrations(conn)


def test_a_database_from_a_newer_version_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    conn = connect(str(db))
    migrate(conn, db_path=db, connect=connect)
    conn.execute("INSERT INTO schema_migrations VALUES ('m999_from_the_future', 'later')")
    with pytest.raises(SchemaTooNew, match="newer memory-mcp"):
        migrate(conn, db_path=db, connect=connect)


async def test_open_refuses_a_newer_database_instead_of_using_it(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    store = await SqliteStore.open(db)
    await store.close()
    conn = connect(str(db))
    conn.execute("INSERT INTO schema_migrations VALUES ('m999_from_the_future', 'later')")
    conn.close()
    with pytest.raises(SchemaTooNew):
        await SqliteStore.open(db)


async def test_the_database_is_in_wal_mode_and_private_to_its_owner(tmp_path: Path) -> None:
    db = tmp_path / "data" / "memory.db"
    store = await SqliteStore.open(db)
    await store.close()
    conn = connect(str(db))
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700


def test_m002_counts_emphasis_of_existing_records(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    conn = connect(str(db))
    migrate(conn, db_path=db, connect=connect, migrations=MIGRATIONS[:1])
    conn.execute(
        "INSERT INTO records (id, corpus, kind, scope, scope_key, content, content_hash, agent, "
        "created_at, updated_at) VALUES ('f_1', 'facts', 'fact', 'global', '', "
        "'Never push on Fridays, always tag: a bug', 'h', 'cli', 'x', 'x')"
    )
    conn.commit()
    assert migrate(conn, db_path=db, connect=connect) == [m.name for m in MIGRATIONS[1:]]
    assert conn.execute("SELECT emphasis FROM records").fetchone() == (3,)
    assert list(tmp_path.glob("m.db.backup-*-before-m002_emphasis"))


def test_m010_gives_every_posting_its_records_kind(tmp_path: Path) -> None:
    """A database whose postings predate their kind column gets it filled from the
    records; the postings' index and the trigger that deletes them still work."""
    db = tmp_path / "m.db"
    conn = connect(str(db))
    migrate(conn, db_path=db, connect=connect, migrations=MIGRATIONS[:7])
    for n, kind in enumerate(["fact", "decision", "gotcha"]):
        conn.execute(
            "INSERT INTO records (id, corpus, kind, scope, scope_key, content, content_hash, "
            "agent, created_at, updated_at) VALUES (?, 'facts', ?, 'project', '/repo', ?, ?, "
            "'cli', 'x', 'x')",
            [f"f_{n}", kind, f"deploys go out on day {n} after the build", f"h{n}"],
        )
    conn.commit()
    migrate(conn, db_path=db, connect=connect, migrations=MIGRATIONS[:9])
    # the postings as m008 made them before they had a kind
    conn.execute("BEGIN")
    conn.execute("CREATE TABLE earlier AS SELECT list, term, impact, seq, tf, dl FROM postings")
    conn.execute("DROP TABLE postings")
    conn.execute(
        "CREATE TABLE postings (list INTEGER NOT NULL, term TEXT NOT NULL, impact REAL NOT "
        "NULL, seq INTEGER NOT NULL, tf REAL NOT NULL, dl INTEGER NOT NULL, "
        "PRIMARY KEY (list, term, impact, seq)) WITHOUT ROWID"
    )
    conn.execute("CREATE INDEX postings_seq ON postings (seq, term, tf, dl)")
    conn.execute("INSERT INTO postings SELECT * FROM earlier")
    conn.execute("DROP TABLE earlier")
    conn.execute("COMMIT")
    count = conn.execute("SELECT count(*) FROM postings").fetchone()[0]
    assert count > 9
    assert migrate(conn, db_path=db, connect=connect, migrations=MIGRATIONS[:10]) == [
        "m010_postings_kind"
    ]
    rows = conn.execute(
        "SELECT p.kind, r.kind FROM postings p JOIN records r ON r.seq = p.seq"
    ).fetchall()
    assert len(rows) == count and all(mine == theirs for mine, theirs in rows)
    plan = " ".join(
        str(row[-1])
        for row in conn.execute("EXPLAIN QUERY PLAN SELECT term FROM postings WHERE seq = 1")
    )
    assert "postings_seq" in plan
    conn.execute("DELETE FROM records WHERE id = 'f_1'")  # its postings go with it
    conn.commit()
    kinds = {row[0] for row in conn.execute("SELECT kind FROM postings")}
    assert kinds == {"fact", "gotcha"}
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_m011_orders_records_live_by_write_order_within_a_creation_time(
    tmp_path: Path,
) -> None:
    """The index of current records is made again with ``seq`` after ``created_at``; the
    records, and the columns the brief reads from the index, stay."""
    db = tmp_path / "m.db"
    conn = connect(str(db))
    migrate(conn, db_path=db, connect=connect, migrations=MIGRATIONS[:10])
    for n in range(3):
        conn.execute(
            "INSERT INTO records (id, corpus, kind, scope, scope_key, content, content_hash, "
            "agent, created_at, updated_at) VALUES (?, 'facts', 'fact', 'project', '/repo', "
            "?, ?, 'cli', 'x', 'x')",
            [f"f_{n}", f"note {n}", f"h{n}"],
        )
    conn.commit()
    assert migrate(conn, db_path=db, connect=connect, migrations=MIGRATIONS[:11]) == [
        "m011_live_by_seq"
    ]
    columns = [row[2] for row in conn.execute("PRAGMA index_info(records_live)")]
    assert columns[:5] == ["scope_key", "corpus", "live", "created_at", "seq"]
    assert {"kind", "importance", "emphasis", "pinned", "id"} <= set(columns)
    plan = " ".join(
        str(row[-1])
        for row in conn.execute(
            "EXPLAIN QUERY PLAN SELECT seq FROM records WHERE scope_key = '/repo' "
            "AND corpus = 'facts' AND live = 1 AND created_at <= 'x' "
            "ORDER BY created_at DESC, seq DESC LIMIT 1"
        )
    )
    assert "records_live" in plan and "TEMP B-TREE" not in plan, plan
    assert conn.execute("SELECT count(*) FROM records").fetchone() == (3,)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_the_error_classes_cover_every_sqlite_module() -> None:
    import sqlite3

    import sqlean

    from memory_mcp.storage.sqlite.driver import OPERATIONAL_ERRORS

    assert sqlite3.OperationalError in OPERATIONAL_ERRORS
    assert sqlean.dbapi2.OperationalError in OPERATIONAL_ERRORS


def test_m012_gives_every_current_record_its_neighbours_in_time(tmp_path: Path) -> None:
    """Made from the records already there, in each scope and corpus, by creation time
    then write order; a record that is not current has none and is nobody's; the
    triggers keep them from then on."""
    from memory_mcp.storage.sqlite import neighbours

    db = tmp_path / "m.db"
    conn = connect(str(db))
    migrate(conn, db_path=db, connect=connect, migrations=MIGRATIONS[:11])
    rows = [  # id, scope key, created at, archived at
        ("f_0", "/repo", "2026-01-01T10:00:00.000000Z", None),
        ("f_1", "/repo", "2026-01-01T10:05:00.000000Z", "2026-01-02T00:00:00.000000Z"),
        ("f_2", "/repo", "2026-01-01T10:07:30.000000Z", None),
        ("f_3", "/other", "2026-01-01T10:06:00.000000Z", None),
        ("f_4", "/repo", "2026-01-01T10:00:00.000000Z", None),
    ]
    for record_id, key, at, archived in rows:
        conn.execute(
            "INSERT INTO records (id, corpus, kind, scope, scope_key, content, content_hash, "
            "agent, created_at, updated_at, archived_at) VALUES (?, 'facts', 'fact', "
            "'project', ?, 'note', ?, 'cli', ?, ?, ?)",
            [record_id, key, record_id, at, at, archived],
        )
    conn.commit()
    assert migrate(conn, db_path=db, connect=connect, migrations=MIGRATIONS[:12]) == [
        "m012_neighbours"
    ]
    kept = {
        str(row[0]): row[1:]
        for row in conn.execute(
            "SELECT r.id, n.before_id, n.before_gap, n.after_id, n.after_gap "
            "FROM neighbours n JOIN records r ON r.seq = n.seq"
        )
    }
    assert kept == {
        "f_0": (None, None, "f_4", 0.0),
        "f_4": ("f_0", 0.0, "f_2", pytest.approx(450.0)),
        "f_2": ("f_4", pytest.approx(450.0), None, None),
        "f_3": (None, None, None, None),
    }
    conn.execute(  # f_1 comes back between f_4 and f_2
        "UPDATE records SET archived_at = NULL WHERE id = 'f_1'"
    )
    conn.commit()
    assert conn.execute(
        "SELECT before_id, after_id FROM neighbours n JOIN records r ON r.seq = n.seq "
        "WHERE r.id = 'f_1'"
    ).fetchone() == ("f_4", "f_2")
    assert conn.execute(neighbours.DISAGREEING).fetchone() == (0,)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def _assert_awaiting_counted_from_indexes(
    conn: sqlite3.Connection, embedder: str, count: int
) -> None:
    """The records awaiting ``embedder``'s vectors (``sql.awaiting_sql``, bare and due)
    are ``count``, read by index searches alone, never a scan of every record."""
    from memory_mcp.storage.sqlite.sql import awaiting_sql

    for incomplete in (False, True):
        sql, params = awaiting_sql(embedder, incomplete)
        steps = [str(row[-1]) for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
        reads = [step for step in steps if "records" in step]
        walks = ("SEARCH records USING", "SCAN records USING INDEX records_vectors_due")
        assert reads and all(step.startswith(walks) for step in reads), steps
        assert conn.execute(sql, params).fetchone() == (count,)


def test_m013_counts_the_records_awaiting_vectors_from_the_embedders_index(
    tmp_path: Path,
) -> None:
    """After m013 the count reads ranges of ``records_embedder`` and the due records'
    index, never every record; the index keeps the rows it had."""
    db = tmp_path / "m.db"
    conn = connect(str(db))
    migrate(conn, db_path=db, connect=connect, migrations=MIGRATIONS[:12])
    for n, embedder in enumerate(["m", None, "other"]):
        conn.execute(
            "INSERT INTO records (id, corpus, kind, scope, scope_key, content, content_hash, "
            "agent, created_at, updated_at, embedder, vec_rows) VALUES (?, 'facts', 'fact', "
            "'project', '/repo', 'note', ?, 'cli', 'x', 'x', ?, ?)",
            [f"f_{n}", f"h{n}", embedder, int(embedder is not None)],
        )
    conn.commit()
    assert migrate(conn, db_path=db, connect=connect, migrations=MIGRATIONS[:13]) == [
        "m013_embedder_live"
    ]
    columns = [row[2] for row in conn.execute("PRAGMA index_info(records_embedder)")]
    assert columns == ["embedder", "live"]
    _assert_awaiting_counted_from_indexes(conn, "m", 2)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_m014_reads_a_scopes_records_with_vectors_from_the_embedders_index_alone(
    tmp_path: Path,
) -> None:
    """After m014 a scope's records with vectors (``dense.HELD``: the sum a kept copy is
    checked against, the rows a load reads) come from ``records_embedder`` without a
    read of the table's rows, and the records awaiting vectors are still counted from
    it."""
    from memory_mcp.storage.sqlite.dense import HELD

    db = tmp_path / "m.db"
    conn = connect(str(db))
    migrate(conn, db_path=db, connect=connect, migrations=MIGRATIONS[:13])
    rows = [  # (scope, embedder, vector rows, archived)
        ("/repo", "m", 3, None),
        ("/repo", "m", 2, None),
        ("/repo", "m", 4, "2026-01-02"),
        ("/repo", "m", 0, None),
        ("/repo", "other", 5, None),
        ("/else", "m", 7, None),
        ("/repo", None, 0, None),
    ]
    for n, (key, embedder, vec_rows, archived) in enumerate(rows):
        conn.execute(
            "INSERT INTO records (id, corpus, kind, scope, scope_key, content, content_hash, "
            "agent, created_at, updated_at, embedder, vec_rows, archived_at) VALUES (?, "
            "'facts', ?, 'project', ?, 'note', ?, 'cli', 'x', 'x', ?, ?, ?)",
            [f"f_{n}", f"kind{n}", key, f"h{n}", embedder, vec_rows, archived],
        )
    conn.commit()
    assert migrate(conn, db_path=db, connect=connect) == ["m014_embedder_held"]
    columns = [row[2] for row in conn.execute("PRAGMA index_info(records_embedder)")]
    assert columns == ["embedder", "live", "scope_key", "vec_rows", "corpus", "kind"]
    index_root = conn.execute(
        "SELECT rootpage FROM sqlite_master WHERE name = 'records_embedder'"
    ).fetchone()[0]
    for sql, expected in (
        (f"SELECT coalesce(sum(vec_rows), 0) FROM records WHERE {HELD}", [(5,)]),
        (f"SELECT seq, corpus, kind FROM records WHERE {HELD}", None),
    ):
        program = list(conn.execute("EXPLAIN " + sql, ["/repo", "m"]))
        opened = {row[2]: row[3] for row in program if row[1] == "OpenRead"}  # cursor: page
        cursors = {row[2] for row in program if row[1] in ("Column", "IdxRowid")}
        assert cursors and all(opened[c] == index_root for c in cursors), program
        got = sorted(conn.execute(sql, ["/repo", "m"]))
        assert got == (expected or [(1, "facts", "kind0"), (2, "facts", "kind1")])
    _assert_awaiting_counted_from_indexes(conn, "m", 2)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
