"""What any storage backend must do, written against ``Store`` alone.

Each test opens its store through ``storage.open_store`` from ``storage.url``:
SQLite in ``tmp_path`` by default, or the backend ``--storage-url`` (or
``$MEMORY_MCP_TEST_STORAGE_URL``) selects. Nothing here names a backend, a
query language or a driver: a new backend passes this file first, then the
whole suite with the same switch.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path

import anyio
import numpy as np
import pytest

from helpers.records import fact, unit
from memory_mcp import ranker
from memory_mcp.config import Settings, StorageSettings
from memory_mcp.errors import InvalidInput
from memory_mcp.lexical import query_terms, stem
from memory_mcp.records import (
    MergedEntry,
    Record,
    content_hash,
    format_time,
    merged_text,
    utcnow,
)
from memory_mcp.storage import Filters, Store, bm25, open_store
from memory_mcp.storage.base import IVF_PROBES, TaskState

pytestmark = pytest.mark.anyio

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=utcnow().tzinfo)
SCOPE = "/repo"
FACTS = Filters(scope_keys=(SCOPE,), corpora=("facts",))


def record(content: str, *, days_ago: float = 0, **fields: object) -> Record:
    return fact(content, at=NOW - timedelta(days=days_ago), **fields)  # type: ignore[arg-type]


@pytest.fixture
def backend(tmp_path: Path, storage_url: str) -> Settings:
    """The settings that name this test's store (the same one for every ``open_store``)."""
    if not storage_url:
        storage_url = f"sqlite://{tmp_path / 'contract.db'}"
    return Settings(data_dir=str(tmp_path), storage=StorageSettings(url=storage_url))


@pytest.fixture
async def store(backend: Settings) -> AsyncIterator[Store]:
    opened = await open_store(backend, clock=lambda: NOW)
    try:
        yield opened
    finally:
        await opened.close()


async def insert(store: Store, *records: Record, vectors: list[np.ndarray] | None = None) -> None:
    async with store.write() as tx:
        for n, r in enumerate(records):
            await tx.insert(r, None if vectors is None else vectors[n])


# Writes --------------------------------------------------------------------------------


async def test_a_written_record_reads_back_whole(store: Store) -> None:
    r = record("The staging database is called pigeon_stage", tags=["db"], importance=0.8)
    await insert(store, r)
    assert (await store.get(r.id)) == r
    assert await store.get("f_missing") is None
    assert [x.id for x in await store.get_many(["f_missing", r.id])] == [r.id]
    async with store.write() as tx:
        assert [x.id for x in await tx.find_by_hash(content_hash(r.content), FACTS)] == [r.id]
    assert [x.id async for x in store.iter_records()] == [r.id]


async def test_a_transaction_that_raises_writes_nothing(store: Store) -> None:
    r = record("Never deploy on Fridays")

    async def abandoned() -> None:
        async with store.write() as tx:
            await tx.insert(r, None)
            raise RuntimeError("abandoned")

    with pytest.raises(RuntimeError):
        await abandoned()
    assert await store.get(r.id) is None


async def test_archive_restore_and_purge(store: Store) -> None:
    r = record("The build uses pnpm")
    await insert(store, r)
    async with store.write() as tx:
        assert await tx.archive(r.id, "forgotten", format_time(NOW))
    assert await store.current(FACTS, 10) == []
    assert [x.id for x in await store.archived([SCOPE])] == [r.id]
    async with store.write() as tx:
        restored = await tx.restore(r.id, format_time(NOW))
    assert restored is not None and restored.current
    async with store.write() as tx:
        await tx.archive(r.id, "forgotten", format_time(NOW))
        assert await tx.purge([r.id], format_time(NOW + timedelta(days=1)), format_time(NOW)) == 1
    assert await store.get(r.id) is None


