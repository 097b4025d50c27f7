"""A write's steps run on the writer's thread in few round trips, and fail as one."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiosqlite
import numpy as np
import pytest

from helpers.records import fact, unit
from memory_mcp.errors import StorageError
from memory_mcp.storage.base import Filters
from memory_mcp.storage.sqlite import SqliteStore, postings
from memory_mcp.storage.sqlite.driver import DATABASE_ERRORS, on_thread

pytestmark = [pytest.mark.anyio, pytest.mark.sqlite_only]

FILTERS = Filters(scope_keys=("/repo",), corpora=("facts",))


@contextmanager
def round_trips(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """What is sent to any aiosqlite connection's thread meanwhile, one entry per trip."""
    sent: list[str] = []
    real = aiosqlite.Connection._execute

    async def counted(self: aiosqlite.Connection, fn: object, *args: object) -> object:
        sent.append(str(args[0]) if args and isinstance(args[0], str) else "routine")
        return await real(self, fn, *args)  # type: ignore[no-untyped-call]

    with monkeypatch.context() as patch:
        patch.setattr(aiosqlite.Connection, "_execute", counted)
        yield sent


async def test_a_routine_runs_on_the_connections_own_thread(tmp_path: Path) -> None:
    """aiosqlite's queue (``_execute``) is private: this fails first if an upgrade drops it."""
    store = await SqliteStore.open(tmp_path / "m.db")
    try:

        def seen(conn: sqlite3.Connection, extra: int) -> tuple[int, bool]:
            import threading

            row = conn.execute("SELECT count(*) + ? FROM records", [extra]).fetchone()
            return int(row[0]), threading.current_thread() is store._writer._thread

        assert await on_thread(store._writer, seen, 2) == (2, True)
    finally:
        await store.close()


async def test_an_insert_with_its_vectors_travels_with_the_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        first = fact("the vector table is made by the first insert", embedder="m")
        async with store.write() as tx:
            await tx.insert(first, unit(1, 0, 0)[None, :])
        record = fact("the deploy script lives in ops/deploy.sh", embedder="m")
        with round_trips(monkeypatch) as sent:
            async with store.write() as tx:
                await tx.insert(record, np.stack([unit(0, 1, 0), unit(0, 1, 1)]), vectors_due=True)
        assert sent == ["routine", "routine"]  # begin; the insert with the commit
        rows = await store.reads.fetch(
            "SELECT embedder, vec_rows, vectors_due FROM records WHERE id = ?", [record.id]
        )
        assert rows == [("m", 2, 1)]
        hits = await store.nearest(unit(0, 1, 0), "m", FILTERS, 1)
        assert [h.record.id for h in hits] == [record.id]
        assert [s.record.id for s in await store.lexical("deploy script", FILTERS, 5)] == [
            record.id
        ]
    finally:
        await store.close()


async def test_a_queued_write_is_seen_by_the_next_read_and_its_failure_fails_the_commit(
    tmp_path: Path,
) -> None:
    """A queued write (``Pipelined``) runs before whatever the transaction does next, so
    a read in it sees the write; if it fails, the transaction does, even when its call
    was cut short. Another task's write mark carries none of it, and the next
    transaction is not failed by it."""
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        kept = fact("the cache is warmed at start")
        async with store.write() as tx:
            await tx.insert(kept, None)
            assert (await tx.get(kept.id)) == kept
        twin = fact("the queue drains every night")
        twin.id = kept.id  # the same id: its insert fails

        async def insert_twin(other_task_marks: bool) -> None:
            async with store.write() as tx:
                await tx.insert(fact("the queue is drained by cron"), None)
                await tx.insert(twin, None)
                if other_task_marks:
                    assert await asyncio.create_task(store.write_mark()) is not None
                    assert store._writer.queued  # still this transaction's
                else:
                    with pytest.raises(DATABASE_ERRORS):  # the driver's IntegrityError
                        await tx.get(kept.id)
                    assert tx.failure is not None  # a caller that went on commits nothing

        for other_task_marks in (True, False):
            with pytest.raises(DATABASE_ERRORS):
                await insert_twin(other_task_marks)
            assert store._writer.queued == []
            assert await store.lexical("queue", FILTERS, 5) == []
        assert (await store.get(kept.id)) == kept
        async with store.write() as tx:  # the next transaction is not failed by it
            await tx.insert(fact("the queue drains every night"), None)
        assert len(await store.lexical("queue", FILTERS, 5)) == 1
    finally:
        await store.close()


