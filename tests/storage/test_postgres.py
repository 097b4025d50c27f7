"""What only the Postgres backend has: its schema, its derived tables, its backup format.

Runs when the suite runs on Postgres (``--storage-url postgresql://pgserver/mm_{id}``);
skipped on SQLite. The contract (``test_contract``) holds it to everything else.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from helpers import postgres
from helpers.postgres import as_role, drop_roles
from helpers.records import fact, unit
from helpers.storage import open_url, store_url
from memory_mcp.config import Settings, StorageSettings
from memory_mcp.embedders.base import FakeEmbedder
from memory_mcp.errors import SchemaTooNew, StorageError
from memory_mcp.service import MemoryService
from memory_mcp.storage import Filters, Store, open_store
from memory_mcp.storage.postgres import dump

pytestmark = pytest.mark.anyio

FACTS = Filters(scope_keys=("/repo",), corpora=("facts",))


@pytest.fixture
def url(storage_url: str) -> str:
    if not postgres.is_postgres(storage_url):
        pytest.skip("about the Postgres backend: run the suite with --storage-url postgresql://…")
    return storage_url


def settings_for(url: str) -> Settings:
    return Settings(storage=StorageSettings(url=url))


@pytest.fixture
async def store(url: str) -> AsyncIterator[Any]:
    opened = await open_store(settings_for(url))
    try:
        yield opened
    finally:
        await opened.close()


async def filled(store: Store) -> list[str]:
    records = [fact(f"deploy note {n}", embedder="test:3") for n in range(5)]
    async with store.write() as tx:
        for n, r in enumerate(records):
            await tx.insert(r, unit(1, n, 0)[None, :])
    return [r.id for r in records]


async def test_a_database_migrated_by_a_newer_version_is_refused(store: Any, url: str) -> None:
    await store.fetch("INSERT INTO schema_migrations VALUES ('m999_future', 'now')")
    with pytest.raises(SchemaTooNew, match="m999_future"):
        await open_store(settings_for(url))


async def test_doctor_rebuilds_word_counts_and_drops_vectors_that_disagree(store: Any) -> None:
    ids = await filled(store)
    async with store.write() as tx:
        await tx.execute("DELETE FROM record_terms WHERE seq = (SELECT min(seq) FROM records)")
        await tx.execute("UPDATE lexical_stats SET tokens = tokens + 7")
        await tx.execute("DELETE FROM vectors WHERE seq = (SELECT max(seq) FROM records)")
    found = await store.doctor()
    assert {c.name for c in found.checks if not c.ok} == {"full-text index", "vectors"}
    assert not found.healthy
    repaired = await store.doctor(repair=True)
    assert repaired.healthy
    assert all(c.ok for c in (await store.doctor()).checks)
    assert [r.id for r in await store.needing_embedding("test:3", 10)] == [ids[-1]]
    assert ids[0] in {s.record.id for s in await store.lexical("deploy", FACTS, 10)}


async def test_a_backup_restores_with_psql_into_a_fresh_database(
    store: Any, tmp_path: Path, storage_url: str
) -> None:
    psql = shutil.which("psql") or _pgserver_psql()
    if psql is None:
        pytest.skip("no psql to restore with")
    ids = await filled(store)
    written = await store.backup(tmp_path)
    assert written.read_text(encoding="utf-8").startswith("-- memory-mcp postgres backup 1")
    target = store_url(tmp_path, storage_url, "restored")
    await anyio.run_process(
        [psql, "-v", "ON_ERROR_STOP=1", "-q", "-1", "-f", str(written), target], check=True
    )
    restored = await open_store(settings_for(target))
    try:
        assert [r async for r in restored.iter_records()] == [r async for r in store.iter_records()]
        near = await restored.nearest(unit(1, 0, 0), "test:3", FACTS, 1)
        assert [s.record.id for s in near] == [ids[0]]
        assert (await restored.doctor()).healthy
        assert [s.record.id for s in await restored.lexical("note", FACTS, 9)] == ids
    finally:
        await restored.close()


def _pgserver_psql() -> str | None:
    try:
        import pgserver
    except ImportError:
        return None
    found = Path(pgserver.__file__).parent / "pginstall" / "bin" / "psql"
    return str(found) if found.exists() else None


async def test_a_memorys_rarest_words_are_counted_once_a_while_a_search_counts_afresh(
    store: Any,
) -> None:
    """The write path's rare-word lookup reuses its words' record counts for
    ``COUNTS_TTL`` seconds, as SQLite's does; a search's BM25 reads them each time."""
    async with store.write() as tx:
        for n in range(4):
            await tx.insert(fact(f"zephyr quokka deploy note {n}"), None)
    counted: list[list[str]] = []
    fetch = store.fetch

    async def watched(sql: str, params: Any = (), *args: Any, **kwargs: Any) -> Any:
        if "FROM term_counts c" in sql:
            counted.append(sorted(params[0]))
        return await fetch(sql, params, *args, **kwargs)

    store.fetch = watched
    text = "zephyr quokka deploy note again"
    first = await store.lexical(text, FACTS, 6, rare_words=True)
    assert len(first) == 4 and len(counted) == 1
    async with store.write() as tx:  # one more record: the counts are a little behind
        await tx.insert(fact("zephyr quokka deploy note 4"), None)
    again = await store.lexical(text, FACTS, 6, rare_words=True)
    assert len(counted) == 1  # not counted again
    assert {s.record.id for s in first} < {s.record.id for s in again}
    await store.lexical(text, FACTS, 6)  # a search: counted now
    assert len(counted) == 2
    store.forget_word_counts()
    await store.lexical("zephyr quokka deploy note", FACTS, 6, rare_words=True)
    assert len(counted) == 3


async def test_a_scratch_copy_lives_in_a_schema_dropped_after_it(store: Any) -> None:
    await filled(store)
    async with store.scratch_copy() as copy:
        assert copy.schema != store.schema
        assert len(await copy.current(FACTS, 10)) == 5
        assert len(await copy.nearest(unit(1, 0, 0), "test:3", FACTS, 3)) == 3
    schemas = await store.fetch(
        "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", ["%dry_run%"]
    )
    assert schemas == []


async def index_lists(store: Any) -> int | None:
    """The lists of space 1's valid ivfflat index (None: it has none)."""
    from memory_mcp.storage.postgres.vector_index import SPACES_SQL

    rows = await store.fetch(SPACES_SQL, [True])
    return None if rows[0][3] is None else int(rows[0][3])