async def test_folds_under_concurrency_leave_one_record_holding_every_text(
    backend: Settings,
) -> None:
    """Two stores on one backend (two processes), ten writers: each either inserts the
    text or folds its copy into the one there is. The write lock makes it one record."""
    stores = [await open_store(backend, clock=lambda: NOW) for _ in range(2)]
    text = "Run the test suite with pytest -x before pushing"

    async def write_once(n: int) -> None:
        store = stores[n % 2]
        mine = record(text, agent=f"agent-{n}")
        async with store.write() as tx:
            found = [r for r in await tx.find_by_hash(content_hash(text), FACTS) if r.current]
            if not found:
                await tx.insert(mine, None)
                return
            holder = found[0]
            entry = MergedEntry(mine.id, mine.content, mine.created_at, mine.agent, mine.created_at)
            await tx.insert(mine, None)
            await tx.fold_into(mine, holder.id, entry, format_time(NOW))
            holder.merged_from.append(entry)
            holder.fold_count += 1
            assert await tx.update_merged(holder, format_time(NOW))

    try:
        async with anyio.create_task_group() as group:
            for n in range(10):
                group.start_soon(write_once, n)
        [holder] = await stores[0].current(FACTS, 10)
        assert holder.fold_count == 9 and len(holder.merged_from) == 9
        assert len([r async for r in stores[1].iter_records()]) == 10
    finally:
        for store in stores:
            await store.close()


# Search branches -----------------------------------------------------------------------


async def test_search_filters_apply_before_the_limit(store: Store) -> None:
    crowd = [record(f"deploy pipeline note {n}", scope_key="/other") for n in range(30)]
    wanted = [
        record("deploy pipeline runs on main", kind="decision", tags=["ci"]),
        record("deploy pipeline caches wheels", days_ago=40),
    ]
    dense = [unit(1, 0, 0)[None, :]] * 30 + [unit(1, 0.01, 0)[None, :]] * 2
    embedder = "test:3" if store.vectors_available else None
    for r in [*crowd, *wanted]:
        r.embedder = embedder
    await insert(store, *crowd, *wanted, vectors=dense if embedder else None)
    found = await store.lexical("deploy pipeline", FACTS, 2)
    assert {s.record.id for s in found} == {r.id for r in wanted}
    only = Filters(scope_keys=(SCOPE,), corpora=("facts",), kinds=("decision",))
    assert [s.record.id for s in await store.lexical("deploy", only, 1)] == [wanted[0].id]
    tagged = Filters(scope_keys=(SCOPE,), corpora=("facts",), tags=("ci",))
    assert [s.record.id for s in await store.lexical("deploy", tagged, 1)] == [wanted[0].id]
    recent = Filters((SCOPE,), ("facts",), since=format_time(NOW - timedelta(days=1)))
    assert [s.record.id for s in await store.lexical("deploy", recent, 5)] == [wanted[0].id]
    if embedder:
        near = await store.nearest(unit(1, 0, 0), embedder, FACTS, 2)
        assert {s.record.id for s in near} == {r.id for r in wanted}


async def test_a_write_mark_tells_whether_anything_was_committed_since(store: Store) -> None:
    """Reads made before a write transaction stand for it only if nothing was
    committed in between, by this process or another, nor written by it yet."""
    mark = await store.write_mark()
    assert mark is not None
    async with store.write() as tx:
        assert await tx.unchanged_since(mark)
    await insert(store, record("deploy note one"))
    async with store.write() as tx:
        assert not await tx.unchanged_since(mark)
    mark = await store.write_mark()
    async with store.write() as tx:
        assert await tx.unchanged_since(mark)
        await tx.insert(record("deploy note two"), None)
        assert not await tx.unchanged_since(mark)
    assert not await _unchanged(store, "a mark from another store")


async def _unchanged(store: Store, mark: object) -> bool:
    async with store.write() as tx:
        return await tx.unchanged_since(mark)


async def test_a_tag_filter_finds_tags_of_any_spelling(store: Store) -> None:
    """Tags with quotes, backslashes, accents or another tag's text inside them."""
    odd = ['say "hi"', "back\\slash", "café", "ci"]
    tagged = [record(f"deploy note {n}", tags=[tag]) for n, tag in enumerate(odd)]
    decoy = record("deploy note decoy", tags=['a "ci" b', "cis"])
    await insert(store, *tagged, decoy)
    for tag, wanted in zip(odd, tagged, strict=True):
        filters = Filters(scope_keys=(SCOPE,), corpora=("facts",), tags=(tag,))
        assert [s.record.id for s in await store.lexical("deploy", filters, 5)] == [wanted.id]
    both = Filters(scope_keys=(SCOPE,), corpora=("facts",), tags=("café", "ci"))
    found = {s.record.id for s in await store.lexical("deploy", both, 5)}
    assert found == {tagged[2].id, tagged[3].id}


