"""The lexical branch's top k without scoring every match: impact-ordered postings.

FTS5 answers ``ORDER BY bm25(...) LIMIT k`` by computing BM25 for every record
that holds any query word: "run tests billing" matches 26,000 records of a
50,000-memory project, and the cost grows with the store. This module keeps a
second word index beside FTS5, for current records only: one row per (record,
stem) in ``postings``, grouped in lists by scope and corpus, each list ordered
by the stem's *impact* in the record - BM25's term-frequency part at a fixed
reference length (``bm25.impact``)::

    impact = f / (f + K1 * (1 - B + B * |D| / REFERENCE_LENGTH))

A search reads the first ``depth`` postings of each query word in each list it
may see (bounded work, whatever the store's size), and scores the union of
those records exactly, with FTS5's own statistics (the number of records, their
mean length, and each word's record count): the score is the one FTS5 gives.
A word held by at most ``depth`` records of a list yields all of them, so the
top k is exact there; beyond that it is the top k of the records among the
most word-dense ones of each word. When the filters leave fewer than k of them
(a kind or a tag that few records have), the search reads deeper each round
(``bm25.deeper``: two or four times as far), until it has k or has read every
posting.

The index is kept in step inside each write transaction: triggers queue every
record whose words or liveness change (``postings_due``), and the store
re-indexes the queued records before the transaction commits
(``index_due``), so no write path can forget it. Records that stop being
current lose their postings through a trigger.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from memory_mcp.storage.bm25 import (
    COUNTS_TTL,
    K1,
    B,
    CountCache,
    document_terms,
    impact,
    indexed_columns,
)
from memory_mcp.storage.rows import SELECT
from memory_mcp.storage.sqlite.sql import marks

# The postings themselves, with their record index (made again by a migration).
POSTINGS = """
-- One row per current record and stem: its weighted frequency and the record's length
-- (BM25's f and |D|), listed by impact (storage/sqlite/postings.py), with the record's
-- kind, which a walk for some kinds reads in the row.
CREATE TABLE postings (
    list INTEGER NOT NULL,
    term TEXT NOT NULL,
    impact REAL NOT NULL,
    seq INTEGER NOT NULL,
    tf REAL NOT NULL,
    dl INTEGER NOT NULL,
    kind TEXT NOT NULL,
    PRIMARY KEY (list, term, impact, seq)
) WITHOUT ROWID;
CREATE INDEX postings_seq ON postings (seq, term, tf, dl);
"""
SCHEMA = f"""
-- The lists: one per scope key and corpus, numbered.
CREATE TABLE posting_lists (
    id INTEGER PRIMARY KEY,
    scope_key TEXT NOT NULL,
    corpus TEXT NOT NULL,
    UNIQUE (scope_key, corpus)
);
{POSTINGS}-- Records whose postings must be made again before the transaction commits.
CREATE TABLE postings_due (seq INTEGER PRIMARY KEY);
CREATE TRIGGER postings_insert AFTER INSERT ON records BEGIN
    INSERT OR IGNORE INTO postings_due (seq) VALUES (new.seq);
END;
CREATE TRIGGER postings_update
AFTER UPDATE OF content, merged_text, tags, archived_at, replaced_by ON records BEGIN
    INSERT OR IGNORE INTO postings_due (seq) VALUES (new.seq);
END;
CREATE TRIGGER postings_delete AFTER DELETE ON records BEGIN
    DELETE FROM postings WHERE seq = old.seq;
END;
"""


def posting_rows(
    seq: int, content: str, merged_text: str, tags: str, kind: str
) -> list[tuple[str, float, int, float, int, str]]:
    """(term, impact, seq, tf, dl, kind) for one record, as the full-text index reads it."""
    length, weighted = document_terms(indexed_columns(content, merged_text, json.loads(tags)))
    return [(term, impact(tf, length), seq, tf, length, kind) for term, tf in weighted.items()]


# Keeping in step -------------------------------------------------------------------------

# Queued records, a batch at a time (a migration or a repair queues every record).
DUE_SQL = (
    "SELECT d.seq, r.scope_key, r.corpus, r.live, r.content, r.merged_text, r.tags, r.kind "
    "FROM postings_due d LEFT JOIN records r ON r.seq = d.seq "
    "WHERE d.seq > ? ORDER BY d.seq LIMIT 2000"
)
ADD_LIST_SQL = "INSERT OR IGNORE INTO posting_lists (scope_key, corpus) VALUES (?, ?)"
LISTS_SQL = "SELECT id, scope_key, corpus FROM posting_lists"
CLEAR_SQL = "DELETE FROM postings WHERE seq = ?"
INSERT_SQL = (
    "INSERT INTO postings (list, term, impact, seq, tf, dl, kind) VALUES (?, ?, ?, ?, ?, ?, ?)"
)


def lists_wanted(due: Iterable[Sequence[Any]]) -> list[tuple[str, str]]:
    """The (scope key, corpus) lists the current ones of queued rows go in."""
    return sorted({(str(r[1]), str(r[2])) for r in due if r[3]})


def list_numbers(rows: Iterable[Sequence[Any]]) -> dict[tuple[str, str], int]:
    """The lists' numbers by (scope key, corpus), from ``LISTS_SQL``'s rows."""
    return {(str(key), str(corpus)): int(number) for number, key, corpus in rows}


def rows_for(
    due: Iterable[Sequence[Any]], list_of: dict[tuple[str, str], int]
) -> tuple[list[int], list[tuple[Any, ...]]]:
    """The records to clear and the postings to write for queued rows (``DUE_SQL``)."""
    clear: list[int] = []
    out: list[tuple[Any, ...]] = []
    for seq, scope_key, corpus, live, content, merged_text, tags, kind in due:
        clear.append(int(seq))
        if not live:
            continue
        number = list_of[(str(scope_key), str(corpus))]
        rows = posting_rows(int(seq), content, merged_text, tags, kind)
        out.extend((number, *row) for row in rows)
    return clear, out


def index_due_sync(conn: sqlite3.Connection) -> None:
    """Index the queued records (the migration, and every write transaction before it
    commits: ``SqliteStore._commit``)."""
    after = 0
    while due := conn.execute(DUE_SQL, [after]).fetchall():
        conn.executemany(ADD_LIST_SQL, lists_wanted(due))
        clear, rows = rows_for(due, list_numbers(conn.execute(LISTS_SQL)))
        conn.executemany(CLEAR_SQL, [(s,) for s in clear])
        conn.executemany(INSERT_SQL, rows)
        after = clear[-1]
    if after:
        conn.execute("DELETE FROM postings_due")


# Reading -------------------------------------------------------------------------------


def fts_totals(block: bytes) -> tuple[int, float]:
    """FTS5's record count and mean record length, from its averages record.

    The averages record (``records_fts_data`` row 1) holds the number of rows and
    then each column's token total, as SQLite varints: what FTS5's own bm25()
    reads for N and avgdl.
    """
    numbers: list[int] = []
    at = 0
    while at < len(block):
        value = 0
        for byte_number in range(9):
            byte = block[at]
            at += 1
            if byte_number == 8:
                value = (value << 8) | byte
                break
            value = (value << 7) | (byte & 0x7F)
            if not byte & 0x80:
                break
        numbers.append(value)
    rows = numbers[0] if numbers else 0
    return rows, (sum(numbers[1:]) / rows if rows else 0.0)


def top_sql(
    lists: int,
    terms: int,
    weighed: int,
    where: str,
    *,
    narrowed: bool = False,
    kinds: int = 0,
    every: bool = False,
) -> str:
    """The top k of the records among the first ``?`` postings of each (list, term):
    BM25 with the statistics given as parameters, filtered by ``where``.

    ``narrowed``: the filters ask more than the lists' scope and corpus (a kind, a
    tag, a time). The candidates are then filtered before they are scored, and each
    (list, term) gives the first ``?`` of its postings that pass (``FIRST_DEPTH``, or
    k if more) among the first ``?`` it has. Scoring every candidate and filtering
    after cost a search for a kind that 1 record in 6 has 98 ms at 200,000
    memories, as its deeper rounds scored thousands of records that the filter
    then dropped.

    ``kinds``: the search asks for that many kinds, and each walk reads the postings of
    those kinds only, from the row: the first ``?`` of them, however many of the others
    come first. Looking each posting's record up for its kind made a search for a kind
    read deeper and deeper as the store grew (three rounds, 18 ms, for a kind 1 record
    in 6 has at 200,000 memories; two, 2.5 ms, at 50,000), since the words' densest
    records are seldom of the kind asked.

    ``weighed`` words of the query count in the score (those some record holds), each
    with its idf (a ``CASE``: a JSON object of them, read by ``json_each`` for each
    posting, cost a tenth of the query).

    The best k candidates are chosen by their scores before their records are read,
    unless ``every``. A narrowed round's candidates all pass the filters, so they are
    the k best. Another's may not (what a reader may see): if fewer than k of them
    pass, the caller asks again, reading ``every`` candidate's record (``lexical_rows``).
    Reading every candidate's record and sorting the rows took 1.87 ms where this
    takes 1.69 (58 of the bench's narrowed searches at 50,000 memories, warm, the
    same rows), and 1.34 where this takes 0.82 for the rare-word lookups of 300
    stores (about 256 candidates each, for 6). A round that is not narrowed and
    finds fewer than k (fewer candidates than k, in a small store) asks twice.

    Parameters: for each list and term, (list, term, the kinds, depth), then, if
    ``narrowed``, the filters' parameters and how many to keep; then (word, idf) for
    each weighed word; then avgdl; then the weighed words; then, unless ``every``, k;
    then the filters' parameters; then k.
    """
    of_kinds = f"AND kind IN ({marks(range(kinds))}) " if kinds else ""
    first = (
        f"SELECT seq FROM postings WHERE list = ? AND term = ? {of_kinds}"
        "ORDER BY impact DESC LIMIT ?"
    )
    if narrowed:  # the records looked up in the postings' order, as far as ``?`` pass
        first = (
            f"SELECT p.seq FROM ({first}) p CROSS JOIN records r ON r.seq = p.seq "
            f"WHERE {where} LIMIT ?"
        )
    firsts = " UNION ".join([f"SELECT seq FROM ({first})"] * (lists * terms))
    best = "scored" if every else "(SELECT seq, s FROM scored ORDER BY s DESC, seq LIMIT ?)"
    return (
        f"WITH candidates(seq) AS ({firsts}), "
        # Each candidate's postings of the query's words, by postings_seq; the weight
        # looked up per posting (a join led by the weights probed every pair: 1.6x slower).
        f"scored(seq, s) AS (SELECT p.seq, sum(CASE p.term {' '.join(['WHEN ? THEN ?'] * weighed)} "
        f"END * p.tf * {K1 + 1} / (p.tf + {K1} * ({1 - B} + {B} * p.dl / ?))) "
        "FROM candidates c CROSS JOIN postings p WHERE p.seq = c.seq "
        f"AND p.term IN ({marks(range(weighed))}) GROUP BY p.seq) "
        f"SELECT {SELECT}, s.s FROM {best} s CROSS JOIN records r ON r.seq = s.seq "
        f"WHERE {where} ORDER BY s.s DESC, r.seq LIMIT ?"
    )


_VOCAB_SQL = (
    "CREATE VIRTUAL TABLE IF NOT EXISTS temp.records_vocab USING fts5vocab(main, records_fts, row)"
)


# The texts FTS5 indexes, as a write changed them: (content, merged_text, tags) before
# and after, None for a record inserted or deleted.
TextChange = tuple[tuple[str, str, str] | None, tuple[str, str, str] | None]

# The writer's connection notes the texts each write transaction changes, as FTS5's
# triggers index them (``WordCounts.written``).
WORDS_WRITTEN = """
CREATE TEMP TABLE IF NOT EXISTS words_written (
    old_content TEXT, old_merged TEXT, old_tags TEXT,
    new_content TEXT, new_merged TEXT, new_tags TEXT
);
CREATE TEMP TRIGGER IF NOT EXISTS words_written_insert AFTER INSERT ON main.records BEGIN
    INSERT INTO words_written (new_content, new_merged, new_tags)
    VALUES (new.content, new.merged_text, new.tags);
