"""The SQLite lexical branch reads impact-ordered postings: the same top k as FTS5's
BM25 over every match, in step with every write, checked and rebuilt by doctor."""

from __future__ import annotations

import dataclasses
import json
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from helpers.records import behind_its_back, fact
from memory_mcp.records import format_time, utcnow
from memory_mcp.storage import bm25
from memory_mcp.storage.base import Filters
from memory_mcp.storage.bm25 import FIRST_DEPTH
from memory_mcp.storage.sqlite import SqliteStore, postings
from memory_mcp.storage.sqlite.doctor import diagnose
from memory_mcp.storage.sqlite.driver import on_thread
from memory_mcp.storage.sqlite.sql import filters_sql, fts_query, lexical_sql, marks, record_of

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
        behind_its_back(
            store, ("UPDATE records SET content = 'Backups run at noon' WHERE id = ?", [r.id])
        )
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
        behind_its_back(
            store,
            "DELETE FROM postings WHERE seq = (SELECT min(seq) FROM records)",
            "UPDATE postings SET list = 999 WHERE seq = (SELECT max(seq) FROM records)",
            "UPDATE postings SET kind = 'gotcha' WHERE seq = (SELECT min(seq) + 1 FROM records)",
        )
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


async def _counts(store: SqliteStore, stems: set[str]) -> tuple[dict[str, int], list[str]]:
    """The store's fresh word counts (as a search reads them), and the statements the
    reader ran for them."""
    ran: list[str] = []

    def read(conn: sqlite3.Connection) -> dict[str, int]:
        conn.set_trace_callback(ran.append)
        try:
            return store._word_counts.read(conn, stems, True)
        finally:
            conn.set_trace_callback(None)

    return await on_thread(store.reads._conn, read), ran


def _fts5(store: SqliteStore, stems: set[str]) -> dict[str, int]:
    """FTS5's own counts, on a connection of their own (from the store's SQLite library:
    another copy's locks in this process would be the store's)."""
    conn = store.driver.connect(str(store.path), busy_timeout_ms=5000)
    try:
        conn.execute("CREATE VIRTUAL TABLE temp.v USING fts5vocab(main, records_fts, row)")
        rows = conn.execute(
            f"SELECT term, doc FROM temp.v WHERE term IN ({marks(stems)})", [*stems]
        )
        return {str(t): int(n) for t, n in rows}
    finally:
        conn.close()


COUNTED = {"deploy", "build", "cach", "queue", "bill", "test", "port", "worker", "retri", "zebra"}
COUNTED |= {"cafe", "naiv", "file", "\ufb01le", "tuesdai", "ops", "rare", "u00e9t"}
COUNTED |= {"k8", "k8s", "200m", "200ms", "8000", "ie", "i"}


async def test_word_counts_follow_this_process_writes_without_counting_again(
    tmp_path: Path,
) -> None:
    """A search after a store counts none of its words again: the counts kept are brought
    up to date from the texts the store's own writes changed, and stay FTS5's."""
    store = await SqliteStore.open(tmp_path / "m.db")
    rng = random.Random(7)
    try:
        records = []
        async with store.write() as tx:
            for n in range(30):
                words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))
                records.append(fact(f"{words} cafe {n}", tags=["ops"] if n % 4 else []))
                await tx.insert(records[-1], None)
        held, ran = await _counts(store, COUNTED)
        assert held == _fts5(store, COUNTED)
        assert any("records_vocab" in s for s in ran)
        now = format_time(utcnow())
        writes = [
            (
                "insert",
                lambda tx: tx.insert(fact("zebra deploys on Tuesdays", tags=["rare"]), None),
            ),
            (
                "content",
                lambda tx: tx.execute(
                    "UPDATE records SET content = 'zebra zebra billing' WHERE id = ?",
                    [records[0].id],
                ),
            ),
            (
                "merged text",
                lambda tx: tx.execute(
                    "UPDATE records SET merged_text = 'Deploys retried; the queue drains' "
                    "WHERE id = ?",
                    [records[1].id],
                ),
            ),
            (
                "tags",
                lambda tx: tx.execute(
                    "UPDATE records SET tags = ? WHERE id = ?",
                    [json.dumps(["deploys", "rare"]), records[2].id],
                ),
            ),
            (
                "the same text again",
                lambda tx: tx.execute(
                    "UPDATE records SET content = content WHERE id = ?", [records[3].id]
                ),
            ),
            ("archived (FTS5 keeps it)", lambda tx: tx.archive(records[4].id, "old", now)),
            ("deleted", lambda tx: tx.execute("DELETE FROM records WHERE id = ?", [records[5].id])),
        ]
        for name, write in writes:
            async with store.write() as tx:
                await write(tx)
            held, ran = await _counts(store, COUNTED)
            assert held == _fts5(store, COUNTED), name
            assert not any("records_vocab" in s for s in ran), name
            assert not store._word_counts._written  # the texts read go
        for text in (
            "café naïve file",
            "the \ufb01le",  # a ligature: one word to FTS5, another to lexical.words
            "deploy to k8s in 200ms",  # FTS5's porter stems words with digits
            "ies",  # stemmed otherwise there
        ):  # words lexical.stem takes otherwise than FTS5: FTS5's are counted
            async with store.write() as tx:
                await tx.insert(fact(text), None)
            held, ran = await _counts(store, COUNTED)
            assert held == _fts5(store, COUNTED), text
            assert not any("records_vocab" in s for s in ran), text

        async def rolled_back() -> None:
            async with store.write() as tx:
                await tx.insert(fact("zebra zebra"), None)
                raise RuntimeError("no")

        with pytest.raises(RuntimeError):  # rolled back: nothing to count
            await rolled_back()
        held, ran = await _counts(store, COUNTED)
        assert held == _fts5(store, COUNTED)
        assert not any("records_vocab" in s for s in ran)
    finally:
        await store.close()