async def test_a_reader_gets_the_shared_records_and_their_own_personal_ones(
    store: Store,
) -> None:
    """``Filters.viewer`` is ``Record.visible_to`` on every read, before the limit."""
    crowd = [record(f"cache note {n}", user="bob", private=True) for n in range(40)]
    theirs = [
        record("cache keys hash the lock file", user="bob"),
        record("cache warmers run at six", user="alice", private=True),
        record("cache of unknown writer"),
    ]
    personal = [
        record("I clear my cache daily", scope="global", scope_key="", user="alice"),
        record("I never clear my cache", scope="global", scope_key="", user="bob"),
    ]
    embedder = "test:3" if store.vectors_available else None
    everyone = [*crowd, *theirs, *personal]
    for r in everyone:
        r.embedder = embedder
    vectors = [unit(1, 0, 0)[None, :]] * len(crowd) + [unit(1, 0.01, 0)[None, :]] * 5
    await insert(store, *everyone, vectors=vectors if embedder else None)
    both = (SCOPE, "")
    alice = Filters(both, ("facts",), viewer="alice")
    seen = {theirs[0].id, theirs[1].id, theirs[2].id, personal[0].id}
    assert {s.record.id for s in await store.lexical("cache", alice, 4)} == seen
    assert {r.id for r in await store.current(alice, 4)} == seen
    top = await store.top_by_prior(alice, ranker.RankerConfig(), NOW, 4)
    assert {r.id for r, _ in top} == seen
    if embedder:
        assert {s.record.id for s in await store.nearest(unit(1, 0, 0), embedder, alice, 4)} == seen
    mine = Filters(both, ("facts",), viewer="alice", private=True)
    assert [s.record.id for s in await store.lexical("cache", mine, 10)] == [theirs[1].id]
    shared = Filters((SCOPE,), ("facts",), private=False)
    assert {s.record.id for s in await store.lexical("cache", shared, 50)} == {
        theirs[0].id,
        theirs[2].id,
    }
    assert len(await store.current(Filters(both, ("facts",)), 100)) == len(everyone)


async def test_a_reader_finds_their_records_below_many_they_may_not_see(store: Store) -> None:
    """A first round reads a word's 128 best postings (``bm25.FIRST_DEPTH``) and filters by
    reader after scoring; others' private records fill all of them here, so the
    records alice may read come from a deeper round, best first."""
    hidden = [record(f"cache cache cache warm {n}", user="bob", private=True) for n in range(140)]
    hers = [
        record("cache of the lock file, kept for a day by the build", user="alice"),
        record("the cache of wheels, keyed by the lock file and the python version", user="bob"),
    ]
    await insert(store, *hidden, *hers)
    alice = Filters((SCOPE,), ("facts",), viewer="alice")
    found = await store.lexical("cache warm", alice, 5)
    assert [s.record.id for s in found] == [hers[0].id, hers[1].id]
    shared = Filters((SCOPE,), ("facts",), private=False)
    assert [s.record.id for s in await store.lexical("cache", shared, 1)] == [hers[0].id]
    assert len(await store.lexical("cache", Filters((SCOPE,), ("facts",)), 200)) == 142


async def test_lexical_relevance_is_fts5s_bm25_on_every_backend(store: Store) -> None:
    """One lexical ranking: the scores ``storage.bm25`` computes (FTS5's BM25 over every
    record, archived ones too, with the column weights), in the same order."""
    texts = [
        ("Deploys run from the main branch after review", [], ["ci"]),
        ("The deploy script deploys twice when the cache is cold", [], []),
        ("Deploying on Fridays is forbidden; deploy on Monday", ["never deploy late"], []),
        ("Use pnpm for the frontend packages", [], ["deploy"]),
        ("The staging database migrates before each deploy of the api", [], []),
    ]
    records = [record(text, tags=tags) for text, _, tags in texts]
    for r, (_, folded, _) in zip(records, texts, strict=True):
        r.merged_from = [
            MergedEntry(f"f_{n}", t, r.created_at, "test", r.created_at)
            for n, t in enumerate(folded)
        ]
    gone = record("deploy deploy deploy, archived")
    await insert(store, *records, gone)
    async with store.write() as tx:
        await tx.archive(gone.id, "forgotten", format_time(NOW))
    query = "deploy the cache on monday"
    await _lexical_is_bm25(store, query, records, [*records, gone])
    # Written since: the words' record counts are read again (not an earlier search's).
    later = [record("Monday: clear the cache before the deploy", tags=["cache"])]
    await insert(store, *later)
    await _lexical_is_bm25(store, query, [*records, *later], [*records, gone, *later])


