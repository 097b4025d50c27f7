"""The SQLite store on real files: FTS5 and vectors stay in step with the records."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers.records import fact, unit
from memory_mcp.records import Record, format_time, utcnow
from memory_mcp.storage.base import Filters
from memory_mcp.storage.sqlite import SqliteStore, dense, queries
from memory_mcp.storage.sqlite.driver import on_thread

pytestmark = [pytest.mark.anyio, pytest.mark.sqlite_only]

FILTERS = Filters(scope_keys=("/repo",), corpora=("facts",))


async def test_fts_follows_inserts_updates_and_deletes(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        r = fact("The staging database is reset every Sunday")
        async with store.write() as tx:
            await tx.insert(r, None)
        assert [s.record.id for s in await store.lexical("staging reset", FILTERS, 5)] == [r.id]
        async with store.write() as tx:
            await tx.execute(
                "UPDATE records SET content = 'Production is frozen on Fridays' WHERE id = ?",
                [r.id],
            )
        assert await store.lexical("staging", FILTERS, 5) == []
        assert [s.record.id for s in await store.lexical("frozen fridays", FILTERS, 5)] == [r.id]
        async with store.write() as tx:
            await tx.execute("DELETE FROM records WHERE id = ?", [r.id])
        assert await store.lexical("frozen", FILTERS, 5) == []
    finally:
        await store.close()


async def test_fts_syntax_in_a_query_is_searched_as_plain_words(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        r = fact("Use NEAR-zero downtime deploys; see docs (AND notes)")
        async with store.write() as tx:
            await tx.insert(r, None)
        for query in [
            'NEAR("deploys" AND',
            "deploys*",
            "content:deploys",
            "^deploys)",
            '"unbalanced',
        ]:
            hits = await store.lexical(query, FILTERS, 5)
            assert [h.record.id for h in hits] in ([r.id], []), query
        assert await store.lexical("***", FILTERS, 5) == []
    finally:
        await store.close()


async def test_each_embedder_and_dimension_gets_its_own_vector_index(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        a, b = fact("alpha", embedder="model-a"), fact("beta", embedder="model-b")
        async with store.write() as tx:
            await tx.insert(a, unit(1, 0, 0)[None, :])
            await tx.insert(b, unit(1, 0, 0, 0, 0)[None, :])
        near_a = await store.nearest(unit(1, 0, 0), "model-a", FILTERS, 5)
        near_b = await store.nearest(unit(1, 0, 0, 0, 0), "model-b", FILTERS, 5)
        assert [s.record.id for s in near_a] == [a.id]
        assert [s.record.id for s in near_b] == [b.id]
        stats = await store.stats()
        assert [(e, d) for _, e, d, _ in stats.vector_indexes] == [("model-a", 3), ("model-b", 5)]
    finally:
        await store.close()


async def test_a_record_scores_by_its_best_passage(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        r = fact("long text", embedder="m")
        passages = np.stack([unit(1, 0, 0), unit(0, 1, 0), unit(0, 0, 1)])
        async with store.write() as tx:
            await tx.insert(r, passages)
        hits = await store.nearest(unit(0, 0, 1), "m", FILTERS, 5)
        assert len(hits) == 1 and abs(hits[0].score - 1.0) < 1e-5
        assert abs((await store.dense_scores(unit(0, 1, 0), "m", [r.id]))[r.id] - 1.0) < 1e-5
    finally:
        await store.close()


async def test_archiving_removes_vectors_and_hides_the_record(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        r = fact("gamma", embedder="m")
        async with store.write() as tx:
            await tx.insert(r, unit(1, 1, 0)[None, :])
            assert await tx.archive(r.id, "forgotten", format_time(utcnow()))
        assert await store.nearest(unit(1, 1, 0), "m", FILTERS, 5) == []
        assert await store.lexical("gamma", FILTERS, 5) == []
        archived = await store.get(r.id)
        assert archived is not None and archived.archived_reason == "forgotten"
        assert archived.embedder is None  # restoring re-embeds it
        # its vector row is deleted after the commit, once the engine finds quiet
        assert store.vectors_to_sweep
        assert (await store.stats()).vector_indexes[0][3] == 1
        assert await store.sweep_vectors(8) == 1
        assert not store.vectors_to_sweep
        assert (await store.stats()).vector_indexes[0][3] == 0
        assert await store.sweep_vectors(8) == 0
    finally:
        await store.close()


def _held_seqs(store: SqliteStore) -> set[int]:
    """The records whose rows the store's in-memory copy of scope /repo holds."""
    segment = next(iter(store._copies.values()))._segments["/repo"]
    rowids = segment.rowid[: segment.size]
    return set((rowids[rowids >= 0] // dense.MAX_PASSAGES).tolist())


async def _seq(store: SqliteStore, record_id: str) -> int:
    return int((await store.reads.fetch("SELECT seq FROM records WHERE id = ?", [record_id]))[0][0])


async def test_retired_vectors_are_gone_for_every_reader_before_they_are_swept(
    tmp_path: Path,
) -> None:
    """A record that stops being current keeps its vec0 rows until the engine's next
    quiet (``sweep_vectors``), but no reader sees them from its commit on: the copies
    of this process and of another drop them, vec0's own search and a fresh load skip
    them, doctor does not count them as strays. A process that ends before sweeping
    leaves them to the next; a record that takes its rowids again takes them over."""
    path = tmp_path / "m.db"
    store = await SqliteStore.open(path)
    other = await SqliteStore.open(path)
    bare = await SqliteStore.open(path, vector_copy=False)
    try:
        old = fact("the api listens on port 8080", embedder="m")
        new = fact("the api listens on port 9090", embedder="m")
        async with store.write() as tx:
            await tx.insert(old, np.stack([unit(1, 0, 0), unit(1, 1, 0)]))
        for s in (store, other):  # both load their copies
            assert [h.record.id for h in await s.nearest(unit(1, 0, 0), "m", FILTERS, 5)] == [
                old.id
            ]
        old_seq = await _seq(store, old.id)
        assert old_seq in _held_seqs(store) and old_seq in _held_seqs(other)

        async with store.write() as tx:
            await tx.insert(new, unit(0, 1, 0)[None, :])
            await tx.replace(old, new.id)

        assert store.vectors_to_sweep
        assert (await store.stats()).vector_indexes[0][3] == 3  # still in vec0
        for s in (store, other, bare):
            assert [h.record.id for h in await s.nearest(unit(1, 0, 0), "m", FILTERS, 5)] == [
                new.id
            ]
        assert old_seq not in _held_seqs(store)  # dropped at the commit (the journal)
        assert old_seq not in _held_seqs(other)  # and by the other (the change log)
        fresh = await SqliteStore.open(path)  # a copy read from vec0's chunks
        try:
            await fresh.nearest(unit(1, 0, 0), "m", FILTERS, 5)
            assert _held_seqs(fresh) == {await _seq(store, new.id)}
        finally:
            await fresh.close()
        diagnosis = await store.doctor()
        assert diagnosis.healthy, diagnosis

        await store.close()  # not swept: the next process finds them waiting
        store = await SqliteStore.open(path)
        assert store.vectors_to_sweep
        assert await store.sweep_vectors(8) == 1
        assert not store.vectors_to_sweep
        assert (await store.stats()).vector_indexes[0][3] == 1
        assert (await store.doctor()).healthy
    finally:
        for s in (store, other, bare):
            await s.close()


async def test_a_record_that_takes_retired_rowids_again_takes_them_over(tmp_path: Path) -> None:
    """A deleted record's seq goes to the next record (SQLite reuses the largest), and
    an archived record made current again is embedded again: their rows are written
    where the retired rows, not yet swept, still are."""
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        gone = fact("the nightly job runs at two", embedder="m")
        async with store.write() as tx:
            await tx.insert(gone, unit(1, 0, 0)[None, :])
        seq = await _seq(store, gone.id)
        async with store.write() as tx:
            await tx.execute("DELETE FROM records WHERE id = ?", [gone.id])
        assert store.vectors_to_sweep
        after = fact("the nightly job runs at three", embedder="m")
        async with store.write() as tx:
            await tx.insert(after, unit(0, 1, 0)[None, :])
        assert await _seq(store, after.id) == seq  # the same rowids
        assert abs((await store.dense_scores(unit(0, 1, 0), "m", [after.id]))[after.id] - 1) < 1e-5

        # in one transaction: the copy drops the rows the seq had, not adds to them
        assert [h.record.id for h in await store.nearest(unit(0, 1, 0), "m", FILTERS, 5)] == [
            after.id
        ]
        again = fact("the nightly job runs at four", embedder="m")
        async with store.write() as tx:
            await tx.execute("DELETE FROM records WHERE id = ?", [after.id])
            await tx.insert(again, unit(0, 0, 1)[None, :])
        assert await _seq(store, again.id) == seq
        hits = await store.nearest(unit(0, 1, 0), "m", FILTERS, 5)  # the old row's vector
        assert all(h.score < 0.5 for h in hits if h.record.id == again.id)

        kept = fact("deploys need a green build", embedder="m")
        async with store.write() as tx:
            await tx.insert(kept, unit(0, 0, 1)[None, :])
            assert await tx.archive(kept.id, "forgotten", format_time(utcnow()))
        async with store.write() as tx:  # made current again, then embedded again
            await tx.execute(
                "UPDATE records SET archived_at = NULL, archived_reason = NULL WHERE id = ?",
                [kept.id],
            )
            assert await tx.set_vectors([(kept, unit(1, 0, 1)[None, :])], "m")
        assert abs((await store.dense_scores(unit(1, 0, 1), "m", [kept.id]))[kept.id] - 1) < 1e-5
        assert not store.vectors_to_sweep  # the rows it took over were the last waiting
        assert (await store.doctor()).healthy
        assert (await store.stats()).vector_indexes[0][3] == 2
    finally:
        await store.close()


async def test_a_retirement_queued_after_a_takeover_is_announced(tmp_path: Path) -> None:
    """The queue reuses rowids: a record retired after a takeover of the queue's last
    entry, in the same transaction, gets that entry's rowid, which is not past the one
    noted at BEGIN; it is announced all the same."""
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        a, b, c = (fact(t, embedder="m") for t in ("alpha", "bravo", "charlie"))
        async with store.write() as tx:
            await tx.insert(a, unit(1, 0, 0)[None, :])
            await tx.insert(b, unit(0, 1, 0)[None, :])
            await tx.insert(c, unit(0, 0, 1)[None, :])
        await store.nearest(unit(1, 0, 0), "m", FILTERS, 5)  # the copy loads
        now = format_time(utcnow())
        for record in (a, b):
            async with store.write() as tx:
                await tx.archive(record.id, "test", now)
        async with store.write() as tx:  # b made current again and re-embedded
            await tx.restore(b.id, now)
            assert await tx.set_vectors([(b, unit(0, 1, 0)[None, :])], "m")  # takes the last
            await tx.archive(c.id, "test", now)  # queued with that rowid again
            assert [row[0] for row in await tx.fetch("SELECT rowid FROM retired_vectors")] == [
                1,
                2,
            ]
            assert tx.retired_after == 2
        c_seq = await _seq(store, c.id)
        assert c_seq not in _held_seqs(store)
        logged = "SELECT count(*) FROM vector_changes WHERE seq = ?"
        changes = await store.reads.fetch(logged, [c_seq])
        assert changes[0][0] >= 2  # its insert, and its retirement
    finally:
        await store.close()


async def test_a_retired_records_rows_never_pass_for_a_current_records(tmp_path: Path) -> None:
    """A record made current again without vectors, and a deleted record's seq given to
    a record without vectors: neither is found by the old rows, through vec0's own
    search or as a neighbour in time (their rows go at the commit that revives them)."""
    store = await SqliteStore.open(tmp_path / "m.db", vector_copy=False)
    try:
        keep, gone = fact("kept", embedder="m"), fact("purged text", embedder="m")
        back = fact("restored without vectors", embedder="m")
        async with store.write() as tx:
            await tx.insert(keep, unit(1, 0, 0)[None, :])
            await tx.insert(back, unit(0, 0, 1)[None, :])
            await tx.insert(gone, unit(0, 1, 0)[None, :])
        now = format_time(utcnow())
        async with store.write() as tx:
            await tx.archive(back.id, "test", now)
            await tx.archive(gone.id, "test", now)
        gone_seq = await _seq(store, gone.id)
        async with store.write() as tx:
            await tx.restore(back.id, now)
            await tx.purge([gone.id], "9999", now)
        back_seq = await _seq(store, back.id)
        queued = "SELECT seq FROM retired_vectors"
        assert await store.reads.fetch(queued) == [(gone_seq,)]  # back's rows went
        newcomer = fact("a newcomer awaiting its vectors")
        async with store.write() as tx:
            await tx.insert(newcomer, None)
        assert await store.reads.fetch(queued) == []  # the reused seq's rows went too
        assert (await store.stats()).vector_indexes[0][3] == 1
        assert await _seq(store, newcomer.id) == gone_seq
        assert back_seq != gone_seq
        for old in (unit(0, 1, 0), unit(0, 0, 1)):
            found = [h.record.id for h in await store.nearest(old, "m", FILTERS, 5)]
            assert newcomer.id not in found and back.id not in found
        around = await store.in_conversation([keep.id], 3600, "m")
        assert newcomer.id not in around[keep.id].neighbours
        assert back.id not in around[keep.id].neighbours
        assert (await store.doctor()).healthy
    finally:
        await store.close()


async def test_a_process_without_sqlite_vec_leaves_the_rows_to_one_with_it(
    tmp_path: Path,
) -> None:
    """It cannot delete vec0's rows: it keeps their queue entries; a record it makes
    current again is not found by them; a process that can takes them over."""
    import dataclasses

    path = tmp_path / "m.db"
    store = await SqliteStore.open(path)
    try:
        r = fact("restored later", embedder="m")
        other = fact("written just after it", embedder="m")
        async with store.write() as tx:
            await tx.insert(r, unit(0, 1, 0)[None, :])
            await tx.insert(other, unit(0, 0, 1)[None, :])
        async with store.write() as tx:
            await tx.archive(r.id, "test", format_time(utcnow()))
        bare = await SqliteStore.open(path, driver=dataclasses.replace(store.driver, vectors=False))
        try:
            assert not bare.vectors_to_sweep
            assert await bare.sweep_vectors(8) == 0
            async with bare.write() as tx:  # made current again: its rows cannot go now
                await tx.restore(r.id, format_time(utcnow()))
        finally:
            await bare.close()
        assert (await store.reads.fetch("SELECT count(*) FROM retired_vectors")) == [(1,)]
        plain = await SqliteStore.open(path, vector_copy=False)
        try:  # its rows, still in vec0, are not its vectors
            found = [h.record.id for h in await plain.nearest(unit(0, 1, 0), "m", FILTERS, 5)]
            assert r.id not in found
            assert await plain.vectors_of(r.id, "m") is None
            around = await plain.in_conversation([other.id], 3600, "m")
            assert r.id not in around[other.id].neighbours
        finally:
            await plain.close()
        async with store.write() as tx:
            assert await tx.set_vectors([(r, unit(1, 0, 0)[None, :])], "m")
        assert await store.reads.fetch("SELECT count(*) FROM retired_vectors") == [(0,)]
        assert (await store.stats()).vector_indexes[0][3] == 2  # its new row and other's
        hits = await store.nearest(unit(1, 0, 0), "m", FILTERS, 5)
        assert hits[0].record.id == r.id and hits[0].score > 0.99
        assert (await store.doctor()).healthy
    finally:
        await store.close()


async def test_filters_apply_before_the_limit_in_the_vector_search(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        rows = [fact(f"fact {i}", embedder="m") for i in range(40)]
        rows[-1].tags = ["rare"]
        async with store.write() as tx:
            for i, r in enumerate(rows):
                await tx.insert(r, unit(1, i / 40, 0)[None, :])
        tagged = Filters(scope_keys=("/repo",), corpora=("facts",), tags=("rare",))
        hits = await store.nearest(unit(1, 0, 0), "m", tagged, 3)
        assert [h.record.id for h in hits] == [rows[-1].id]
    finally:
        await store.close()


@pytest.mark.parametrize(("copy", "dim", "tolerance"), [(True, 384, 1e-3), (False, 8, 1e-5)])
async def test_the_vector_search_equals_an_exhaustive_ranking(
    tmp_path: Path, copy: bool, dim: int, tolerance: float
) -> None:
    """Stopping at the first ``k`` distinct records loses nothing (first hit = best passage).

    The in-memory copy scores int8 codes: every cosine within ``tolerance`` of the
    exact one, so only records that close together may trade places.
    """
    rng = np.random.default_rng(7)
    store = await SqliteStore.open(tmp_path / "m.db", vector_copy=copy)
    try:
        rows = [fact(f"fact {i}", embedder="m") for i in range(300)]
        matrices = []
        for i, r in enumerate(rows):
            r.tags = ["rare"] if i % 23 == 0 else []
            m = rng.normal(size=(1 + i % 4, dim)).astype(np.float32)
            matrices.append(m / np.linalg.norm(m, axis=1, keepdims=True))
        async with store.write() as tx:
            for r, m in zip(rows, matrices, strict=True):
                await tx.insert(r, m)
        query = rng.normal(size=dim).astype(np.float32)
        query /= np.linalg.norm(query)
        best = {r.id: float((m @ query).max()) for r, m in zip(rows, matrices, strict=True)}
        rare = {r.id for r in rows if r.tags}
        tagged = Filters(scope_keys=("/repo",), corpora=("facts",), tags=("rare",))
        for filters, pool, k in ((FILTERS, set(best), 60), (tagged, rare, 10)):
            hits = await store.nearest(query, "m", filters, k)
            ids = [h.record.id for h in hits]
            assert len(set(ids)) == len(ids) == k and set(ids) <= pool
            for hit in hits:
                assert abs(hit.score - best[hit.record.id]) < tolerance
            exact = [best[i] for i in ids]
            assert all(a >= b - 2 * tolerance for a, b in itertools.pairwise(exact))
            assert max(best[i] for i in pool - set(ids)) <= min(exact) + 2 * tolerance
    finally:
        await store.close()


async def test_a_failed_transaction_leaves_nothing_behind(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        r = fact("delta", embedder="m")
        try:
            async with store.write() as tx:
                await tx.insert(r, unit(0, 1, 1)[None, :])
                raise RuntimeError("crash between two writes")
        except RuntimeError:
            pass
        assert await store.get(r.id) is None
        assert await store.nearest(unit(0, 1, 1), "m", FILTERS, 5) == []
        async with store.write() as tx:  # the store is still usable, the index recreatable
            await tx.insert(r, unit(0, 1, 1)[None, :])
        assert [h.record.id for h in await store.nearest(unit(0, 1, 1), "m", FILTERS, 5)] == [r.id]
    finally:
        await store.close()


async def test_vectors_follow_reembeds_folds_and_deletes_without_touching_others(
    tmp_path: Path,
) -> None:
    store = await SqliteStore.open(tmp_path / "m.db")

    async def index_rows() -> int:
        """The vec0 rows once the retired records' rows are swept (the engine's quiet)."""
        while await store.sweep_vectors(8):
            pass
        return (await store.stats()).vector_indexes[0][3]

    try:
        a, b = fact("alpha", embedder="m"), fact("beta", embedder="m")
        elsewhere = fact("gamma", embedder="m")
        elsewhere.scope_key = "/other"
        async with store.write() as tx:
            await tx.insert(a, unit(1, 0, 0)[None, :])
            await tx.insert(b, np.stack([unit(0, 1, 0), unit(0, 1, 1)]))
            await tx.insert(elsewhere, unit(1, 0, 0)[None, :])
        assert await index_rows() == 4

        async with store.write() as tx:  # re-embed: b's two vectors become three others
            assert await tx.set_vectors(
                [(b, np.stack([unit(0, 0, 1), unit(1, 1, 1), unit(1, 0, 1)]))], "m"
            )
        assert await index_rows() == 5
        assert abs((await store.dense_scores(unit(0, 1, 0), "m", [b.id]))[b.id] - 0.577) < 1e-3

        async with store.write() as tx:  # a folds into b: its vector moves along
            assert await tx.carry_vectors(a.id, b.id, "m") == 1
            await tx.fold_into(a, b.id, None, format_time(utcnow()))  # type: ignore[arg-type]
        assert await index_rows() == 5
        assert abs((await store.dense_scores(unit(1, 0, 0), "m", [b.id]))[b.id] - 1.0) < 1e-5
        assert await store.dense_scores(unit(1, 0, 0), "m", [a.id]) == {}

        async with store.write() as tx:  # a hard delete (the purge) takes its vectors along
            await tx.execute("DELETE FROM records WHERE id = ?", [b.id])
        assert await index_rows() == 1
        hits = await store.nearest(unit(1, 0, 0), "m", Filters(("/other",), ("facts",)), 5)
        assert [h.record.id for h in hits] == [elsewhere.id]
        async with store.write() as tx:
            assert await tx.fetch("SELECT count(*) FROM retired_vectors") == [(0,)]
    finally:
        await store.close()


async def query_plan(tmp_path: Path, sql: str, params: list[object]) -> list[str]:
    """The steps of SQLite's plan for ``sql`` on a fresh store."""
    store = await SqliteStore.open(tmp_path / "plan.db")
    try:
        plan = await store.reads.fetch("EXPLAIN QUERY PLAN " + sql, params)
    finally:
        await store.close()
    return [str(row[-1]) for row in plan]


async def test_a_time_bound_keeps_the_full_text_match_as_the_outer_loop(tmp_path: Path) -> None:
    from memory_mcp.storage.sqlite.sql import filters_sql, lexical_sql

    where, params = filters_sql(Filters(("k",), ("facts",), since="2000-01-01T00:00:00.000000Z"))
    steps = await query_plan(tmp_path, lexical_sql(where), ["word", *params, 10])
    assert "records_fts" in steps[0], steps


async def test_neighbours_in_time_are_read_by_rowid_not_sought(tmp_path: Path) -> None:
    """Each record's neighbours in time are its row of the kept table (``neighbours``),
    read by rowid: no seek in ``records_live``, no sort."""
    from memory_mcp.storage.sqlite.neighbours import neighbours_sql

    steps = await query_plan(tmp_path, neighbours_sql(["a", "b"], True), [60, 60, "a", "b", "m"])
    assert any(s.startswith("SEARCH n USING INTEGER PRIMARY KEY") for s in steps), steps
    assert not any("records_live" in s or "TEMP B-TREE" in s for s in steps), steps


async def test_the_exact_repeat_check_looks_the_hash_up_in_its_index(tmp_path: Path) -> None:
    from memory_mcp.storage.sqlite.sql import filters_sql, hash_sql

    where, params = filters_sql(FILTERS)
    steps = await query_plan(tmp_path, hash_sql(where), ["h", *params])
    assert any("records_hash" in step and "content_hash=?" in step for step in steps), steps


async def test_records_found_by_vector_are_read_by_rowid(tmp_path: Path) -> None:
    from memory_mcp.storage.sqlite.sql import by_seq_sql, filters_sql

    tagged = Filters(scope_keys=("/repo",), corpora=("facts",), tags=("rare",))
    for filters in (FILTERS, tagged):
        where, params = filters_sql(filters)
        steps = await query_plan(tmp_path, by_seq_sql([1, 2, 3], where), [1, 2, 3, *params])
        assert "INTEGER PRIMARY KEY" in steps[0], steps


async def test_vector_slots_are_found_by_record_id(tmp_path: Path) -> None:
    from memory_mcp.storage.sqlite.sql import slots_sql

    ids = [f"f_{i}" for i in range(60)]  # from 30 on, SQLite preferred records_embedder
    steps = await query_plan(tmp_path, slots_sql(ids), [*ids, "m"])
    assert "(id=?)" in steps[0] and "records_embedder" not in steps[0], steps


# The in-memory copy of the vector tables follows every writer of the file.


async def ids_near(store: SqliteStore, vector: np.ndarray, filters: Filters = FILTERS) -> list[str]:
    return [h.record.id for h in await store.nearest(vector, "m", filters, 5)]


async def test_a_copy_sees_what_another_process_writes(tmp_path: Path) -> None:
    reader = await SqliteStore.open(tmp_path / "m.db")
    writer = await SqliteStore.open(tmp_path / "m.db")
    try:
        a, b = fact("alpha", embedder="m"), fact("beta", embedder="m")
        async with writer.write() as tx:
            await tx.insert(a, unit(1, 0, 0)[None, :])
        assert await ids_near(reader, unit(1, 0, 0)) == [a.id]
        assert "in-memory copy" in reader.vector_copy

        async with writer.write() as tx:  # a new record, then a re-embed
            await tx.insert(b, unit(0, 1, 0)[None, :])
        assert (await ids_near(reader, unit(0, 1, 0)))[0] == b.id
        async with writer.write() as tx:
            await tx.set_vectors([(a, unit(0, 0, 1)[None, :])], "m")
        hits = await reader.nearest(unit(0, 0, 1), "m", FILTERS, 1)
        assert [h.record.id for h in hits] == [a.id] and abs(hits[0].score - 1.0) < 1e-3
        assert abs((await reader.dense_scores(unit(0, 0, 1), "m", [a.id]))[a.id] - 1.0) < 1e-3

        async with writer.write() as tx:  # archived: gone from the copy too
            await tx.archive(a.id, "forgotten", format_time(utcnow()))
        assert await ids_near(reader, unit(0, 0, 1)) == [b.id]
        assert await reader.dense_scores(unit(0, 0, 1), "m", [a.id]) == {}
    finally:
        await reader.close()
        await writer.close()


async def test_each_scope_is_loaded_when_first_searched(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        here, there = fact("here", embedder="m"), fact("there", embedder="m")
        there.scope_key = "/other"
        async with store.write() as tx:
            await tx.insert(here, unit(1, 0, 0)[None, :])
            await tx.insert(there, unit(1, 0, 0)[None, :])
        assert await ids_near(store, unit(1, 0, 0)) == [here.id]
        both = Filters(scope_keys=("/repo", "/other"), corpora=("facts",))
        assert sorted(await ids_near(store, unit(1, 0, 0), both)) == sorted([here.id, there.id])
    finally:
        await store.close()


async def test_a_scope_loads_its_live_records_each_with_its_kind(tmp_path: Path) -> None:
    """A fresh copy reads vec0's rows of the live records only, each with its own
    record's kind, whatever order the records and their rows come in."""
    writer = await SqliteStore.open(tmp_path / "m.db")
    kinds = ["decision", "fact", "gotcha", "fact", "decision", "gotcha", "fact"]
    records = [fact(f"note {n}", kind=k, embedder="m") for n, k in enumerate(kinds)]
    try:
        async with writer.write() as tx:
            for n, record in enumerate(reversed(records)):  # rows not in the records' order
                await tx.insert(record, unit(1, 0.01 * n, 0)[None, :])
        async with writer.write() as tx:
            await tx.archive(records[4].id, "forgotten", format_time(utcnow()))
            await tx.archive(records[1].id, "forgotten", format_time(utcnow()))
    finally:
        await writer.close()
    with contextlib.closing(sqlite3.connect(tmp_path / "m.db")) as conn, conn:
        # rows vec0 still holds for a record said to have none: not loaded
        conn.execute("UPDATE records SET vec_rows = 0 WHERE id = ?", [records[2].id])
    fresh = await SqliteStore.open(tmp_path / "m.db")
    try:
        for kind in ("decision", "fact", "gotcha"):
            only = Filters(scope_keys=("/repo",), corpora=("facts",), kinds=(kind,))
            found = {h.record.id for h in await fresh.nearest(unit(1, 0, 0), "m", only, 10)}
            wanted = {r.id for n, r in enumerate(records) if r.kind == kind and n not in (1, 2, 4)}
            assert found == wanted, kind
        segment = next(iter(fresh._copies.values()))._segments["/repo"]
        held = segment.rowid[: segment.size] // dense.MAX_PASSAGES
        assert len(held) == len(set(held.tolist())) == 4  # record 2's rows left in vec0
    finally:
        await fresh.close()


async def test_a_transaction_sees_its_own_uncommitted_vectors(tmp_path: Path) -> None:
    """A batch of stores folds within itself: later items find the earlier ones."""
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        a, b = fact("alpha", embedder="m"), fact("beta", embedder="m")
        async with store.write() as tx:
            await tx.insert(a, unit(1, 0, 0)[None, :])
        assert await ids_near(store, unit(1, 0, 0)) == [a.id]  # the copy is loaded
        async with store.write() as tx:
            await tx.insert(b, unit(0, 1, 0)[None, :])
            await tx.set_vectors([(a, unit(0, 0, 1)[None, :])], "m")
            assert [h.record.id for h in await tx.nearest(unit(0, 1, 0), "m", FILTERS, 1)] == [b.id]
            hits = await tx.nearest(unit(0, 0, 1), "m", FILTERS, 1)
            assert [h.record.id for h in hits] == [a.id] and abs(hits[0].score - 1.0) < 1e-5
            assert abs((await tx.dense_scores(unit(1, 0, 0), "m", [a.id]))[a.id]) < 1e-5
        # committed now, and the copy has caught up
        hits = await store.nearest(unit(0, 0, 1), "m", FILTERS, 1)
        assert [h.record.id for h in hits] == [a.id] and abs(hits[0].score - 1.0) < 1e-3
    finally:
        await store.close()


async def test_a_copy_far_behind_the_log_reloads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dense, "_RELOAD_AFTER", 2)
    reader = await SqliteStore.open(tmp_path / "m.db")
    writer = await SqliteStore.open(tmp_path / "m.db")
    try:
        rows = [fact(f"fact {i}", embedder="m") for i in range(6)]
        async with writer.write() as tx:
            await tx.insert(rows[0], unit(1, 0, 0)[None, :])
        assert await ids_near(reader, unit(1, 0, 0)) == [rows[0].id]
        async with writer.write() as tx:
            for i, r in enumerate(rows[1:], start=1):
                await tx.insert(r, unit(1, i, 0)[None, :])
        assert await ids_near(reader, unit(0, 1, 0)) == [r.id for r in reversed(rows[1:])]
    finally:
        await reader.close()
        await writer.close()


async def test_an_unknown_vec0_layout_falls_back_to_vec0_searches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dense, "_SUPPORTED_LAYOUT", ("9", "9"))
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        a = fact("alpha", embedder="m")
        async with store.write() as tx:
            await tx.insert(a, unit(1, 0, 0)[None, :])
        hits = await store.nearest(unit(1, 0, 0), "m", FILTERS, 5)
        assert [h.record.id for h in hits] == [a.id] and abs(hits[0].score - 1.0) < 1e-6
        assert store.vector_copy.startswith("through vec0")
    finally:
        await store.close()


async def test_the_change_log_is_pruned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from memory_mcp.storage.sqlite import dense

    monkeypatch.setattr(dense, "KEEP_CHANGES", 10)
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        async with store.write() as tx:
            for i in range(1005):
                await tx.insert(fact(f"fact {i}", embedder="m"), unit(1, i, 0)[None, :])
            rows = await tx.fetch("SELECT count(*), min(id) FROM vector_changes")
        assert rows == [(15, 991)]
    finally:
        await store.close()


async def test_the_write_path_matches_on_a_memorys_rarest_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memory_mcp.storage import bm25
    from memory_mcp.storage.sqlite import queries

    monkeypatch.setattr(bm25, "RARE_TERMS", 3)
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        common = [fact(f"run the tests before a release, note {i}") for i in range(30)]
        twin = fact("the billing adapter retries webhooks before a release")
        async with store.write() as tx:
            for r in [*common, twin]:
                await tx.insert(r, None)
        text = "billing adapter retries webhooks; run the tests before a release"
        terms = queries.query_terms(text)
        stems = {queries.stem(t) for t in terms}
        held = await on_thread(store._reader, store._word_counts.read, stems, False)
        rare = queries.rarest(terms, held)
        assert set(rare) == {"billing", "adapter", "retries"}  # three, none of the common
        hits = await store.reads.lexical(text, FILTERS, 5, rare_words=True)
        assert [h.record.id for h in hits] == [twin.id]
        async with store.write() as tx:  # the same in a transaction (counts on the reader)
            hits = await tx.lexical(text, FILTERS, 5, rare_words=True)
            assert [h.record.id for h in hits] == [twin.id]
        everything = await store.reads.lexical(text, FILTERS, 50)
        assert len(everything) == 31  # a search still matches on every word
    finally:
        await store.close()


async def test_a_write_during_a_scope_load_leaves_the_copy_on(tmp_path: Path) -> None:
    """Rows deleted between the chunk list and the vectors: the load is tried again."""
    reader = await SqliteStore.open(tmp_path / "m.db")
    writer = await SqliteStore.open(tmp_path / "m.db")
    try:
        rows = [fact(f"fact {i}", embedder="m") for i in range(4)]
        async with writer.write() as tx:
            for i, r in enumerate(rows):
                await tx.insert(r, unit(1, i, 0)[None, :])
        fetch = reader.reads.fetch
        spoiled = False

        async def fetch_with_a_write_between(sql: str, params: object = ()) -> list[object]:
            nonlocal spoiled
            if "_vector_chunks00" in sql and not spoiled:
                spoiled = True
                async with writer.write() as tx:
                    await tx.archive(rows[-1].id, "gone", format_time(utcnow()))
            return await fetch(sql, params)  # type: ignore[arg-type]

        reader.reads.fetch = fetch_with_a_write_between  # type: ignore[method-assign]
        hits = await reader.nearest(unit(0, 1, 0), "m", FILTERS, 5)
        assert spoiled and rows[-1].id not in [h.record.id for h in hits]
        assert [h.record.id for h in hits] == [r.id for r in reversed(rows[:-1])]
        assert "in-memory copy" in reader.vector_copy
    finally:
        await reader.close()
        await writer.close()


async def test_a_filter_few_records_pass_is_applied_to_the_rows_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memory_mcp.storage.sqlite import queries

    monkeypatch.setattr(queries, "_KNN_MAX", 64)
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        rows = [fact(f"fact {i}", embedder="m") for i in range(300)]
        for r in rows[-2:]:
            r.tags = ["rare"]
        async with store.write() as tx:
            for i, r in enumerate(rows):
                await tx.insert(r, unit(1, i / 300, 0)[None, :])
        tagged = Filters(scope_keys=("/repo",), corpora=("facts",), tags=("rare",))
        hits = await store.nearest(unit(1, 0, 0), "m", tagged, 3)
        assert [h.record.id for h in hits] == [rows[-2].id, rows[-1].id]
    finally:
        await store.close()


def _around_centres(count: int, centres: int, seed: int) -> np.ndarray:
    """``count`` unit vectors (16 dimensions) near ``centres`` random centres, in turn."""
    rng = np.random.default_rng(seed)
    around = rng.normal(size=(centres, 16))
    vectors = around[np.arange(count) % centres] + 0.2 * rng.normal(size=(count, 16))
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


async def _clustered(
    store: SqliteStore, rows: list[Record], vectors: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> dense._Segment:
    """The rows written with their vectors, and their scope's segment once clustered."""
    monkeypatch.setattr(dense, "CLUSTER_FROM", 200)
    async with store.write() as tx:
        for r, v in zip(rows, vectors, strict=True):
            await tx.insert(r, v.astype(np.float32)[None, :])
    assert await store.load_vectors("m", ["/repo"], settle=60)
    return next(iter(store._copies.values()))._segments["/repo"]


async def test_a_clustered_scope_answers_from_its_nearest_clusters_and_falls_back_for_filters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dense, "IVF_PROBES", 6)
    vectors = _around_centres(600, 12, seed=8)
    query = vectors[5] / np.linalg.norm(vectors[5])
    rows = [fact(f"fact {i}", embedder="m") for i in range(600)]
    far = [i for i in range(600) if float(vectors[i] @ query) < -0.3][:2]
    for i in far:
        rows[i].tags = ["rare"]
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        segment = await _clustered(store, rows, vectors, monkeypatch)
        assert segment.clusters > 30  # the search scores 6 clusters of many
        hits = await store.nearest(query.astype(np.float32), "m", FILTERS, 5)
        held = segment.cosines(query.astype(np.float32))[: segment.size]  # every row
        seqs = segment.rowid[: segment.size][np.argsort(-held)[:5]] // dense.MAX_PASSAGES
        seq_of = dict(await store.reads.fetch("SELECT id, seq FROM records"))
        assert [seq_of[h.record.id] for h in hits] == seqs.tolist()
        tagged = Filters(scope_keys=("/repo",), corpora=("facts",), tags=("rare",))
        hits = await store.nearest(query.astype(np.float32), "m", tagged, 5)
        assert len(far) == 2 and {h.record.id for h in hits} == {rows[i].id for i in far}
    finally:
        await store.close()


async def test_a_new_memorys_neighbours_come_from_fewer_clusters_than_a_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write path's neighbour read (``nearest_with_scores``) scores the rows of the
    ``NEIGHBOUR_PROBES`` nearest clusters, a search (``nearest``) those of
    ``IVF_PROBES``; both find the nearest records of well-separated clusters."""
    monkeypatch.setattr(dense, "IVF_PROBES", 12)
    monkeypatch.setattr(queries, "NEIGHBOUR_PROBES", 3)
    monkeypatch.setattr(dense, "PROBE_ROWS", 1)  # as many clusters as asked, however small
    vectors = _around_centres(960, 24, seed=11)
    rows = [fact(f"fact {i}", embedder="m") for i in range(960)]
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        segment = await _clustered(store, rows, vectors, monkeypatch)
        assert segment.clusters > 12
        scored: list[int] = []
        probe = dense._Segment.probe

        def counted(self: dense._Segment, *args: object) -> object:
            found = probe(self, *args)  # type: ignore[arg-type]
            scored.append(0 if found is None else len(found[0]))
            return found

        monkeypatch.setattr(dense._Segment, "probe", counted)
        query = vectors[7].astype(np.float32)
        sizes = np.diff(segment.starts[: segment.clusters + 1])
        nearest_first = np.argsort(-(segment.centroids @ query))
        searched = await store.nearest(query, "m", FILTERS, 5)
        near, scores = await store.nearest_with_scores(query, "m", FILTERS, 5, [rows[8].id])
        assert scored == [sizes[nearest_first[:12]].sum(), sizes[nearest_first[:3]].sum()]
        assert [h.record.id for h in near] == [h.record.id for h in searched]
        assert rows[7].id == near[0].record.id and set(scores) == {rows[8].id}
    finally:
        await store.close()


async def test_a_ranking_made_ahead_stands_for_the_read_until_a_vector_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rank_ahead`` ranks the probed clusters' rows before the read; the read takes that
    ranking (no ranking of its own) when it asks the same and nothing was written
    since, and ranks again otherwise: a memory written in between is found."""
    monkeypatch.setattr(dense, "PROBE_ROWS", 1)
    vectors = _around_centres(480, 12, seed=5)
    rows = [fact(f"fact {i}", embedder="m") for i in range(480)]
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        await _clustered(store, rows, vectors, monkeypatch)
        ranked: list[int] = []
        rank = dense.DenseIndex.rank

        def counted(self: dense.DenseIndex, *args: Any, **kwargs: Any) -> dense.Ranking:
            ranked.append(1)
            return rank(self, *args, **kwargs)

        monkeypatch.setattr(dense.DenseIndex, "rank", counted)
        query = (vectors[3] + 0.1 * vectors[4]).astype(np.float32)
        query /= np.linalg.norm(query)
        plain = await store.nearest_with_scores(query, "m", FILTERS, 5, [rows[9].id], probes=4)
        assert len(ranked) == 1 and plain[0][0].record.id == rows[3].id

        ahead = await store.rank_ahead(query, "m", FILTERS, 4)
        assert ahead is not None and len(ranked) == 2
        taken = await store.nearest_with_scores(
            query, "m", FILTERS, 5, [rows[9].id], probes=4, ahead=ahead
        )
        assert len(ranked) == 2  # the read ranked nothing itself
        assert [(h.record.id, h.score) for h in taken[0]] == [
            (h.record.id, h.score) for h in plain[0]
        ]
        assert taken[1] == plain[1]

        # asked otherwise (more clusters, another kind): ranked again
        await store.nearest_with_scores(query, "m", FILTERS, 5, [], probes=6, ahead=ahead)
        other = Filters(scope_keys=("/repo",), corpora=("facts",), kinds=("fact",))
        await store.nearest_with_scores(query, "m", other, 5, [], probes=4, ahead=ahead)
        assert len(ranked) == 4

        ahead = await store.rank_ahead(query, "m", FILTERS, 4)
        closer = fact("the nearest of all", embedder="m")
        async with store.write() as tx:
            await tx.insert(closer, query[None, :])
        found = await store.nearest_with_scores(query, "m", FILTERS, 5, [], probes=4, ahead=ahead)
        assert found[0][0].record.id == closer.id
    finally:
        await store.close()


async def test_no_ranking_ahead_without_a_copy_of_the_scopes(tmp_path: Path) -> None:
    """A scope the copy does not hold yet (or a table not known yet) is not ranked ahead:
    the read loads and ranks it as before."""
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        assert await store.rank_ahead(unit(1, 0, 0), "m", FILTERS, 4) is None
        async with store.write() as tx:
            await tx.insert(fact("a fact", embedder="m"), unit(1, 0, 0)[None, :])
        assert await store.rank_ahead(unit(1, 0, 0), "m", FILTERS, 4) is None
        assert await store.nearest(unit(1, 0, 0), "m", FILTERS, 1)  # loads the scope
        assert await store.rank_ahead(unit(1, 0, 0), "m", FILTERS, 4) is not None
        elsewhere = Filters(scope_keys=("/other",), corpora=("facts",))
        assert await store.rank_ahead(unit(1, 0, 0), "m", elsewhere, 4) is None
    finally:
        await store.close()


async def test_closing_the_store_stops_a_clustering_that_is_still_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process must not exit while a clustering thread is inside a matrix product
    (OpenBLAS's exit handler then hangs or crashes): ``close`` stops and joins it."""
    monkeypatch.setattr(dense, "CLUSTER_FROM", 200)
    monkeypatch.setattr(dense, "_ROUNDS", 10**9)  # it never ends by itself
    monkeypatch.setattr(dense, "_CLUSTER_BLOCK", 64)
    rng = np.random.default_rng(9)
    vectors = rng.normal(size=(300, 16))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    store = await SqliteStore.open(tmp_path / "m.db")
    closed = False
    try:
        async with store.write() as tx:
            for i, v in enumerate(vectors):
                await tx.insert(fact(f"fact {i}", embedder="m"), v.astype(np.float32)[None, :])
        assert not await store.load_vectors("m", ["/repo"], settle=0.2)  # still clustering
        job = next(iter(store._copies.values()))._segments["/repo"]._clustering
        assert job is not None and job.thread.is_alive()
        await store.close()
        closed = True
        assert not job.thread.is_alive() and job.result is None
    finally:
        if not closed:
            await store.close()


def held(store: SqliteStore) -> dict[int, tuple[str, int, int, bytes]]:
    """What a store's copy of the "m" vectors holds: each live row's scope, corpus and
    kind codes, and its int8 codes."""
    index = next(iter(store._copies.values()))
    names = {code: name for name, code in index._codes.items()}
    rows: dict[int, tuple[str, int, int, bytes]] = {}
    for key, segment in index._segments.items():
        live = np.flatnonzero(segment.rowid[: segment.size] >= 0)
        codes = segment.codes.take(live)
        for i, position in enumerate(live.tolist()):
            rows[int(segment.rowid[position])] = (
                key,
                names[int(segment.corpus[position])],
                names[int(segment.kind[position])],
                codes[i].tobytes(),
            )
    return rows


async def test_a_copy_takes_its_own_writes_without_reading_them_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a commit the store's copy takes what its transaction wrote and deleted
    (``vectors.Journal``): the same rows a copy loaded afresh holds, with nothing read
    back from vec0; a copy that is behind (another process wrote first) reads it back."""
    store = await SqliteStore.open(tmp_path / "m.db")
    other = await SqliteStore.open(tmp_path / "m.db")
    elsewhere = Filters(("/other",), ("facts",))
    try:
        a, b, c, d = (fact(t, embedder="m") for t in ("alpha", "beta", "gamma", "delta"))
        away = fact("epsilon", embedder="m", scope_key="/other")
        async with store.write() as tx:
            await tx.insert(a, unit(1, 0, 0)[None, :])
            await tx.insert(b, np.stack([unit(0, 1, 0), unit(0, 1, 1)]))
            await tx.insert(c, unit(0, 0, 1)[None, :])
            await tx.insert(d, unit(1, 1, 0)[None, :])
            await tx.insert(away, unit(1, 0, 1)[None, :])
        assert await ids_near(store, unit(1, 0, 0)) and await ids_near(
            store, unit(1, 0, 1), elsewhere
        )

        async def no_reading_back(*args: object) -> None:
            raise AssertionError("the copy read its own writes back from vec0")

        monkeypatch.setattr(dense.DenseIndex, "_reread", no_reading_back)
        e = fact("zeta", embedder="m")
        async with store.write() as tx:  # every kind of vector write in one transaction
            await tx.insert(e, np.stack([unit(1, 2, 3), unit(3, 2, 1)]))  # new, 2 passages
            await tx.set_vectors(
                [(b, np.stack([unit(2, 1, 0), unit(0, 2, 1), unit(1, 1, 1)]))], "m"
            )
            assert await tx.carry_vectors(a.id, d.id, "m") == 1  # a folds into d
            await tx.fold_into(a, d.id, None, format_time(utcnow()))  # type: ignore[arg-type]
            await tx.drop_vectors(c.id)  # awaits embedding again
            await tx.archive(away.id, "forgotten", format_time(utcnow()))
        journal_rows = held(store)
        assert (await ids_near(store, unit(1, 2, 3)))[0] == e.id
        assert await ids_near(store, unit(1, 0, 1), elsewhere) == []

        fresh = await SqliteStore.open(tmp_path / "m.db")
        try:
            monkeypatch.undo()
            await ids_near(fresh, unit(1, 0, 0))
            await ids_near(fresh, unit(1, 0, 1), elsewhere)
            assert journal_rows == held(fresh)
        finally:
            await fresh.close()
        assert {r // dense.MAX_PASSAGES for r in journal_rows} == {
            int(s)
            for (s,) in await store.reads.fetch(
                "SELECT seq FROM records WHERE id IN (?, ?, ?)", [b.id, d.id, e.id]
            )
        }

        # Another process commits first: this copy is behind, so it reads back.
        async with other.write() as tx:
            await tx.insert(fact("eta", embedder="m"), unit(0, 1, 1)[None, :])
        f = fact("theta", embedder="m")
        async with store.write() as tx:
            await tx.insert(f, unit(5, 1, 7)[None, :])
        assert (await ids_near(store, unit(5, 1, 7)))[0] == f.id
        assert len(held(store)) == len(journal_rows) + 2
    finally:
        await store.close()
        await other.close()


async def test_a_write_cancelled_while_it_waits_for_the_lock_leaves_no_transaction(
    tmp_path: Path,
) -> None:
    """BEGIN runs on the writer's thread whatever the caller does: cancelled while it
    waits for another process's lock, the write still ends the transaction it began."""
    import anyio

    store = await SqliteStore.open(tmp_path / "m.db", busy_timeout_ms=5000)
    other = store.driver.connect(str(tmp_path / "m.db"), busy_timeout_ms=1000)
    other.execute("BEGIN IMMEDIATE")

    async def release() -> None:
        await anyio.sleep(0.3)
        other.execute("ROLLBACK")

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(release)
            with anyio.move_on_after(0.1):
                async with store.write() as tx:
                    await tx.insert(fact("never written"), None)
        assert not store._writer.in_transaction
        kept = fact("written after")
        async with store.write() as tx:
            await tx.insert(kept, None)
        assert await store.get(kept.id) is not None
        other.execute("BEGIN IMMEDIATE")  # another process can write again
        other.execute("ROLLBACK")
    finally:
        other.close()
        await store.close()


async def test_a_copy_reloaded_for_another_scope_meanwhile_is_not_searched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search that found its scope in the copy, then waited for the copy's lock while
    another search reloaded it for another scope, reads vec0 instead of an empty copy."""
    import asyncio

    store = await SqliteStore.open(tmp_path / "m.db")
    other = await SqliteStore.open(tmp_path / "m.db", vector_copy=False)
    try:
        vector = np.ones(8, np.float32)
        async with store.write() as tx:
            await tx.insert(fact("in X", scope_key="/x", embedder="e"), vector[None, :])
            await tx.insert(fact("in Y", scope_key="/y", embedder="e"), -vector[None, :])
        await store.load_vectors("e", ["/x", "/y"])
        index = next(iter(store._copies.values()))
        filters = Filters(scope_keys=("/x",), corpora=("facts",))
        async with other.write() as tx:  # another process writes: the copy is behind
            await tx.insert(fact("more Y", scope_key="/y", embedder="e"), -vector[None, :])
        monkeypatch.setattr(dense, "_RELOAD_AFTER", 0)  # as far behind as reloads
        async with index.lock:
            search = asyncio.create_task(store.nearest(vector, "e", filters, 5))
            await asyncio.sleep(0.05)  # it saw /x held, and waits for the lock
            await index.prepare(store.reads.fetch, ["/y"])  # a reload: /y only
        assert [s.record.content for s in await search] == ["in X"]
    finally:
        await store.close()
        await other.close()


def test_word_counts_forgotten_mid_read_still_answer_and_zeros_are_read_again() -> None:
    """A ``forget`` (maintenance's sweep) between a lookup and the counts it asked for
    does not lose the counts the lookup found; a word no record held is read again."""
    from memory_mcp.storage.bm25 import CountCache

    cache = CountCache()
    assert cache.remember(["alpha", "beta", "zeta"], {"alpha": 2, "beta": 1}, 100.0) == {
        "alpha": 2,
        "beta": 1,
    }
    known, missing = cache.lookup(["alpha", "beta", "gamma", "zeta"], 50.0)
    assert known == {"alpha": 2, "beta": 1} and missing == ["gamma", "zeta"]
    cache.forget()
    known |= cache.remember(missing, {"gamma": 3}, 101.0)
    assert known == {"alpha": 2, "beta": 1, "gamma": 3}
    assert cache.lookup(["alpha", "gamma"], 50.0) == ({"gamma": 3}, ["alpha"])
    assert cache.lookup(["gamma"], 101.5) == ({}, ["gamma"])  # read before ``since``
    cache.remember(["zeta"], {}, 102.0)
    assert cache.lookup(["zeta"], 50.0) == ({}, ["zeta"])  # counts may be behind: read again
    assert cache.lookup(["zeta"], 50.0, exact=True) == ({}, [])  # nothing written since


async def test_word_counts_start_over_when_too_many_are_remembered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memory_mcp.storage import bm25

    monkeypatch.setattr(bm25, "COUNTS_MAX", 3)
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        async with store.write() as tx:
            await tx.insert(fact("alpha beta gamma delta epsilon"), None)
        counts = store._word_counts
        held = await on_thread(
            store._reader, counts.read, {"alpha", "beta", "gamma", "delta"}, False
        )
        assert held == dict.fromkeys(["alpha", "beta", "gamma", "delta"], 1)
        held = await on_thread(store._reader, counts.read, {"alpha", "epsilon"}, False)
        assert held == {"alpha": 1, "epsilon": 1}
    finally:
        await store.close()


def _index(store: SqliteStore) -> dense.DenseIndex:
    return next(iter(store._copies.values()))


async def _kept(store: SqliteStore) -> None:
    """Wait for the copies being kept to be written."""
    for writer in _index(store)._writers:
        writer.join(30)


async def _with_kept_copy(
    tmp_path: Path, vectors: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> SqliteStore:
    """The store ``tmp_path/m.db``, its scope of a row for each of ``vectors``
    clustered and kept."""
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        rows = [fact(f"f {i}", embedder="m") for i in range(len(vectors))]
        await _clustered(store, rows, vectors, monkeypatch)
        # settled: the copy is kept too
        assert not any(w.is_alive() for w in _index(store)._writers)
        assert list((tmp_path / "m.db-vectors").glob("*.npz"))
    except BaseException:
        await store.close()
        raise
    return store


def _chunk_reads(store: SqliteStore) -> list[str]:
    """The statements a store's reader runs that read vec0's vector chunks, as it runs them."""
    seen: list[str] = []
    fetch = store.reads.fetch

    async def counting(sql: str, params: Any = ()) -> list[Any]:
        if "_vector_chunks00" in sql:
            seen.append(sql)
        return await fetch(sql, params)

    store.reads.fetch = counting  # type: ignore[method-assign]
    return seen


async def _taken_from_copy(path: Path) -> tuple[SqliteStore, dense._Segment]:
    """The store at ``path`` opened again, its scope ``/repo`` loaded from the kept copy
    (no chunk of vec0 read), and that scope's segment."""
    store = await SqliteStore.open(path)
    try:
        reads = _chunk_reads(store)
        assert await store.load_vectors("m", ["/repo"])
        assert reads == []  # the copy was taken
    except BaseException:
        await store.close()
        raise
    return store, _index(store)._segments["/repo"]


async def test_a_clustered_scope_is_kept_for_the_next_process_and_caught_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next process takes a clustered scope from the copy the last one kept, with
    the writes made since, instead of reading vec0's chunks and clustering again."""
    vectors = _around_centres(600, 12, seed=3)
    rows = [fact(f"fact {i}", embedder="m") for i in range(600)]
    first = await SqliteStore.open(tmp_path / "m.db")
    try:
        await _clustered(first, rows, vectors, monkeypatch)
        await _kept(first)
        assert list((tmp_path / "m.db-vectors").glob("*.codes"))
        query = vectors[7].astype(np.float32)
        before = [h.record.id for h in await first.nearest(query, "m", FILTERS, 10)]
        async with first.write() as tx:  # after the copy was kept
            await tx.archive(before[0], "forgotten", format_time(utcnow()))
            await tx.insert(late := fact("late", embedder="m"), query[None, :])
    finally:
        await first.close()
    second, segment = await _taken_from_copy(tmp_path / "m.db")
    try:
        assert segment.clusters > 0 and segment._clustering is None
        found = [h.record.id for h in await second.nearest(query, "m", FILTERS, 10)]
        assert found[0] == late.id and before[0] not in found
        assert found[1:] == before[1:10]
    finally:
        await second.close()
    # a copy many changes behind is kept again by the process that took it
    (kept,) = (tmp_path / "m.db-vectors").glob("*.npz")
    position = json.loads(str(np.load(kept)["meta"]))["position"]
    monkeypatch.setattr(dense, "_KEEP_AGAIN_AFTER", 1)
    third = await SqliteStore.open(tmp_path / "m.db")
    try:
        assert await third.load_vectors("m", ["/repo"])
        await _kept(third)
    finally:
        await third.close()
    assert json.loads(str(np.load(kept)["meta"]))["position"] > position


async def test_a_copy_whose_first_and_last_records_went_since_is_still_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The records read again drop their rows from the copy; the check of a few rows
    against vec0 looks at live ones, so a copy whose first, middle and last rows'
    records were archived since is taken, not read from the chunks again."""
    vectors = _around_centres(600, 12, seed=9)
    first = await _with_kept_copy(tmp_path, vectors, monkeypatch)
    try:
        segment = _index(first)._segments["/repo"]
        ends = {int(segment.rowid[i]) // dense.MAX_PASSAGES for i in (0, segment.size - 1)}
        ends.add(int(segment.rowid[segment.size // 2]) // dense.MAX_PASSAGES)
        gone = [
            str(row[0])
            for s in ends
            for row in await first.reads.fetch("SELECT id FROM records WHERE seq = ?", [s])
        ]
        async with first.write() as tx:
            for record_id in gone:
                assert await tx.archive(record_id, "folded", format_time(utcnow()))
    finally:
        await first.close()
    second, held = await _taken_from_copy(tmp_path / "m.db")
    try:
        assert held.size - held.dead == 600 - len(gone)
        found = await second.nearest(vectors[3].astype(np.float32), "m", FILTERS, 600)
        assert not {h.record.id for h in found} & set(gone)
    finally:
        await second.close()


async def test_a_process_that_wrote_many_changes_keeps_its_copy_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``_KEEP_EVERY`` log entries since its copy was kept, a process keeps the scope
    again as it goes (not only when a clustering lands), so that the next process takes
    a copy that is not too far behind to trust, with the records since."""
    monkeypatch.setattr(dense, "_TAIL_SHARE", 1.0)  # no clustering lands meanwhile
    vectors = _around_centres(600, 12, seed=6)
    first = await _with_kept_copy(tmp_path, vectors, monkeypatch)
    (kept,) = (tmp_path / "m.db-vectors").glob("*.npz")

    def kept_position() -> int:
        return int(json.loads(str(np.load(kept)["meta"]))["position"])

    position = kept_position()
    monkeypatch.setattr(dense, "_KEEP_EVERY", 6)
    late: list[Record] = []
    try:
        for n in range(4):  # 4 entries: not yet
            async with first.write() as tx:
                await tx.insert(r := fact(f"late {n}", embedder="m"), vectors[n][None, :])
            late.append(r)
            await first.nearest(vectors[n].astype(np.float32), "m", FILTERS, 3)
        await _kept(first)
        assert kept_position() == position
        for n in range(4, 8):
            async with first.write() as tx:
                await tx.insert(r := fact(f"late {n}", embedder="m"), vectors[n][None, :])
            late.append(r)
            await first.nearest(vectors[n].astype(np.float32), "m", FILTERS, 3)
        await _kept(first)
        again = kept_position()
        assert position + 6 < again <= position + 8
    finally:
        await first.close()
    monkeypatch.setattr(dense, "_RELOAD_AFTER", 1)  # taken only if at most 1 record behind
    second, _ = await _taken_from_copy(tmp_path / "m.db")
    try:
        for r, v in zip(late, vectors[:8], strict=True):
            hits = await second.nearest(v.astype(np.float32), "m", FILTERS, 20)
            assert r.id in {h.record.id for h in hits}
    finally:
        await second.close()


@pytest.mark.parametrize(
    "spoil", ["codes", "another store", "log pruned", "another history", "rows missing"]
)
async def test_a_kept_copy_that_cannot_be_trusted_is_read_from_vec0_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spoil: str
) -> None:
    vectors = _around_centres(600, 12, seed=4)
    await (await _with_kept_copy(tmp_path, vectors, monkeypatch)).close()
    kept = tmp_path / "m.db-vectors"
    (codes,) = kept.glob("*.codes")
    database = tmp_path / "m.db"
    if spoil == "codes":
        with codes.open("r+b") as file:
            file.seek(100)
            file.write(b"\x7f\x7f\x7f")
    elif spoil == "another store":  # the same table and scope, other records
        other = await SqliteStore.open(tmp_path / "other.db")
        try:
            await _clustered(
                other,
                [fact(f"o {i}", embedder="m") for i in range(600)],
                vectors[::-1].copy(),
                monkeypatch,
            )
        finally:
            await other.close()
        shutil.rmtree(tmp_path / "other.db-vectors", ignore_errors=True)
        shutil.copytree(kept, tmp_path / "other.db-vectors")
        database = tmp_path / "other.db"
    else:
        with contextlib.closing(sqlite3.connect(database)) as conn, conn:
            if spoil == "log pruned":
                conn.execute("DELETE FROM vector_changes")
            elif spoil == "another history":  # a restored backup's log, written on since
                conn.execute(
                    "UPDATE vector_changes SET seq = -1 "
                    "WHERE id = (SELECT max(id) FROM vector_changes)"
                )
            else:  # a record whose rows the copy holds says it has none
                conn.execute(
                    "UPDATE records SET vec_rows = 0 WHERE seq = (SELECT min(seq) FROM records)"
                )
    store = await SqliteStore.open(database)
    try:
        reads = _chunk_reads(store)
        assert await store.load_vectors("m", ["/repo"])
        assert reads, "read from vec0's chunks"
        held = _index(store)._segments["/repo"]
        records = dict(await store.reads.fetch("SELECT seq, content FROM records"))
        owners = {records[int(r) // dense.MAX_PASSAGES] for r in held.rowid[: held.size] if r >= 0}
        want = "o " if spoil == "another store" else "f "
        assert owners and all(text.startswith(want) for text in owners)
    finally:
        await store.close()


async def test_kept_copies_of_scopes_and_tables_without_vectors_are_pruned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``status`` counts the kept copies; maintenance's purge removes those of scopes
    that hold no vectors any more, of vector tables the store no longer has, and code
    files an hour old that no copy names, and keeps the rest."""
    store = await _with_kept_copy(tmp_path, _around_centres(600, 12, seed=6), monkeypatch)
    try:
        folder = tmp_path / "m.db-vectors"
        (kept,) = [p.with_suffix("") for p in folder.glob("*.npz")]
        size = sum(p.stat().st_size for p in folder.iterdir())
        assert (await store.stats()).cache_bytes == size > 0
        # a copy of a table the store does not have, an orphan code file old and new
        gone = folder / "vec_99-0123456789abcdef01234567"
        for suffix in (".npz", ".codes"):
            shutil.copy(kept.with_name(kept.name + suffix), gone.with_name(gone.name + suffix))
        with np.load(gone.with_name(gone.name + ".npz")) as data:
            arrays = {name: data[name] for name in data.files}
        meta = json.loads(str(arrays.pop("meta")))
        meta["table"] = "vec_99"
        np.savez(gone.with_name(gone.name + ".npz"), meta=np.asarray(json.dumps(meta)), **arrays)
        old, new = folder / "vec_1-old.codes", folder / "vec_1-new.codes"
        old.write_bytes(b"x" * 100)
        new.write_bytes(b"x" * 100)
        os.utime(old, (time.time() - 7200, time.time() - 7200))
        gone_bytes = sum(p.stat().st_size for p in folder.glob("vec_99-*"))
        assert await store.prune_caches() == gone_bytes
        assert kept.with_name(kept.name + ".codes").exists() and not old.exists() and new.exists()
        assert not list(folder.glob("vec_99-*"))
        assert await store.prune_caches() == 0  # what is left is wanted
        # the scope's records archived: its copy goes
        with contextlib.closing(sqlite3.connect(tmp_path / "m.db")) as conn, conn:
            conn.execute("UPDATE records SET archived_at = '2026-01-01T00:00:00Z'")
        assert await store.prune_caches() > 0
        assert not list(folder.glob("*.npz")) and not kept.with_name(kept.name + ".codes").exists()
    finally:
        await store.close()


async def test_writes_of_another_process_to_several_scopes_reach_each_scopes_copy(
    tmp_path: Path,
) -> None:
    """A copy catching up with another process's writes (``_reread``) puts each record's
    rows in its own scope's segment, with its own corpus and kind."""
    vectors = _around_centres(40, 8, seed=9)
    ours = await SqliteStore.open(tmp_path / "m.db")
    theirs = await SqliteStore.open(tmp_path / "m.db")
    try:
        async with ours.write() as tx:
            for i in range(20):
                await tx.insert(fact(f"a {i}", embedder="m"), vectors[i][None, :])
                await tx.insert(
                    fact(f"b {i}", embedder="m", scope_key="/other"), vectors[20 + i][None, :]
                )
        assert await ours.load_vectors("m", ["/repo", "/other"])
        late = {
            "/repo": fact("late a", embedder="m", kind="decision"),
            "/other": fact("late b", embedder="m", scope_key="/other"),
        }
        async with theirs.write() as tx:  # another process: ours learns it from the log
            await tx.insert(late["/repo"], vectors[3][None, :])
            await tx.insert(late["/other"], vectors[24][None, :])
        for scope, record, near in (("/repo", late["/repo"], 3), ("/other", late["/other"], 24)):
            filters = Filters(scope_keys=(scope,), corpora=("facts",))
            found = [h.record.id for h in await ours.nearest(vectors[near], "m", filters, 3)]
            assert record.id in found[:2]
            assert late["/other" if scope == "/repo" else "/repo"].id not in found
        decisions = Filters(scope_keys=("/repo",), corpora=("facts",), kinds=("decision",))
        hits = await ours.nearest(vectors[3], "m", decisions, 3)
        assert [h.record.id for h in hits] == [late["/repo"].id]
    finally:
        await theirs.close()
        await ours.close()