END;
CREATE TEMP TRIGGER IF NOT EXISTS words_written_delete AFTER DELETE ON main.records BEGIN
    INSERT INTO words_written (old_content, old_merged, old_tags)
    VALUES (old.content, old.merged_text, old.tags);
END;
CREATE TEMP TRIGGER IF NOT EXISTS words_written_update
AFTER UPDATE OF content, merged_text, tags ON main.records BEGIN
    INSERT INTO words_written VALUES (
        old.content, old.merged_text, old.tags, new.content, new.merged_text, new.tags
    );
END;
"""
WORDS_WRITTEN_SQL = "SELECT * FROM temp.words_written"
WORDS_CLEAR_SQL = "DELETE FROM temp.words_written"
_STRUCTURE_SQL = "SELECT block FROM records_fts_data WHERE id = 10"

_WRITES_KEPT = 64  # this process's commits a reader can catch up on
_CHANGES_MOST = 32  # records a commit changes for its word changes to be kept (an import's
# batch changes more: tokenizing them all at the next search would cost more than counting)


def fts_structure(conn: sqlite3.Connection) -> bytes:
    """FTS5's structure record: every change to its index (a write, a merge) changes it."""
    row = conn.execute(_STRUCTURE_SQL).fetchone()
    return bytes(row[0]) if row else b""