async def _lexical_is_bm25(
    store: Store, query: str, current: list[Record], everything: list[Record]
) -> None:
    indexed = {
        r.id: bm25.document_terms(bm25.indexed_columns(r.content, merged_text(r), r.tags))
        for r in everything
    }
    average = sum(length for length, _ in indexed.values()) / len(indexed)
    terms = query_terms(query)
    holding = {stem(t): sum(1 for _, held in indexed.values() if stem(t) in held) for t in terms}
    expected = {
        r.id: bm25.score(
            terms, indexed[r.id][1], indexed[r.id][0], len(everything), average, holding
        )
        for r in current
    }
    found = await store.lexical(query, FACTS, 10)
    assert [s.record.id for s in found] == sorted(expected, key=lambda i: -expected[i])
    for hit in found:
        assert hit.score == pytest.approx(expected[hit.record.id], rel=1e-6)


async def test_a_selective_filter_still_finds_the_nearest_that_pass_it(store: Store) -> None:
    """Hundreds of nearer vectors that the filters reject do not hide the ones they keep."""
    if not store.vectors_available:
        pytest.skip("this store has no vectors")
    crowd = [record(f"crowd note {n}", embedder="test:3") for n in range(300)]
    wanted = [record(f"tagged note {n}", tags=["keep"], embedder="test:3") for n in range(3)]
    dense = [unit(1, 0.001 * n, 0)[None, :] for n in range(300)]
    dense += [unit(1, 0.5 + n, 0)[None, :] for n in range(3)]
    await insert(store, *crowd, *wanted, vectors=dense)
    tagged = Filters((SCOPE,), ("facts",), tags=("keep",))
    near = await store.nearest(unit(1, 0, 0), "test:3", tagged, 2)
    assert [s.record.id for s in near] == [wanted[0].id, wanted[1].id]
    some = Filters((SCOPE,), ("facts",), exclude_ids=tuple(r.id for r in crowd[:100]))
    near = await store.nearest(unit(1, 0, 0), "test:3", some, 60)
    assert [s.record.id for s in near] == [r.id for r in crowd[100:160]]


async def test_text_is_plain_words_whatever_it_holds(store: Store) -> None:
    r = record('The "deploy" job: AND runs NEAR(main) * daily')
    await insert(store, r)
    for query in ['deploy" OR "x', "AND", "NEAR(main)", "*", "job:", ")("]:
        await store.lexical(query, FACTS, 5)  # never a syntax error
    assert [s.record.id for s in await store.lexical('"deploy" AND', FACTS, 5)] == [r.id]


async def test_top_by_prior_is_the_rankers_prior(store: Store) -> None:
    """The table every backend is held to: its prior is ``ranker.prior``."""
    table = [
        record("plain fact", days_ago=0),
        record("plain fact, a year old", days_ago=365),
        record("a decision that lasts", kind="decision", days_ago=200),
        record("never skip the migration check: it is a breaking bug", days_ago=3),
        record("explicitly important", importance=0.95, days_ago=90),
        record("pinned and old", pinned=True, days_ago=900),
        record("often folded", fold_count=4, days_ago=10),
        record("often read", access_count=20, days_ago=10),
        record("a gotcha", kind="gotcha", days_ago=1000),
    ]
    await insert(store, *table)
    config = ranker.RankerConfig(half_life_days=20, durable_half_life_days=150, prior_weight=0.2)
    rows = await store.top_by_prior(FACTS, config, NOW, 100)
    assert {r.id for r, _ in rows} == {r.id for r in table}
    for r, value in rows:
        assert value == pytest.approx(ranker.prior(r, NOW, config), abs=1e-9), r.content
    assert [v for _, v in rows] == sorted((v for _, v in rows), reverse=True)
    full = [r.id for r, _ in rows]
    for k in range(1, len(table) + 1):
        assert [r.id for r, _ in await store.top_by_prior(FACTS, config, NOW, k)] == full[:k]


