"""The SQLite lexical branch reads impact-ordered postings: the same top k as FTS5's
BM25 over every match, in step with every write, checked and rebuilt by doctor."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from helpers.records import fact
from memory_mcp.records import format_time, utcnow
from memory_mcp.storage import bm25
from memory_mcp.storage.base import Filters
from memory_mcp.storage.bm25 import FIRST_DEPTH
from memory_mcp.storage.sqlite import SqliteStore, postings
from memory_mcp.storage.sqlite.doctor import diagnose
from memory_mcp.storage.sqlite.sql import filters_sql, fts_query, lexical_sql, record_of

pytestmark = [pytest.mark.anyio, pytest.mark.sqlite_only]

FILTERS = Filters(scope_keys=("/repo",), corpora=("facts",))
WORDS = ["deploy", "build", "cache", "queue", "billing", "tests", "port", "worker", "retry"]


async def exhaustive(
    store: SqliteStore, text: str, filters: Filters, k: int
) -> list[tuple[str, float]]:
    """FTS5's own answer: BM25 over every matching record, the top k."""
    where, params = filters_sql(filters)
    rows = await store.reads.fetch(lexical_sql(where), [fts_query(text), *params, k])
    return [(record_of(row).id, -float(row[-1])) for row in rows]


async def in_step(store: SqliteStore) -> None:
    """Every current record has exactly its postings, in its list, with its kind; no other
    record any."""
    rows = await store.reads.fetch(
        "SELECT seq, scope_key, corpus, live, content, merged_text, tags, kind FROM records"
    )
    lists = {
        (k, c): n
        for n, k, c in await store.reads.fetch("SELECT id, scope_key, corpus FROM posting_lists")
    }
    for seq, scope_key, corpus, live, content, merged_text, tags, kind in rows:
        held = await store.reads.fetch(
            "SELECT list, term, impact, seq, tf, dl, kind FROM postings WHERE seq = ? "
            "ORDER BY term",
            [seq],
        )
        expected = (
            sorted(
                (lists[(scope_key, corpus)], *row)
                for row in postings.posting_rows(seq, content, merged_text, tags, kind)
            )
            if live
            else []
        )
        assert [tuple(r) for r in held] == expected, (seq, content, live)
    assert await store.reads.fetch("SELECT * FROM postings_due") == []


async def test_the_top_k_is_fts5s_and_filters_read_deeper(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "m.db")
    rng = random.Random(3)
    try:
        async with store.write() as tx:
            for n in range(1500):  # "deploy" in every record: far deeper than the first round
                words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12)))
                kind = "gotcha" if n % 97 == 0 else "decision" if n % 3 == 1 else "fact"
                tags = ["rare"] if n % 211 == 0 else []
                await tx.insert(fact(f"deploy {words} item{n}", kind=kind, tags=tags), None)
            for n in range(40):  # the best for "zebra", but only bob may read them
                await tx.insert(fact(f"zebra zebra zebra mine{n}", user="bob", private=True), None)
            for n in range(5):
                await tx.insert(fact(f"zebra deploy ours{n}"), None)
        assert FIRST_DEPTH < 1500
        gotchas = dataclasses.replace(FILTERS, kinds=("gotcha",))
        cases = [
            ("deploy", FILTERS, 10),
            ("deploy billing retry", FILTERS, 50),
            ("deploy cache", gotchas, 10),
            ("deploy worker", dataclasses.replace(FILTERS, tags=("rare",)), 10),
            ("item7 deploy queue", FILTERS, 5),
            # a third of the records pass: more than a round keeps per word
            ("deploy billing retry", dataclasses.replace(FILTERS, kinds=("decision",)), 50),
            ("deploy", dataclasses.replace(FILTERS, kinds=("decision",), since="2000-01-01"), 200),
            ("nothing matches this", FILTERS, 5),
            # the best k are bob's, in a round that read every posting of the word: what
            # alice may read is found by scoring every record again
            ("zebra", dataclasses.replace(FILTERS, viewer="alice"), 10),
            ("zebra deploy", dataclasses.replace(FILTERS, viewer="alice"), 3),
            ("zebra", dataclasses.replace(FILTERS, viewer="bob"), 10),
        ]
        for text, filters, k in cases:
            ours = [(s.record.id, s.score) for s in await store.lexical(text, filters, k)]
            theirs = await exhaustive(store, text, filters, k)
            # The same scores in the same order; records that tie may be listed either way.
            # (Words in most records have FTS5's floor idf, 1e-6: their scores, a few
            # millionths, agree to within 1e-7.)
            expected = pytest.approx([s for _, s in theirs], rel=1e-9, abs=1e-6)
            assert [s for _, s in ours] == expected, text
            assert len(ours) == min(k, len(theirs))
        found = await store.lexical("deploy cache", gotchas, 10)
        assert len(found) == 10 and {s.record.kind for s in found} == {"gotcha"}
        alice = await store.lexical("zebra", dataclasses.replace(FILTERS, viewer="alice"), 10)
        ours = [f"zebra deploy ours{n}" for n in range(5)]
        assert sorted(s.record.content for s in alice) == ours
    finally:
        await store.close()