async def test_word_counts_are_counted_again_after_another_programs_write(
    tmp_path: Path,
) -> None:
    """Another program's write, or a write of many records, and every count is read again
    (from FTS5: exact)."""
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        async with store.write() as tx:
            for n in range(5):
                await tx.insert(fact(f"deploy worker {n}"), None)
        await _counts(store, COUNTED)
        behind_its_back(
            store, "UPDATE records SET content = 'zebra cache' WHERE content = 'deploy worker 0'"
        )
        async with store.write() as tx:  # this one's own change follows the other's
            await tx.insert(fact("deploy zebra"), None)
        held, ran = await _counts(store, COUNTED)
        assert held == _fts5(store, COUNTED)
        assert any("records_vocab" in s for s in ran)
        async with store.write() as tx:
            for n in range(40):
                await tx.insert(fact(f"build queue {n}"), None)
        held, ran = await _counts(store, COUNTED)
        assert held == _fts5(store, COUNTED)
        assert any("records_vocab" in s for s in ran)
    finally:
        await store.close()


async def test_word_counts_read_while_a_write_lands_are_counted_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counts read while FTS5's structure changed under them are not kept to be brought
    up to date (they may hold the write already): the next time they are needed, they
    are counted again."""
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        async with store.write() as tx:
            await tx.insert(fact("deploy worker"), None)
        real = postings.fts_structure
        calls: list[bytes] = []

        def moving(conn: sqlite3.Connection) -> bytes:
            calls.append(real(conn))
            return calls[-1] if len(calls) == 1 else b"moved on"

        monkeypatch.setattr(postings, "fts_structure", moving)
        held, ran = await _counts(store, {"worker"})
        assert held == {"worker": 1} and any("records_vocab" in s for s in ran)
        monkeypatch.setattr(postings, "fts_structure", real)
        store._word_counts._cache.forget()  # as when the structure has moved on since
        held, ran = await _counts(store, {"worker"})
        assert held == {"worker": 1} and any("records_vocab" in s for s in ran)
        store._word_counts._cache.forget()
        held, ran = await _counts(store, {"worker"})  # kept this time
        assert held == {"worker": 1} and not any("records_vocab" in s for s in ran)
    finally:
        await store.close()


async def test_word_counts_are_counted_again_after_a_write_landing_beside_a_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another program's write between this one's commit and its look at FTS5's
    structure: the structure then holds both, and the counts are read again."""
    store = await SqliteStore.open(tmp_path / "m.db")
    try:
        async with store.write() as tx:
            await tx.insert(fact("deploy worker"), None)
        await _counts(store, COUNTED)
        real = SqliteStore._words_written

        def beside(self: SqliteStore, conn: sqlite3.Connection, tx: Any, texts: Any) -> None:
            other = self.driver.connect(str(self.path), busy_timeout_ms=5000)
            other.execute(
                "UPDATE records SET content = 'zebra queue' WHERE content = 'deploy worker'"
            )
            other.commit()
            other.close()
            real(self, conn, tx, texts)

        monkeypatch.setattr(SqliteStore, "_words_written", beside)
        async with store.write() as tx:
            await tx.insert(fact("build worker"), None)
        monkeypatch.setattr(SqliteStore, "_words_written", real)
        held, ran = await _counts(store, COUNTED)
        assert held == _fts5(store, COUNTED)
        assert any("records_vocab" in s for s in ran)
    finally:
        await store.close()