async def test_the_top_by_prior_is_not_the_top_by_worth(store: Store) -> None:
    """Records worth the most but old rank below fresh ones worth less; the best by
    prior come from every list the filters name."""
    old = [record(f"important but old {n}", importance=1.0, days_ago=2000) for n in range(40)]
    fresh = [record(f"fresh note {n}", importance=0.5, days_ago=n) for n in range(3)]
    elsewhere = record("fresh elsewhere", importance=0.6, scope_key="/other")
    await insert(store, *old, *fresh, elsewhere)
    config = ranker.RankerConfig()
    top = await store.top_by_prior(FACTS, config, NOW, 3)
    assert [r.id for r, _ in top] == [r.id for r in fresh]
    both = Filters(scope_keys=(SCOPE, "/other"), corpora=("facts",))
    top = await store.top_by_prior(both, config, NOW, 2)
    assert [r.id for r, _ in top] == [elsewhere.id, fresh[0].id]


async def test_positions_walk_every_record_in_write_order(store: Store) -> None:
    written = [record(f"fact number {n}") for n in range(7)]
    await insert(store, *written)
    seen: list[str] = []
    position = None
    while batch := await store.after(("facts",), position, 3):
        seen.extend(r.id for _, r in batch)
        position = batch[-1][0]
        assert await store.count_after(("facts",), position) == 7 - len(seen)
    assert seen == [r.id for r in written]


# Embedding queue -----------------------------------------------------------------------


async def test_records_without_vectors_wait_for_them(store: Store) -> None:
    r = record("Use ruff for linting")
    await insert(store, r)
    assert [x.id for x in await store.needing_embedding("test:3", 10)] == [r.id]
    assert await store.count_needing_embedding("test:3") == 1
    if store.vectors_available:
        async with store.write() as tx:
            assert await tx.set_vectors([(r, unit(0, 1, 0)[None, :])], "test:3") == 1
        assert await store.count_needing_embedding("test:3") == 0
        assert await store.dense_embedders() == {"test:3": 1}


async def test_the_records_awaiting_vectors_are_counted_by_embedder_and_liveness(
    store: Store,
) -> None:
    """Missing, from an embedder sorting before or after the one asked, or (with
    ``incomplete``) due beyond the whole text: each current record counts once; a record
    that is not current never does."""
    if not store.vectors_available:
        pytest.skip("the backend keeps no vectors")
    bare, early, late, whole, due, done = (record(f"note number {n}") for n in range(6))
    gone_bare, gone_other = record("archived bare"), record("archived elsewhere")
    await insert(store, bare, gone_bare)
    async with store.write() as tx:
        for r, embedder in ((early, "test:1"), (late, "test:9"), (gone_other, "test:1")):
            await tx.insert(r, None)
            assert await tx.set_vectors([(r, unit(0, 1, 0)[None, :])], embedder) == 1
        for r in (whole, due, done):
            await tx.insert(r, None)
            assert await tx.set_vectors([(r, unit(1, 0, 0)[None, :])], "test:3") == 1
        await tx.mark_vectors_due(due.id)
        await tx.mark_vectors_due(whole.id)
    async with store.write() as tx:  # whole's passages came since
        assert await tx.set_vectors([(whole, np.stack([unit(1, 0, 0), unit(1, 1, 0)]))], "test:3")
    async with store.write() as tx:
        for r in (gone_bare, gone_other):
            assert await tx.archive(r.id, "test", format_time(NOW))
    assert await store.count_needing_embedding("test:3", incomplete=False) == 3
    assert await store.count_needing_embedding("test:3") == 4  # and due
    assert await store.count_needing_embedding("test:1", incomplete=False) == 5
    assert await store.count_needing_embedding(None) == 0


