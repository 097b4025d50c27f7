"""Each current record's neighbours in time, kept in a table beside the records.

A search reads each candidate with the records written just before and just
after it (``Queries.in_conversation``): the current record of its scope and
corpus nearest to it in creation time, then write order, on each side. Found by
two index seeks per candidate on ``records_live``, that was 0.76 ms of a
search's 120 candidates at 200,000 memories; read from this table, where each
current record has its row, 0.20 ms (the same rows).

A row names each neighbour by ``seq`` and id, with the seconds between the two
records' creation times (computed as the seeks computed them, so that a search's
"within so many seconds" admits the same neighbours). Triggers keep it in step
inside each write: a record that becomes current (inserted, restored) is linked
between the two it falls between; one that stops being current (archived,
superseded, deleted) is unlinked, its two neighbours linked to each other. A
record's scope, corpus and creation time never change once written. ``doctor``
checks the rows against the records and makes them again (``REBUILD``).
"""

from __future__ import annotations

from collections.abc import Collection

from memory_mcp.storage.sqlite.sql import marks


def _gap(neighbour: str, record: str) -> str:
    """The seconds between two creation times, as the seeks computed them."""
    return f"abs(julianday({neighbour}) - julianday({record})) * 86400.0"


# The current record of ``x``'s scope and corpus just before (or after) it.
_SIDE = (
    "(SELECT o.seq FROM records o WHERE o.scope_key = {x}.scope_key "
    "AND o.corpus = {x}.corpus AND o.live = 1 AND o.created_at {cmp}= {x}.created_at "
    "AND (o.created_at {cmp} {x}.created_at OR o.seq {cmp} {x}.seq) "
    "ORDER BY o.created_at {order}, o.seq {order} LIMIT 1)"
)


# Each side of a record, with the other's name for it: the neighbour before a record
# has it after.
_SIDES = (("before", "after"), ("after", "before"))


def _link(x: str) -> str:
    """Statements that link the record ``x`` (``new``) between its neighbours, and them
    to it."""
    before = _SIDE.format(x=x, cmp="<", order="DESC")
    after = _SIDE.format(x=x, cmp=">", order="ASC")
    inserted = f"""
    INSERT OR REPLACE INTO neighbours
        (seq, before, before_id, before_gap, after, after_id, after_gap)
    SELECT {x}.seq, b.seq, b.id, {_gap("b.created_at", f"{x}.created_at")},
        a.seq, a.id, {_gap("a.created_at", f"{x}.created_at")}
    FROM (SELECT 1) LEFT JOIN records b ON b.seq = {before}
    LEFT JOIN records a ON a.seq = {after};"""
    return inserted + "".join(
        f"""
    UPDATE neighbours SET ({far}, {far}_id, {far}_gap) =
        (SELECT {x}.seq, {x}.id, n.{side}_gap FROM neighbours n WHERE n.seq = {x}.seq)
    WHERE seq = (SELECT {side} FROM neighbours WHERE seq = {x}.seq);"""
        for side, far in _SIDES
    )


def _unlink(x: str) -> str:
    """Statements that take the record ``x`` (``old``) out, its neighbours now each
    other's."""
    relinked = "".join(
        f"""
    UPDATE neighbours SET ({far}, {far}_id, {far}_gap) =
        (SELECT o.seq, o.id, {_gap("o.created_at", "m.created_at")} FROM neighbours n
         JOIN records m ON m.seq = n.{side} LEFT JOIN records o ON o.seq = n.{far}
         WHERE n.seq = {x}.seq)
    WHERE seq = (SELECT {side} FROM neighbours WHERE seq = {x}.seq);"""
        for side, far in _SIDES
    )
    return f"""{relinked}
    DELETE FROM neighbours WHERE seq = {x}.seq;"""


SCHEMA = f"""
-- Each current record's neighbours in time: the current records of its scope and
-- corpus just before and just after it (creation time, then write order), with the
-- seconds between (storage/sqlite/neighbours.py). Kept by the triggers below.
CREATE TABLE neighbours (
    seq INTEGER PRIMARY KEY,
    before INTEGER,
    before_id TEXT,
    before_gap REAL,
    after INTEGER,
    after_id TEXT,
    after_gap REAL
);
CREATE TRIGGER neighbours_insert AFTER INSERT ON records WHEN new.live = 1 BEGIN{_link("new")}
END;
CREATE TRIGGER neighbours_restore AFTER UPDATE OF archived_at, replaced_by ON records
WHEN old.live = 0 AND new.live = 1 BEGIN{_link("new")}
END;
CREATE TRIGGER neighbours_retire AFTER UPDATE OF archived_at, replaced_by ON records
WHEN old.live = 1 AND new.live = 0 BEGIN{_unlink("old")}
END;
CREATE TRIGGER neighbours_delete AFTER DELETE ON records WHEN old.live = 1 BEGIN{_unlink("old")}
END;
"""

# What the rows should be, from the records alone.
EXPECTED = f"""
SELECT seq, before, before_id, {_gap("before_at", "created_at")} AS before_gap,
    after, after_id, {_gap("after_at", "created_at")} AS after_gap
FROM (SELECT seq, created_at,
        lag(seq) OVER w AS before, lag(id) OVER w AS before_id,
        lag(created_at) OVER w AS before_at,
        lead(seq) OVER w AS after, lead(id) OVER w AS after_id,
        lead(created_at) OVER w AS after_at
    FROM records WHERE live = 1
    WINDOW w AS (PARTITION BY scope_key, corpus ORDER BY created_at, seq))
"""

REBUILD = (
    "DELETE FROM neighbours",
    "INSERT INTO neighbours (seq, before, before_id, before_gap, after, after_id, after_gap) "
    + EXPECTED,
)

# Records whose row disagrees with the records: missing, wrong, or of one not current.
DISAGREEING = f"""
WITH expected AS ({EXPECTED}), kept AS (SELECT * FROM neighbours)
SELECT count(DISTINCT seq) FROM (
    SELECT seq FROM (SELECT * FROM expected EXCEPT SELECT * FROM kept)
    UNION ALL SELECT seq FROM (SELECT * FROM kept EXCEPT SELECT * FROM expected))
"""


def neighbours_sql(record_ids: Collection[str], near: bool) -> str:
    """Each given record with a vector (by id) and, if ``near``, its neighbours in time
    as ``seq:id`` (NULL on a side without one within ``?`` seconds).

    Parameters: if ``near``, the seconds twice; then the ids; then the embedder.
    """
    sides = (
        ", CASE WHEN n.before_gap <= ? THEN n.before || ':' || n.before_id END"
        ", CASE WHEN n.after_gap <= ? THEN n.after || ':' || n.after_id END"
        if near
        else ""
    )
    joined = " LEFT JOIN neighbours n ON n.seq = c.seq" if near else ""
    return (
        f"SELECT c.id, c.seq{sides} FROM records c{joined} "
        f"WHERE c.id IN ({marks(record_ids)}) AND +c.embedder = ? AND c.vec_rows > 0"
    )