async def test_a_transactions_vector_reads_see_its_queued_insert(tmp_path: Path) -> None:
    """Reads of the vector copy in a transaction merge its own writes (``_own_writes``):
    those queued are sent first, so that their records are known."""
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        a, b, c = (fact(t, embedder="m") for t in ("alpha", "beta", "gamma"))
        async with store.write() as tx:
            await tx.insert(a, unit(1, 0, 0)[None, :])
        await store.nearest(unit(1, 0, 0), "m", FILTERS, 5)  # loads the copy
        async with store.write() as tx:
            await tx.insert(b, unit(0, 1, 0)[None, :])
            assert [h.record.id for h in await tx.nearest(unit(0, 1, 0), "m", FILTERS, 1)] == [b.id]
            await tx.insert(c, unit(0, 0, 1)[None, :])
            hits, scores = await tx.nearest_with_scores(unit(0, 0, 1), "m", FILTERS, 1, [b.id])
            assert [h.record.id for h in hits] == [c.id] and abs(scores[b.id]) < 1e-3
    finally:
        await store.close()


async def test_a_failure_while_committing_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end of a transaction (postings, retired vectors, COMMIT) is one routine: a
    failure in it rolls back all of the transaction, and the store goes on."""
    store = await SqliteStore.open(tmp_path / "m.db")
    real = postings.index_due_sync

    def half_then_fail(conn: sqlite3.Connection) -> None:
        real(conn)  # the postings are written, then the disk fills
        raise sqlite3.OperationalError("database or disk is full")

    try:
        kept = fact("the cache is warmed at start", embedder="m")
        async with store.write() as tx:
            await tx.insert(kept, unit(1, 0, 0)[None, :])
        lost = fact("the queue drains every night", embedder="m")
        monkeypatch.setattr(postings, "index_due_sync", half_then_fail)

        async def insert_and_archive() -> None:
            async with store.write() as tx:
                await tx.insert(lost, unit(0, 1, 0)[None, :])
                await tx.archive(kept.id, "test", "2026-01-01T00:00:00.000000Z")

        with pytest.raises(StorageError, match="disk is full"):
            await insert_and_archive()
        monkeypatch.setattr(postings, "index_due_sync", real)

        assert await store.get(lost.id) is None
        assert (await store.get(kept.id)).current  # type: ignore[union-attr]
        assert await store.lexical("queue drains", FILTERS, 5) == []
        counts = await store.reads.fetch(
            "SELECT (SELECT count(*) FROM postings_due), (SELECT count(*) FROM retired_vectors)"
        )
        assert counts == [(0, 0)]
        hits = await store.nearest(unit(1, 0, 0), "m", FILTERS, 5)
        assert [h.record.id for h in hits] == [kept.id]
        async with store.write() as tx:  # still usable
            await tx.insert(lost, unit(0, 1, 0)[None, :])
        assert [s.record.id for s in await store.lexical("queue drains", FILTERS, 5)] == [lost.id]
    finally:
        await store.close()


async def test_the_wal_is_checkpointed_after_the_writes_not_inside_them(tmp_path: Path) -> None:
    """The writer does not checkpoint at its commits (SQLite's own checkpoint, every
    1,000 pages, waited for the disk inside a store); after ``_CHECKPOINT_COMMITS``
    commits one starts in the background, completes, and the WAL starts over instead
    of growing; closing checkpoints the rest."""
    from memory_mcp.storage.sqlite import store as store_module

    path, wal = tmp_path / "m.db", tmp_path / "m.db-wal"
    store = await SqliteStore.open(path)
    # another connection, which keeps close from checkpointing as the last one does (of
    # the same SQLite library: two libraries in one process do not see each other's locks)
    other = store.driver.connect(str(path), busy_timeout_ms=1000)
    try:
        assert await store._writer.execute_fetchall("PRAGMA wal_autocheckpoint") == [(0,)]

        async def commit(n: int) -> None:
            async with store.write() as tx:
                await tx.insert(fact(f"note {n}: " + "words " * 2000), None)

        for n in range(store_module._CHECKPOINT_COMMITS - 1):
            await commit(n)
        assert store._checkpointing is None
        before, first_wal = path.stat().st_size, wal.stat().st_size
        await commit(99)  # the last one due: a checkpoint starts, the commit does not wait
        assert store._checkpointing is not None
        await store._checkpointing
        checkpointed = path.stat().st_size
        assert checkpointed > before  # the pages went from the WAL into the database

        for n in range(100, 100 + 5 * store_module._CHECKPOINT_COMMITS):
            await commit(n)  # while the checkpoints run
        assert wal.stat().st_size <= first_wal * 1.5  # started over, not grown 6 times
        await commit(1000)
        await commit(1001)
    finally:
        await store.close()
    written = 6 * store_module._CHECKPOINT_COMMITS + 2
    assert other.execute("SELECT count(*) FROM records").fetchone() == (written,)
    other.close()
    # The database file alone (its WAL ignored) holds them all: close checkpointed.
    alone = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
    assert alone.execute("SELECT count(*) FROM records").fetchone() == (written,)
    alone.close()


async def test_a_search_on_a_current_copy_is_one_trip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy's freshness check, the ranking and the records' rows go to the reader's
    thread together; a copy that another process's write left behind catches up first."""
    store = await SqliteStore.open(tmp_path / "m.db")
    other = await SqliteStore.open(tmp_path / "m.db")
    try:
        a, b = fact("alpha", embedder="m"), fact("beta", embedder="m")
        async with store.write() as tx:
            await tx.insert(a, unit(1, 0, 0)[None, :])
            await tx.insert(b, np.stack([unit(0, 1, 0), unit(0, 1, 1)]))
        await store.nearest(unit(1, 0, 0), "m", FILTERS, 2)  # loads the scope
        with round_trips(monkeypatch) as sent:
            hits = await store.nearest(unit(0, 1, 0), "m", FILTERS, 2)
            scores = await store.dense_scores(unit(1, 0, 0), "m", [a.id, b.id])
            both = await store.nearest_with_scores(unit(0, 1, 0), "m", FILTERS, 2, [a.id])
        assert sent == ["routine", "routine", "routine"]
        assert [h.record.id for h in both[0]] == [b.id, a.id] and both[1].keys() == {a.id}
        assert [h.record.id for h in hits] == [b.id, a.id] and abs(hits[0].score - 1) < 1e-3
        assert abs(scores[a.id] - 1) < 1e-3 and abs(scores[b.id]) < 1e-3

        c = fact("gamma", embedder="m")
        async with other.write() as tx:  # another process: this copy is behind
            await tx.insert(c, unit(0, 0, 1)[None, :])
        with round_trips(monkeypatch) as sent:
            hits = await store.nearest(unit(0, 0, 1), "m", FILTERS, 1)
        assert len(sent) > 1 and [h.record.id for h in hits] == [c.id]
        assert abs((await store.dense_scores(unit(0, 0, 1), "m", [c.id]))[c.id] - 1) < 1e-3
    finally:
        await store.close()
        await other.close()