# Conflicts -----------------------------------------------------------------------------


async def test_a_conflict_is_flagged_listed_and_resolved(store: Store) -> None:
    a, b = record("Deploys go out on Mondays"), record("Deploys go out on Thursdays")
    await insert(store, a, b)
    async with store.write() as tx:
        number = await tx.add_conflict(SCOPE, b.id, a.id, "contradiction", format_time(NOW))
    assert [c.id for c in await store.open_conflicts_of([a.id])] == [number]
    assert await store.conflict_between(a.id, b.id) and await store.conflict_between(b.id, a.id)
    async with store.write() as tx:
        assert await tx.resolve_conflict(number, "both", format_time(NOW))
        assert not await tx.resolve_conflict(number, "both", format_time(NOW))
    assert await store.conflicts(open_only=True) == []
    [closed] = await store.conflicts()
    assert (closed.resolution, await store.conflict(number)) == ("both", closed)
    assert await store.conflict_between(a.id, b.id)  # resolved, still known


# Leases --------------------------------------------------------------------------------


async def test_a_lease_is_held_until_it_runs_out(store: Store) -> None:
    now = await store.now()
    assert now.tzinfo is not None
    t0, t1, t2 = (format_time(now + timedelta(seconds=s)) for s in (0, 60, 61))
    async with store.write() as tx:
        assert await tx.claim("purge", "first", t0, t1)
        assert not await tx.claim("purge", "second", t0, t1)
        assert await tx.claim("purge", "first", t0, t1, {"seq": "7"})  # renewed, cursor kept
        assert await tx.claim("purge", "second", t2, t2)  # run out: free to take
    assert (await store.tasks())["purge"].cursor == {"seq": "7"}
    async with store.write() as tx:
        assert not await tx.finish(TaskState(task="purge"), "first")  # lost it
        assert await tx.finish(TaskState(task="purge", failures=2), "second")
        await tx.release("purge", "second")
    state = (await store.tasks())["purge"]
    assert (state.holder, state.failures) == (None, 2)


# Admin ---------------------------------------------------------------------------------


async def test_status_says_which_backend_where_and_how_big(store: Store) -> None:
    await insert(store, record("something to count"))
    stats = await store.stats()
    assert store.backend and store.location and store.details
    assert stats.records == {("facts", "project", "current"): 1} and stats.database_bytes > 0


async def test_doctor_finds_a_healthy_store_healthy(store: Store) -> None:
    await insert(store, record("a healthy record"))
    for repair in (False, True):
        diagnosis = await store.doctor(repair=repair)
        assert diagnosis.healthy and all(check.ok for check in diagnosis.checks)


async def test_a_backup_is_a_copy_and_is_not_written_over(store: Store, tmp_path: Path) -> None:
    await insert(store, record("kept in the backup"))
    target = tmp_path / "backups"
    target.mkdir()
    written = await store.backup(target)
    assert written.parent == target and written.stat().st_size > 0
    with pytest.raises(InvalidInput):
        await store.backup(written)
    assert await store.backup(written, force=True) == written


async def test_a_scratch_copy_is_the_store_of_its_moment_and_leaves_no_trace(
    store: Store,
) -> None:
    kept = record("before the copy")
    await insert(store, kept)
    async with store.scratch_copy() as copy:
        assert [r.id for r in await copy.current(FACTS, 10)] == [kept.id]
        await insert(copy, record("only in the copy"))
        assert len(await copy.current(FACTS, 10)) == 2
    assert [r.id for r in await store.current(FACTS, 10)] == [kept.id]


# Scope aliases -------------------------------------------------------------------------