async def test_the_postings_follow_every_write(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "m.db")
    now = format_time(utcnow())
    try:
        a, b, c = (
            fact("The staging database is reset every Sunday", tags=["ops"]),
            fact("Deploys go out on Tuesdays"),
            fact("Use uv for installs"),
        )
        async with store.write() as tx:
            for r in (a, b, c):
                await tx.insert(r, None)
        await in_step(store)
        async with store.write() as tx:  # a fold: b's text into c, b retired
            await tx.execute(
                "UPDATE records SET merged_text = ?, tags = ? WHERE id = ?",
                [b.content, json.dumps(["deploys"]), c.id],
            )
            await tx.fold_into(b, c.id, None, now)  # type: ignore[arg-type]
        await in_step(store)
        assert [s.record.id for s in await store.lexical("Tuesdays", FILTERS, 5)] == [c.id]
        async with store.write() as tx:
            await tx.archive(a.id, "forgotten", now)
        await in_step(store)
        assert await store.lexical("staging Sunday", FILTERS, 5) == []
        async with store.write() as tx:
            await tx.restore(a.id, now)
            await tx.execute(
                "UPDATE records SET content = 'Staging resets on Mondays' WHERE id = ?", [a.id]
            )
        await in_step(store)
        assert [s.record.id for s in await store.lexical("mondays", FILTERS, 5)] == [a.id]
        async with store.write() as tx:
            await tx.execute("DELETE FROM records WHERE id = ?", [c.id])
        await in_step(store)
    finally:
        await store.close()


async def test_a_write_from_another_program_is_indexed_by_the_next_transaction(
    tmp_path: Path,
) -> None:
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        r = fact("Backups run at midnight")
        async with store.write() as tx:
            await tx.insert(r, None)
        conn = store.driver.connect(str(tmp_path / "m.db"), busy_timeout_ms=5000)
        conn.execute("UPDATE records SET content = 'Backups run at noon' WHERE id = ?", [r.id])
        conn.commit()
        conn.close()
        async with store.write():
            pass
        await in_step(store)
        assert [s.record.id for s in await store.lexical("noon", FILTERS, 5)] == [r.id]
    finally:
        await store.close()


async def test_doctor_finds_postings_out_of_step_and_makes_them_again(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        records = [fact(f"Service {n} listens on port {8000 + n}") for n in range(5)]
        async with store.write() as tx:
            for r in records:
                await tx.insert(r, None)
        assert (await diagnose(store)).healthy
        raw = store.driver.connect(str(tmp_path / "m.db"), busy_timeout_ms=5000)
        raw.execute("DELETE FROM postings WHERE seq = (SELECT min(seq) FROM records)")
        raw.execute("UPDATE postings SET list = 999 WHERE seq = (SELECT max(seq) FROM records)")
        raw.execute(
            "UPDATE postings SET kind = 'gotcha' WHERE seq = (SELECT min(seq) + 1 FROM records)"
        )
        raw.commit()
        raw.close()
        found = await diagnose(store)
        check = next(c for c in found.checks if c.name == "word postings")
        assert len(check.problems) == 3 and not found.healthy
        assert any("another kind" in p for p in check.problems)
        repaired = await diagnose(store, repair=True)
        assert repaired.healthy
        await in_step(store)
        assert (await diagnose(store)).healthy
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("found", "deepest"),
    [
        ({128: 42, 256: 84}, 10_000),  # 42 of 60: twice as deep finds them
        ({128: 60}, 10_000),
        ({128: 28, 512: 112}, 10_000),  # 28 of 60: four times as deep
        ({128: 12, 512: 48, 1024: 96}, 10_000),  # four times, then twice
        ({128: 42, 256: 50}, 200),  # every posting read: done with fewer than k
    ],
)
async def test_a_short_round_reads_as_much_deeper_as_its_shortfall_asks(
    found: dict[int, int], deepest: int
) -> None:
    """Both backends' rounds (``deepest_rows``, ``deepening``): twice as deep after a round
    that found 5/8 of k or more, else four times, until k rows or every posting."""
    seen: list[int] = []

    def rows(depth: int) -> list[int]:
        seen.append(depth)
        return list(range(found[depth]))

    async def awaited(depth: int) -> list[int]:
        return rows(depth)

    assert len(bm25.deepest_rows(rows, 60, deepest)) == found[max(found)]
    assert seen == list(found)
    seen.clear()
    assert len(await bm25.deepening(awaited, 60, deepest)) == found[max(found)]
    assert seen == list(found)