async def add_vectors(store: Any, first: int, last: int) -> None:
    async with store.write() as tx:
        for n in range(first, last):
            vector = unit(1, n % 7, n % 5)[None, :]
            await tx.insert(fact(f"note {n}", embedder="test:3"), vector)


async def test_a_space_gets_its_ivfflat_index_when_full_enough_and_again_when_doubled(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With two probes, a space is indexed from the rows of four lists (7), and
    built again, beside the old index, once its rows doubled; nothing else rebuilds."""
    from memory_mcp.storage.postgres import vector_index

    monkeypatch.setattr(vector_index, "IVF_PROBES", 2)
    monkeypatch.setattr(vector_index, "_CHECK_LEAST", 1)

    async def settled() -> int | None:
        assert await store.load_vectors("test:3", ["/repo"], settle=60)
        return await index_lists(store)

    await add_vectors(store, 0, 5)
    assert await settled() is None  # too few rows: every search reads them all
    await add_vectors(store, 5, 10)
    assert await settled() == 5  # ivf_lists(10)
    await add_vectors(store, 10, 15)
    assert await settled() == 5  # 15 rows want 6 lists: not yet twice the rows
    await add_vectors(store, 15, 25)
    assert await settled() == 8  # ivf_lists(25), built concurrently and swapped in
    names = await store.fetch(
        "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
        "AND indexname LIKE 'vectors_space%%'"
    )
    assert [n for (n,) in names] == ["vectors_space_1"]
    async with store.write() as tx:
        await tx.execute("SET LOCAL enable_seqscan = off")
        plan = await tx.fetch(
            "EXPLAIN SELECT seq FROM vectors v WHERE v.space = 1 "
            "ORDER BY v.embedding::vector(3) <=> '[1,0,0]'::vector(3) LIMIT 5"
        )
    assert "vectors_space_1" in "\n".join(str(row[0]) for row in plan)
    query = unit(1, 3, 2)
    found = await store.nearest(query, "test:3", FACTS, 5)
    exact = await store.nearest(query, "test:3", FACTS, 5, exact=True)
    assert [s.score for s in found] == pytest.approx([s.score for s in exact])


async def test_opening_doctor_and_team_init_build_a_missing_or_outgrown_index(
    store: Any, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memory_mcp.storage.postgres import vector_index
    from memory_mcp.storage.postgres.doctor import diagnose

    monkeypatch.setattr(vector_index, "IVF_PROBES", 2)
    store.indexes.close()  # no background builds: the other ways are what is tested
    await add_vectors(store, 0, 10)
    assert await index_lists(store) is None
    again = await open_store(settings_for(url))
    try:
        assert await index_lists(again) == 5  # opening builds a missing index
    finally:
        await again.close()
    await add_vectors(store, 10, 25)
    found = await diagnose(store, repair=False)
    vectors = next(c for c in found.checks if c.name == "vectors")
    assert vectors.problems == ["vector space 1 needs its ivfflat index built (again) with 8 lists"]
    await diagnose(store, repair=True)
    assert await index_lists(store) == 8
    async with store.write() as tx:
        await tx.execute("DROP INDEX vectors_space_1")
    async with store.write() as tx:
        assert await store.ensure_indexes(tx) == ["vectors_space_1"]


async def test_a_pending_migration_runs_after_a_backup_and_a_failing_one_changes_nothing(
    store: Any, url: str, tmp_path: Path
) -> None:
    import psycopg

    from memory_mcp.errors import StorageError
    from memory_mcp.storage.postgres import migrations

    await filled(store)
    made: list[Path] = []

    async def backup(name: str) -> Path:
        made.append(tmp_path / f"before-{name}.sql")
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as other:
            await other.execute(f'SET search_path TO "{store.schema}", public')
            await dump.write_dump(other, store.schema, made[-1])
        return made[-1]

    bad = migrations.Migration("m002_half", "ALTER TABLE records ADD COLUMN half int; SELECT 1/0")
    good = migrations.Migration("m002_whole", "ALTER TABLE records ADD COLUMN whole int")
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(f'SET search_path TO "{store.schema}", public')
        with pytest.raises(StorageError, match="m002_half failed and was rolled back"):
            await migrations.migrate(conn, store.schema, (*migrations.MIGRATIONS, bad))
        assert await migrations.migrate(
            conn, store.schema, (*migrations.MIGRATIONS, good), backup=backup
        ) == ["m002_whole"]
    columns = await store.fetch(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
        "AND table_name = 'records' AND column_name IN ('half', 'whole')",
        [store.schema],
    )
    assert columns == [("whole",)]
    [copy] = made
    assert "COPY records" in copy.read_text(encoding="utf-8") and copy.stat().st_mode & 0o077 == 0


async def test_m004_gives_each_posting_its_records_length(url: str) -> None:
    """A store written before m004 keeps its BM25 scores: the postings take their
    records' lengths, and a posting copied without one (an older backup) takes it too."""
    import psycopg

    from memory_mcp.storage.postgres import migrations

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute('SET search_path TO "m004_test", public')
        before = tuple(m for m in migrations.MIGRATIONS if m.name < "m004")
        await migrations.migrate(conn, "m004_test", before)
        for seq, length in ((1, 3), (2, 8)):
            await conn.execute(
                "INSERT INTO records (seq, id, corpus, kind, scope, scope_key, content, "
                "content_hash, agent, created_at, updated_at, doc_len) VALUES "
                "(%s, %s, 'facts', 'note', 'project', '/repo', 'x', 'h', 'a', 't', 't', %s)",
                [seq, f"f_{seq}", length],
            )
            await conn.execute(
                "INSERT INTO record_terms (term, seq, tf) VALUES ('deploy', %s, 1), ('x', %s, 1)",
                [seq, seq],
            )
        await conn.execute(  # a personal record: m005 says whose its postings are
            "INSERT INTO records (seq, id, corpus, kind, scope, scope_key, content, "
            "content_hash, agent, created_at, updated_at, doc_len, user_name) VALUES "
            "(3, 'f_3', 'facts', 'note', 'global', '', 'y', 'h', 'a', 't', 't', 1, 'zed')"
        )
        await conn.execute("INSERT INTO record_terms (term, seq, tf) VALUES ('y', 3, 1)")
        applied = await migrations.migrate(conn, "m004_test")
        assert applied[:2] == ["m004_posting_lengths", "m005_row_security"]
        cursor = await conn.execute("SELECT DISTINCT seq, owner FROM record_terms ORDER BY 1")
        assert await cursor.fetchall() == [(1, ""), (2, ""), (3, "zed")]
        await conn.execute("DELETE FROM record_terms WHERE seq = 3")
        await conn.execute("INSERT INTO record_terms (term, seq, tf) VALUES ('late', 2, 0.3)")
        cursor = await conn.execute("SELECT term, seq, doc_len FROM record_terms ORDER BY 1, 2")
        assert await cursor.fetchall() == [
            ("deploy", 1, 3),
            ("deploy", 2, 8),
            ("late", 2, 8),
            ("x", 1, 3),
            ("x", 2, 8),
        ]
        await conn.execute("DROP SCHEMA m004_test CASCADE")


async def test_m010_gives_each_posting_its_records_kind(url: str) -> None:
    """A store written before m010 keeps its postings, each with its record's kind; the
    triggers write the kind of postings made after it."""
    import psycopg

    from memory_mcp.storage.postgres import migrations

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute('SET search_path TO "m010_test", public')
        before = tuple(m for m in migrations.MIGRATIONS if m.name < "m010")
        await migrations.migrate(conn, "m010_test", before)
        for seq, kind in ((1, "decision"), (2, "gotcha")):
            await conn.execute(
                "INSERT INTO records (seq, id, corpus, kind, scope, scope_key, content, "
                "content_hash, agent, created_at, updated_at, doc_len) VALUES "
                "(%s, %s, 'facts', %s, 'project', '/repo', 'x', 'h', 'a', 't', 't', 2)",
                [seq, f"f_{seq}", kind],
            )
            await conn.execute(
                "INSERT INTO record_terms (term, seq, tf) VALUES ('deploy', %s, 1), ('x', %s, 1)",
                [seq, seq],
            )
        cursor = await conn.execute("SELECT count(*) FROM postings")
        assert await cursor.fetchone() == (4,)
        ahead = tuple(m for m in migrations.MIGRATIONS if m.name < "m011")
        assert await migrations.migrate(conn, "m010_test", ahead) == ["m010_postings_kind"]
        cursor = await conn.execute("SELECT seq, term, kind FROM postings ORDER BY 1, 2")
        assert await cursor.fetchall() == [
            (1, "deploy", "decision"),
            (1, "x", "decision"),
            (2, "deploy", "gotcha"),
            (2, "x", "gotcha"),
        ]
        await conn.execute("INSERT INTO record_terms (term, seq, tf) VALUES ('late', 2, 0.3)")
        await conn.execute("UPDATE records SET archived_at = 't' WHERE seq = 1")
        await conn.execute("UPDATE records SET archived_at = NULL WHERE seq = 1")
        cursor = await conn.execute("SELECT seq, term, kind FROM postings ORDER BY 1, 2")
        assert await cursor.fetchall() == [
            (1, "deploy", "decision"),
            (1, "x", "decision"),
            (2, "deploy", "gotcha"),
            (2, "late", "gotcha"),
            (2, "x", "gotcha"),
        ]
        await conn.execute("DROP SCHEMA m010_test CASCADE")


async def test_m012_counts_each_stems_records_and_its_triggers_keep_the_counts(
    url: str,
) -> None:
    """A store written before m012 gets its stems' record counts (by owner); inserts,
    updates, deletes and a record's cascade keep them, as counting the rows would."""
    import psycopg

    from memory_mcp.storage.postgres import migrations
    from memory_mcp.storage.postgres.doctor import _MISCOUNTED_SQL

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute('SET search_path TO "m012_test", public')
        before = tuple(m for m in migrations.MIGRATIONS if m.name < "m012")
        await migrations.migrate(conn, "m012_test", before)
        for seq, user in ((1, ""), (2, ""), (3, "ann")):
            await conn.execute(
                "INSERT INTO records (seq, id, corpus, kind, scope, scope_key, content, "
                "content_hash, agent, created_at, updated_at, doc_len, user_name, private) "
                "VALUES (%s, %s, 'facts', 'fact', 'project', '/repo', 'x', 'h', 'a', 't', 't', "
                "2, %s, %s)",
                [seq, f"f_{seq}", user, 1 if user else 0],
            )
            await conn.execute(
                "INSERT INTO record_terms (term, seq, tf) VALUES ('deploy', %s, 1), ('x', %s, 1)",
                [seq, seq],
            )
        ahead = tuple(m for m in migrations.MIGRATIONS if m.name < "m013")
        assert await migrations.migrate(conn, "m012_test", ahead) == ["m012_term_counts"]
        cursor = await conn.execute("SELECT term, owner, n FROM term_counts ORDER BY 1, 2")
        assert await cursor.fetchall() == [
            ("deploy", "", 2),
            ("deploy", "ann", 1),
            ("x", "", 2),
            ("x", "ann", 1),
        ]
        await conn.execute(
            "INSERT INTO record_terms (term, seq, tf) VALUES ('late', 2, 0.3), ('late', 1, 1)"
        )
        await conn.execute("UPDATE record_terms SET term = 'ship' WHERE seq = 2 AND term = 'x'")
        await conn.execute("DELETE FROM record_terms WHERE seq = 1 AND term = 'deploy'")
        await conn.execute("DELETE FROM records WHERE seq = 3")  # its stems by the cascade
        cursor = await conn.execute(
            "SELECT term, owner, n FROM term_counts WHERE n > 0 ORDER BY 1, 2"
        )
        assert await cursor.fetchall() == [
            ("deploy", "", 1),
            ("late", "", 2),
            ("ship", "", 1),
            ("x", "", 1),
        ]
        cursor = await conn.execute(f"SELECT count(*) FROM ({_MISCOUNTED_SQL}) AS x")
        assert await cursor.fetchone() == (0,)  # what doctor would find: nothing
        await conn.execute("DROP SCHEMA m012_test CASCADE")


async def test_m012_counts_the_stems_of_a_writer_that_commits_while_it_migrates(
    url: str,
) -> None:
    """A writer of the version before m012, its stems written but not committed when
    the migration starts: the migration waits for it, so its stems are counted."""
    import anyio
    import psycopg

    from memory_mcp.storage.postgres import migrations
    from memory_mcp.storage.postgres.doctor import _MISCOUNTED_SQL

    async def connect() -> psycopg.AsyncConnection[Any]:
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        await conn.execute('SET search_path TO "m012_race", public')
        return conn

    async with await connect() as conn, await connect() as writer:
        before = tuple(m for m in migrations.MIGRATIONS if m.name < "m012")
        await migrations.migrate(conn, "m012_race", before)
        await writer.execute("BEGIN")
        await writer.execute(
            "INSERT INTO records (seq, id, corpus, kind, scope, scope_key, content, "
            "content_hash, agent, created_at, updated_at, doc_len) VALUES "
            "(1, 'f_1', 'facts', 'fact', 'project', '/repo', 'x', 'h', 'a', 't', 't', 2)"
        )
        await writer.execute("INSERT INTO record_terms (term, seq, tf) VALUES ('deploy', 1, 1)")
        ahead = tuple(m for m in migrations.MIGRATIONS if m.name < "m013")
        applied: list[str] = []

        async def migrating() -> None:
            applied.extend(await migrations.migrate(conn, "m012_race", ahead))

        async with anyio.create_task_group() as group:
            group.start_soon(migrating)
            await anyio.sleep(0.5)  # the migration is waiting for the writer's lock
            assert not applied
            await writer.execute("COMMIT")
        assert applied == ["m012_term_counts"]
        cursor = await conn.execute("SELECT term, owner, n FROM term_counts")
        assert await cursor.fetchall() == [("deploy", "", 1)]
        cursor = await conn.execute(f"SELECT count(*) FROM ({_MISCOUNTED_SQL}) AS x")
        assert await cursor.fetchone() == (0,)
        await conn.execute("DROP SCHEMA m012_race CASCADE")


async def test_doctor_finds_and_mends_a_words_record_count_that_disagrees(store: Any) -> None:
    """A search reads its words' counts from ``term_counts``: a wrong one would move
    BM25 scores, so doctor counts again and repair rebuilds them."""
    from memory_mcp.lexical import stem

    await filled(store)
    before = await store.lexical("deploy note", FACTS, 10)
    word = stem("deploy")
    async with store.write() as tx:
        await tx.execute("UPDATE term_counts SET n = n + 40 WHERE term = %s", [word])
    assert await store.document_counts({word}) == {word: 45}
    found = await store.doctor()
    (check,) = [c for c in found.checks if not c.ok]
    assert check.name == "full-text index"
    assert check.problems == ["1 words' record counts disagree with the records"]
    assert (await store.doctor(repair=True)).healthy
    assert (await store.doctor()).healthy
    assert await store.document_counts({word}) == {word: 5}
    after = await store.lexical("deploy note", FACTS, 10)
    assert [(s.record.id, round(s.score, 9)) for s in after] == [
        (s.record.id, round(s.score, 9)) for s in before
    ]


async def test_doctor_finds_a_posting_whose_length_disagrees(store: Any) -> None:
    ids = await filled(store)
    async with store.write() as tx:
        await tx.execute(
            "UPDATE record_terms SET doc_len = doc_len + 1 "
            "WHERE seq = (SELECT min(seq) FROM records)"
        )
    found = await store.doctor()
    assert {c.name for c in found.checks if not c.ok} == {"full-text index"}
    assert (await store.doctor(repair=True)).healthy
    assert (await store.doctor()).healthy
    assert ids[0] in {s.record.id for s in await store.lexical("deploy", FACTS, 10)}


async def test_a_filter_that_keeps_a_tenth_deepens_to_where_k_of_them_lie(store: Any) -> None:
    """The second round goes as deep as the share the filter kept says: the same
    records, in the same order, as an exact ranking of those that pass."""
    import math

    records = [
        fact(f"note {n}", embedder="test:3", tags=["keep"] if n % 10 == 0 else [])
        for n in range(600)
    ]
    async with store.write() as tx:
        for n, r in enumerate(records):
            await tx.insert(r, unit(1, math.sin(n), math.cos(n * 0.7))[None, :])
    query = unit(1, 0.2, 0.1)
    kept = Filters(scope_keys=("/repo",), corpora=("facts",), tags=("keep",))
    near = await store.nearest(query, "test:3", kept, 30)

    def cosine(n: int) -> float:
        return float(unit(1, math.sin(n), math.cos(n * 0.7)) @ query)

    exact = sorted(range(0, 600, 10), key=lambda n: -cosine(n))[:30]
    assert [s.record.id for s in near] == [records[n].id for n in exact]


async def test_a_write_decisions_neighbours_come_from_fewer_ivfflat_lists(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ivfflat.probes`` is set for the one statement that asks (on a pooled
    connection, and inside a write transaction), and a write decision's nearest-record
    query asks for ``_NEIGHBOUR_PROBES``; a search's keeps the session's."""
    from memory_mcp.storage.base import IVF_PROBES
    from memory_mcp.storage.postgres import queries

    setting = "SELECT current_setting('ivfflat.probes')"
    assert await store.fetch(setting, probes=7) == [("7",)]
    assert await store.fetch(setting) == [(str(IVF_PROBES),)]
    async with store.write() as tx:
        assert await tx.fetch(setting, probes=5) == [("5",)]
        assert await tx.fetch(setting) == [(str(IVF_PROBES),)]
    assert await store.fetch(setting) == [(str(IVF_PROBES),)]

    ids = await filled(store)
    asked: list[int | None] = []
    fetch = type(store).fetch

    async def noted(self: Any, sql: str, *args: Any, **kwargs: Any) -> list[Any]:
        if "WITH near" in sql:
            asked.append(kwargs.get("probes"))
        return await fetch(self, sql, *args, **kwargs)

    monkeypatch.setattr(type(store), "fetch", noted)
    near, scores = await store.nearest_with_scores(unit(1, 0, 0), "test:3", FACTS, 3, ids[:2])
    assert asked == [queries._NEIGHBOUR_PROBES] and len(near) == 3 and set(scores) == set(ids[:2])
    asked.clear()
    await store.nearest_with_scores(unit(1, 0, 0), "test:3", FACTS, 3, ids[:2], probes=IVF_PROBES)
    await store.nearest(unit(1, 0, 0), "test:3", FACTS, 3)
    assert asked == [None, None]


async def test_row_level_security_keeps_personal_memories_from_teammates_reading_tables(
    url: str, tmp_path: Path
) -> None:
    """Alice and Bob connect with roles of their own (``team add-user``). Bob, reading
    the tables directly with SQL, sees the project's shared memory, never Alice's
    global or private ones, nor their stems or vectors; through the product neither."""
    suffix = uuid.uuid4().hex[:8]
    alice, bob = f"alice_{suffix}", f"bob_{suffix}"
    admin_settings = settings_for(url)
    async with MemoryService.open(
        admin_settings, embedder=FakeEmbedder(), wait_for_embedder=10
    ) as admin:
        done = await admin.prepare_team()
        assert any("vector space" in line for line in done)
        assert await admin.add_member(alice) == "created"
        assert await admin.add_member(bob) == "created"
        assert await admin.add_member(bob) == "joined"
    try:
        async with open_url(as_role(url, alice)) as a:
            assert a.engine.user == alice
            shared = await a.store("The release job signs the wheels", cwd=tmp_path)
            personal = await a.store("I keep my release notes in a notebook", scope="global")
            private = await a.store(
                "My release signing passphrase hint is the cat", private=True, cwd=tmp_path
            )
        assert (await _rows(as_role(url, bob), "SELECT id FROM records")) == {(shared.id,)}
        assert await _rows(as_role(url, bob), "SELECT DISTINCT owner FROM record_terms") == {("",)}
        assert await _rows(as_role(url, bob), "SELECT DISTINCT owner FROM vectors") == {("",)}
        assert await _rows(as_role(url, bob), "UPDATE records SET importance = 1 RETURNING id") == {
            (shared.id,)
        }
        mine = {(shared.id,), (personal.id,), (private.id,)}
        assert await _rows(as_role(url, alice), "SELECT id FROM records") == mine
        assert await _rows(url, "SELECT id FROM records") == mine  # the owner: everything
        async with open_url(as_role(url, bob)) as b:
            found = await b.search("release notes signing passphrase", cwd=tmp_path)
            assert {h.record.id for h in found.hits} == {shared.id}
            with pytest.raises(StorageError):  # a row that is not Bob's cannot be forged
                async with b.engine.store.write() as tx:
                    await tx.insert(fact("written as alice", user=alice), None)
    finally:
        await drop_roles(url, alice, bob)


async def test_a_member_opens_a_prepared_store_without_schema_rights(
    url: str, tmp_path: Path
) -> None:
    """Opening, searching and writing need no DDL once ``team init`` ran; before it, a
    member is told to ask for it."""
    role = f"carol_{uuid.uuid4().hex[:8]}"
    await _rows(url, f'CREATE ROLE "{role}" LOGIN')
    try:
        fresh = store_url(tmp_path, url, "fresh")
        with pytest.raises(StorageError, match="team init"):
            async with open_url(as_role(fresh, role)):
                pass
        async with MemoryService.open(
            settings_for(url), embedder=FakeEmbedder(), wait_for_embedder=10
        ) as admin:
            await admin.prepare_team()
            assert await admin.add_member(role) == "joined"
        async with open_url(as_role(url, role)) as carol:
            stored = await carol.store("Carol's fact about the build cache", cwd=tmp_path)
            assert stored.action == "inserted"
    finally:
        await drop_roles(url, role)


async def test_a_push_brings_the_local_global_scope_in_as_the_pushers_personal_scope(
    url: str, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:8]
    dana, erin = f"dana_{suffix}", f"erin_{suffix}"
    async with MemoryService.open(
        settings_for(url), embedder=FakeEmbedder(), wait_for_embedder=10
    ) as admin:
        await admin.prepare_team()
        for role in (dana, erin):
            await admin.add_member(role)
    try:
        local = Settings(storage=StorageSettings(url=f"sqlite://{tmp_path / 'local.db'}"))
        async with MemoryService.open(local, embedder=FakeEmbedder(), wait_for_embedder=10) as mine:
            personal = await mine.store("I review pull requests after lunch", scope="global")
            shared = await mine.store("The API answers in JSON only", cwd=tmp_path)
            summary = await mine.push(as_role(url, dana))
        assert summary.records_added == 2
        expected = {(personal.id, dana), (shared.id, dana)}
        assert await _rows(url, "SELECT id, user_name FROM records") == expected
        assert await _rows(as_role(url, erin), "SELECT id FROM records") == {(shared.id,)}
    finally:
        await drop_roles(url, dana, erin)


async def _rows(url: str, query: str) -> set[tuple[Any, ...]]:
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("SET search_path TO memory_mcp, public")
        cursor = await conn.execute(query.encode())
        rows = await cursor.fetchall() if cursor.description else []
        while cursor.nextset():
            pass
        return {tuple(r) for r in rows}


async def test_the_top_k_from_postings_is_bm25_over_every_record(store: Any) -> None:
    """The first postings of each word, read deeper while filters reject, give the top k
    of BM25 over every record (computed here from every record's text)."""
    import json
    import random

    from memory_mcp.lexical import query_terms, stem
    from memory_mcp.storage.bm25 import FIRST_DEPTH, document_terms, indexed_columns, score

    rng = random.Random(3)
    words = ["deploy", "build", "cache", "queue", "billing", "tests", "port", "worker"]
    async with store.write() as tx:
        for n in range(1200):
            text = " ".join(rng.choice(words) for _ in range(rng.randint(2, 12)))
            kind = "gotcha" if n % 97 == 0 else "decision" if n % 3 == 1 else "fact"
            await tx.insert(fact(f"deploy {text} item{n}", kind=kind), None)
    assert FIRST_DEPTH < 1200
    rows = await store.fetch("SELECT documents, tokens FROM lexical_stats")
    documents, tokens = int(rows[0][0]), int(rows[0][1])
    every = await store.fetch("SELECT id, kind, content, merged_text, tags FROM records")
    terms = {
        str(i): (k, document_terms(indexed_columns(c, m, json.loads(t)))) for i, k, c, m, t in every
    }
    gotchas = Filters(scope_keys=("/repo",), corpora=("facts",), kinds=("gotcha",))
    decisions = Filters(scope_keys=("/repo",), corpora=("facts",), kinds=("decision",))
    for text, filters, k in (("deploy", FACTS, 10), ("deploy billing port", FACTS, 40),
                             ("deploy cache", gotchas, 10),
                             # a third pass: more than a round keeps per word
                             ("deploy billing port", decisions, 10),
                             ("deploy", decisions, 200)):  # fmt: skip
        query = query_terms(text)
        holding = {stem(q): sum(1 for _, (_, t) in terms.values() if stem(q) in t) for q in query}
        expected = sorted(
            (
                round(score(query, t[1], t[0], documents, tokens / documents, holding), 6)
                for kind, t in terms.values()
                if not filters.kinds or kind in filters.kinds
            ),
            reverse=True,
        )[:k]
        found = await store.lexical(text, filters, k)
        assert [round(s.score, 6) for s in found] == expected, text
    assert {s.record.kind for s in await store.lexical("deploy cache", gotchas, 10)} == {"gotcha"}


async def test_doctor_finds_postings_out_of_step_and_makes_them_again(store: Any) -> None:
    ids = await filled(store)
    async with store.write() as tx:
        await tx.execute("DELETE FROM postings WHERE seq = (SELECT min(seq) FROM records)")
        await tx.execute(
            "UPDATE postings SET tf = tf + 1 WHERE seq = (SELECT max(seq) FROM records)"
        )
    found = await store.doctor()
    assert {c.name for c in found.checks if not c.ok} == {"word postings"}
    assert (await store.doctor(repair=True)).healthy
    async with store.write() as tx:  # a posting of another kind than its record's
        await tx.execute(
            "UPDATE postings SET kind = 'gotcha' WHERE seq = (SELECT min(seq) FROM records)"
        )
    found = await store.doctor()
    assert {c.name for c in found.checks if not c.ok} == {"word postings"}
    assert (await store.doctor(repair=True)).healthy
    assert all(c.ok for c in (await store.doctor()).checks)
    assert [s.record.id for s in await store.lexical("deploy note", FACTS, 10)][:1] == [ids[0]]


async def test_the_sql_impact_is_bm25s(store: Any) -> None:
    """m007's ``posting_impact`` spells ``bm25.impact`` in SQL: the lists order alike."""
    from memory_mcp.storage.bm25 import impact

    for tf, length in ((1.0, 1), (0.3, 8), (2.8, 32), (5.0, 400)):
        rows = await store.fetch("SELECT posting_impact(%s, %s)", [tf, length])
        assert float(rows[0][0]) == pytest.approx(impact(tf, length), rel=1e-12)


async def test_analyze_brings_the_planners_statistics_up_to_date(store: Any) -> None:
    await filled(store)
    await store.analyze()
    rows = await store.fetch(
        "SELECT relname FROM pg_stat_user_tables WHERE last_analyze IS NOT NULL "
        "AND relname IN ('records', 'posting_lists', 'postings', 'vectors')"
    )
    assert {r[0] for r in rows} == {"records", "posting_lists", "postings", "vectors"}
    plans = await store.fetch(
        "SELECT relname, reltuples FROM pg_class WHERE relname IN ('records', 'postings')"
    )
    assert all(tuples > 0 for _, tuples in plans)  # not as the migrations left them: empty