def text_changes(rows: Iterable[Sequence[Any]]) -> list[TextChange]:
    """``WORDS_WRITTEN_SQL``'s rows as (before, after) texts."""
    out: list[TextChange] = []
    for oc, om, ot, nc, nm, nt in rows:
        before = None if oc is None else (str(oc), str(om or ""), str(ot or ""))
        after = None if nc is None else (str(nc), str(nm or ""), str(nt or ""))
        out.append((before, after))
    return out


# FTS5 itself says which words a text holds: a table of one row on the reader's
# connection, with the records' tokenizer (migrations: records_fts), and its vocabulary.
_TOKENIZED = (
    "CREATE VIRTUAL TABLE IF NOT EXISTS temp.words_of USING fts5("
    "text, tokenize = 'porter unicode61 remove_diacritics 2')",
    "CREATE VIRTUAL TABLE IF NOT EXISTS temp.words_of_vocab USING fts5vocab(temp, words_of, row)",
)


def _terms(conn: sqlite3.Connection, texts: tuple[str, str, str] | None) -> set[str]:
    """The words a record's texts hold, as FTS5 indexes them (its own tokenizer: this
    module's ``words`` and ``stem`` differ from it on some words, "k8s" or a
    ligature)."""
    if texts is None:
        return set()
    conn.execute("INSERT INTO temp.words_of (rowid, text) VALUES (1, ?)", ["\n".join(texts)])
    try:
        return {str(term) for (term,) in conn.execute("SELECT term FROM temp.words_of_vocab")}
    finally:
        conn.execute("DELETE FROM temp.words_of")