async def test_an_alias_is_attached_listed_and_detached(store: Store) -> None:
    at, later = format_time(NOW), format_time(NOW + timedelta(hours=1))
    assert await store.aliases("github.com/org/app") == []
    assert await store.alias_of(["/old/app", "/other"]) == {}
    async with store.write() as tx:
        assert await tx.add_alias("/old/app", "github.com/org/app", at)
        assert await tx.add_alias("/old/app-feature", "github.com/org/app", later)
        assert not await tx.add_alias("/old/app", "github.com/org/app", later)  # no change
    listed = await store.aliases("github.com/org/app")
    assert [(a.alias, a.attached_at, a.attached) for a in listed] == [
        ("/old/app", at, True),
        ("/old/app-feature", later, True),
    ]
    found = await store.alias_of(["/old/app", "/other"])
    assert list(found) == ["/old/app"] and found["/old/app"].key == "github.com/org/app"

    async with store.write() as tx:
        assert await tx.remove_alias("/old/app", later)
        assert not await tx.remove_alias("/old/app", later)  # already detached
        assert not await tx.remove_alias("/never", later)
    detached = (await store.alias_of(["/old/app"]))["/old/app"]
    assert (detached.attached, detached.detached_at) == (False, later)
    assert [a.alias for a in await store.aliases("github.com/org/app") if a.attached] == [
        "/old/app-feature"
    ]


async def test_adoption_leaves_a_detached_alias_alone_and_attaching_by_hand_restores_it(
    store: Store,
) -> None:
    at = format_time(NOW)
    async with store.write() as tx:
        await tx.add_alias("/old/app", "github.com/org/app", at)
        await tx.remove_alias("/old/app", at)
        assert not await tx.add_alias("/old/app", "github.com/org/app", at, replace=False)
        assert not await tx.add_alias("/old/app", "acme/app", at, replace=False)
    assert not (await store.alias_of(["/old/app"]))["/old/app"].attached
    async with store.write() as tx:
        assert await tx.add_alias("/old/app", "acme/app", at)  # by hand: attached again
        assert await tx.add_alias("/new/alias", "acme/app", at, replace=False)
    row = (await store.alias_of(["/old/app"]))["/old/app"]
    assert (row.key, row.attached) == ("acme/app", True)
    assert {a.alias for a in await store.aliases("acme/app")} == {"/old/app", "/new/alias"}
    assert await store.aliases("github.com/org/app") == []


async def test_aliases_roll_back_with_their_transaction(store: Store) -> None:
    async def attach_then_fail() -> None:
        async with store.write() as tx:
            await tx.add_alias("/old/app", "github.com/org/app", format_time(NOW))
            raise RuntimeError("stop")

    with pytest.raises(RuntimeError):
        await attach_then_fail()
    assert await store.alias_of(["/old/app"]) == {}


async def test_nearest_with_scores_is_nearest_and_dense_scores(store: Store) -> None:
    """The write path's two vector reads at once give what the two give apart, in a
    transaction as in the store."""
    if not store.vectors_available:
        pytest.skip("this backend holds no vectors here")
    embedder = "test:3"
    crowd = [record(f"deploy note {n}", embedder=embedder) for n in range(12)]
    rng = np.random.default_rng(3)
    vectors = [unit(*rng.normal(size=3))[None, :] for _ in crowd]
    await insert(store, *crowd, vectors=vectors)
    query = unit(1, 0.2, 0)
    asked = [crowd[0].id, crowd[5].id, "f_not_there"]
    near, scores = await store.nearest_with_scores(query, embedder, FACTS, 4, asked)
    apart = await store.nearest(query, embedder, FACTS, 4)
    assert [(s.record.id, round(s.score, 5)) for s in near] == [
        (s.record.id, round(s.score, 5)) for s in apart
    ]
    assert scores.keys() == {crowd[0].id, crowd[5].id}
    alone = await store.dense_scores(query, embedder, asked)
    assert all(abs(scores[i] - alone[i]) < 1e-6 for i in alone)
    async with store.write() as tx:
        in_tx, tx_scores = await tx.nearest_with_scores(query, embedder, FACTS, 4, asked)
    assert [s.record.id for s in in_tx] == [s.record.id for s in apart]
    assert tx_scores.keys() == scores.keys()
    assert await store.nearest_with_scores(query, embedder, FACTS, 4, []) == (near, {})
    # ranked ahead (a search ranking while its lexical branch reads), the same answer
    ahead = await store.rank_ahead(query, embedder, FACTS, IVF_PROBES)
    assert await store.nearest_with_scores(
        query, embedder, FACTS, 4, asked, probes=IVF_PROBES, ahead=ahead
    ) == await store.nearest_with_scores(query, embedder, FACTS, 4, asked, probes=IVF_PROBES)
