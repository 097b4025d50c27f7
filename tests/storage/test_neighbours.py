"""Each current record's neighbours in time, kept by triggers beside the records
(``storage/sqlite/neighbours.py``): whatever is written, they are what the records say."""

from __future__ import annotations

import random
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from helpers.records import behind_its_back, fact
from memory_mcp.records import format_time, utcnow
from memory_mcp.storage.sqlite import SqliteStore, neighbours
from memory_mcp.storage.sqlite.doctor import diagnose

pytestmark = [pytest.mark.anyio, pytest.mark.sqlite_only]

COLUMNS = "seq, before, before_id, before_gap, after, after_id, after_gap"


async def kept(store: SqliteStore) -> list[Any]:
    return [
        tuple(r) for r in await store.reads.fetch(f"SELECT {COLUMNS} FROM neighbours ORDER BY seq")
    ]


async def expected(store: SqliteStore) -> list[Any]:
    return [
        tuple(r)
        for r in await store.reads.fetch(
            f"SELECT {COLUMNS} FROM ({neighbours.EXPECTED}) ORDER BY seq"
        )
    ]


async def test_every_write_keeps_the_neighbours_as_the_records_say(tmp_path: Path) -> None:
    """Inserts in and out of time order (ties too), in several scopes and corpora;
    archives, restores, supersedes, folds, reinstates and purges, some in one
    transaction: after each commit the kept rows are those the records give, gaps
    to the bit."""
    rng = random.Random(12)
    base = utcnow() - timedelta(days=3)
    store = await SqliteStore.open(tmp_path / "m.db")

    async def ids(where: str) -> list[str]:
        return [str(r[0]) for r in await store.reads.fetch(f"SELECT id FROM records WHERE {where}")]

    try:
        for step in range(160):
            now = format_time(utcnow())
            live = await ids("live = 1")
            archived = await ids("archived_at IS NOT NULL")
            superseded = await ids("replaced_by IS NOT NULL AND archived_at IS NULL")
            async with store.write() as tx:
                roll = rng.random()
                if roll < 0.5 or len(live) < 3:
                    for _ in range(rng.choice((1, 1, 3))):
                        minutes = rng.choice((0, 0, 1, 2, 5, 30, 600))
                        record = fact(
                            f"note {step} {rng.random()}",
                            at=base + timedelta(minutes=minutes, seconds=rng.choice((0, 0, 7))),
                            scope_key=rng.choice(("/repo", "/repo", "/other")),
                            corpus=rng.choice(("facts", "facts", "journal")),
                        )
                        await tx.insert(record, None)
                elif roll < 0.62:
                    for victim in rng.sample(live, rng.choice((1, 2))):
                        assert await tx.archive(victim, "stale", now)
                elif roll < 0.72 and archived:
                    assert await tx.restore(rng.choice(archived), now) is not None
                elif roll < 0.82:
                    old_id, new_id = rng.sample(live, 2)
                    old = await tx.get(old_id)
                    assert old is not None
                    await tx.replace(old, new_id)
                elif roll < 0.88 and superseded:
                    old = await tx.get(rng.choice(superseded))
                    assert old is not None and old.replaced_by is not None
                    current = await tx.get(old.replaced_by)
                    if current is not None:
                        await tx.reinstate(old, current)
                elif archived:
                    gone = rng.sample(archived, rng.randrange(1, len(archived) + 1))
                    await tx.purge(gone, format_time(utcnow() + timedelta(days=1)), now)
            assert await kept(store) == await expected(store), f"after step {step}"
        assert len(await kept(store)) > 40
        assert (await diagnose(store)).healthy
    finally:
        await store.close()


async def test_a_rolled_back_write_leaves_them_as_they_were(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        async with store.write() as tx:
            for n in range(3):
                await tx.insert(fact(f"note {n}"), None)
        before = await kept(store)

        async def abandoned() -> None:
            async with store.write() as tx:
                await tx.insert(fact("one more"), None)
                raise RuntimeError("abandoned")

        with pytest.raises(RuntimeError):
            await abandoned()
        assert await kept(store) == before == await expected(store)
    finally:
        await store.close()


async def test_doctor_finds_neighbours_out_of_step_and_makes_them_again(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        records = [fact(f"Service {n} listens on port {8000 + n}") for n in range(5)]
        async with store.write() as tx:
            for r in records:
                await tx.insert(r, None)
            await tx.archive(records[4].id, "stale", format_time(utcnow()))
        assert (await diagnose(store)).healthy
        behind_its_back(
            store,
            "DELETE FROM neighbours WHERE seq = (SELECT min(seq) FROM records)",
            "UPDATE neighbours SET after_gap = 99 WHERE seq = (SELECT min(seq) + 1 FROM records)",
            "INSERT INTO neighbours (seq) SELECT max(seq) FROM records",  # not current
        )
        found = await diagnose(store)
        check = next(c for c in found.checks if c.name == "neighbours in time")
        assert check.problems == ["3 records' neighbours in time disagree with the records"]
        assert not found.healthy
        assert (await diagnose(store, repair=True)).healthy
        assert await kept(store) == await expected(store)
        assert len(await kept(store)) == 4
    finally:
        await store.close()