def count_changes(conn: sqlite3.Connection, changes: Iterable[TextChange]) -> dict[str, int]:
    """How many more records hold each word after these changes (less if negative), as
    FTS5 counts them: a record holds a word once, whichever of its texts hold it."""
    out: dict[str, int] = {}
    for before, after in changes:
        held, holds = _terms(conn, before), _terms(conn, after)
        for s in holds - held:
            out[s] = out.get(s, 0) + 1
        for s in held - holds:
            out[s] = out.get(s, 0) - 1
    return {s: n for s, n in out.items() if n}


class WordCounts:
    """How many committed records hold each stem FTS5 knows: BM25's n(q), and what picks
    a memory's rarest words (cached a while, unless ``fresh``).

    Read on the reader connection's thread only (``read``), which is never inside a
    transaction that could roll its temporary vocabulary table back; fts5vocab
    counts by reading a word's postings (1-4 ms for a search's words at
    50,000-200,000 memories, and growing with the store), hence the cache. Fresh
    counts are those read since FTS5's structure record last changed: every write
    to its index changes it (a new segment, a merge), so they are exact.

    What a count read now would say comes from ``_exact`` where it can: counts kept
    up to date through this process's own writes (``written``), whose texts, read by
    FTS5's own tokenizer (``_terms``), say which records came to hold a word or
    stopped, so that a search after a store counts none of its words again. Any
    other change (another process's write, a commit that changed many records or
    FTS5's index alone) and they are counted again.
    The answers are the same as counting each time: ``_cache`` keeps what was read
    when, as before.
    """

    def __init__(self) -> None:
        self._cache = CountCache()  # the counts as read, and when
        self._seen: bytes | None = None  # FTS5's structure when they were exact
        self._exact = CountCache()  # the counts at FTS5's structure ``_index``
        self._index: bytes | None = None
        self._temporary = False  # the connection has temp.records_vocab and temp.words_of
        self._lock = threading.Lock()  # the writer's thread adds to ``_written``
        self._written: deque[tuple[bytes, bytes, list[TextChange] | None]] = deque(
            maxlen=_WRITES_KEPT
        )

    def forget(self) -> None:
        """Read every count again."""
        self._cache.forget()
        self._exact.forget()

    def written(self, before: bytes, after: bytes, changes: list[TextChange]) -> None:
        """This process committed a write that took FTS5's structure from ``before`` to
        ``after``, nothing else committed in between, changing these texts (on the
        writer's thread, after the commit)."""
        if before == after and not changes:
            return
        # a change of FTS5's index with no text changed (doctor's rebuild) is not trusted
        kept = changes if changes and len(changes) <= _CHANGES_MOST else None
        with self._lock:
            self._written.append((before, after, kept))

    def read(self, conn: sqlite3.Connection, stems: set[str], fresh: bool) -> dict[str, int]:
        """The counts of ``stems`` that some record holds (the others are left out)."""
        now = time.monotonic()
        since = now - COUNTS_TTL
        index = None
        if fresh:
            index = self._follow(conn)
            if index != self._seen:  # written since: none of them is exact now
                self._cache.forget()
                self._seen = index
            since = -math.inf
        known, missing = self._cache.lookup(stems, since, exact=fresh)
        if missing:
            found = self._counted(conn, missing, self._follow(conn) if index is None else index)
            known |= self._cache.remember(missing, found, now)
        return known

    def _counted(self, conn: sqlite3.Connection, stems: list[str], index: bytes) -> dict[str, int]:
        """The record counts of ``stems`` at FTS5's structure ``index`` (the one now), of
        those some record holds: kept up to date, or counted."""
        held, missing = self._exact.lookup(stems, -math.inf, exact=True)
        if missing:
            self._make_temporary(conn)
            found = dict(
                conn.execute(
                    f"SELECT term, doc FROM temp.records_vocab WHERE term IN ({marks(missing)})",
                    missing,
                )
            )
            if fts_structure(conn) == index:  # not if a write landed while they were counted
                self._exact.remember(missing, found, time.monotonic())
            held |= {s: int(n) for s, n in found.items() if n}
        return held

    def _follow(self, conn: sqlite3.Connection) -> bytes:
        """FTS5's structure now, with ``_exact`` brought up to it (or forgotten)."""
        index = fts_structure(conn)
        if index != self._index:
            if not self._caught_up(conn, index):
                self._exact.forget()
            self._index = index
            with self._lock:  # only writes from here on are of use (their texts go)
                while self._written and self._written[0][0] != index:
                    self._written.popleft()
        return index

    def _caught_up(self, conn: sqlite3.Connection, index: bytes) -> bool:
        """Bring ``_exact`` from ``_index`` to ``index`` through this process's writes;
        False if they do not lead there (another's write, or one that kept no texts)."""
        with self._lock:
            writes = list(self._written)
        at, changes = self._index, []
        for before, after, texts in writes:
            if at == index:
                break
            if before != at:
                continue
            if texts is None:
                return False
            changes.extend(texts)
            at = after
        if at != index:
            return False
        self._make_temporary(conn)
        self._exact.adjust(count_changes(conn, changes))
        return True

    def _make_temporary(self, conn: sqlite3.Connection) -> None:
        """The reader connection's temporary tables: FTS5's vocabulary (the counts) and a
        one-row FTS5 table with its own (``_terms``)."""
        if not self._temporary:
            for statement in (_VOCAB_SQL, *_TOKENIZED):
                conn.execute(statement)
            self._temporary = True


def totals(conn: sqlite3.Connection) -> tuple[int, float]:
    """FTS5's record count and mean length (its bm25's N and avgdl)."""
    row = conn.execute("SELECT block FROM records_fts_data WHERE id = 1").fetchone()
    return fts_totals(bytes(row[0])) if row else (0, 0.0)