async def test_a_write_mark_sees_another_processs_commit_and_costs_the_write_no_trip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mark is the writer's data version (another connection's commit changes it)
    and this process's own commits; a transaction compares it with the mark taken at
    its start, without asking the database again."""
    store = await SqliteStore.open(tmp_path / "m.db")
    other = await SqliteStore.open(tmp_path / "m.db")
    try:
        mark = await store.write_mark()
        with round_trips(monkeypatch) as sent:
            async with store.write() as tx:
                assert await tx.unchanged_since(mark)
        assert sent == ["routine", "routine"]  # begin (with the mark), commit
        async with other.write() as tx:
            await tx.insert(fact("written elsewhere"), None)
        async with store.write() as tx:
            assert not await tx.unchanged_since(mark)
        mark = await store.write_mark()
        async with store.write() as tx:
            await tx.insert(fact("written here"), None)
        async with store.write() as tx:
            assert not await tx.unchanged_since(mark)  # this process's own commit
    finally:
        await store.close()
        await other.close()


async def test_a_checkpoint_a_read_held_back_is_tried_again_at_the_next_commit(
    tmp_path: Path,
) -> None:
    """A read of an older snapshot keeps the checkpoint from the WAL's end (the WAL could
    then never start over: 1.2 GB of WAL after a 200,000-memory bench fill, whose reads
    run beside its writes); the next commit tries again, and the WAL starts over."""
    from memory_mcp.storage.sqlite import store as store_module

    path, wal = tmp_path / "m.db", tmp_path / "m.db-wal"
    store = await SqliteStore.open(path)
    reader = store.driver.connect(str(path), busy_timeout_ms=1000)  # the same library's
    try:

        async def commit(n: int) -> None:
            async with store.write() as tx:
                await tx.insert(fact(f"note {n}: " + "words " * 2000), None)

        await commit(0)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM records").fetchone()  # holds its snapshot
        for n in range(1, store_module._CHECKPOINT_COMMITS):
            await commit(n)
        assert store._checkpointing is not None
        await store._checkpointing
        assert store._checkpoint_behind  # stopped at the reader's snapshot
        reader.execute("COMMIT")
        size = wal.stat().st_size
        await commit(100)  # not the one due: tried again all the same
        assert store._checkpointing is not None
        await store._checkpointing
        assert not store._checkpoint_behind
        for n in range(101, 101 + store_module._CHECKPOINT_COMMITS):
            await commit(n)
        assert wal.stat().st_size <= size * 1.5  # started over, not grown by a round of commits
    finally:
        reader.close()
        await store.close()
