"""SQL shared by the SQLite backend's reads and writes: columns, rows, filters, queries.

Each query builder says why it is shaped as it is: SQLite's planner, left to
itself, picks plans that cost tens of milliseconds at 50,000 memories.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection
from typing import Any

from memory_mcp.errors import StorageError
from memory_mcp.lexical import query_terms
from memory_mcp.storage.base import Filters, Position
from memory_mcp.storage.bm25 import COLUMN_WEIGHTS
from memory_mcp.storage.rows import (
    INSERT_COLUMNS,
    INSERT_WIDTH,
    SELECT,
    VISIBLE,
    prior_sql,
    record_of,
    record_params,
)

__all__ = ["SELECT", "prior_sql", "record_of", "record_params"]

log = logging.getLogger(__name__)


BUSY_HINT = (
    "the database is busy: another memory-mcp process held its write lock longer than "
    "storage.busy_timeout_ms"
)


INSERT = f"INSERT INTO records ({INSERT_COLUMNS}) VALUES ({', '.join('?' * INSERT_WIDTH)})"


def seq_of(position: Position | None) -> int:
    """The write order number a position stands for (0: before the first record).

    Cursors saved before positions were text hold the number itself.
    """
    return int(position or 0)


def marks(values: Collection[Any]) -> str:
    return ", ".join("?" * len(values))


def filters_sql(f: Filters, *, live_only: bool = True) -> tuple[str, list[Any]]:
    clauses = [f"r.scope_key IN ({marks(f.scope_keys)})", f"r.corpus IN ({marks(f.corpora)})"]
    params: list[Any] = [*f.scope_keys, *f.corpora]
    if live_only:
        clauses.append("r.live = 1")
    if f.kinds:
        clauses.append(f"r.kind IN ({marks(f.kinds)})")
        params.extend(f.kinds)
    if f.tags:
        clauses.append(tags_sql(f.tags))
        params.extend([*(json.dumps(t) for t in f.tags if _plain(f.tags)), *f.tags])
    if f.agents:
        clauses.append(f"r.agent IN ({marks(f.agents)})")
        params.extend(f.agents)
    if f.since:
        clauses.append("r.created_at >= ?")
        params.append(f.since)
    if f.until:
        clauses.append("r.created_at < ?")
        params.append(f.until)
    if f.through:
        clauses.append("r.created_at <= ?")
        params.append(f.through)
    if f.exclude_ids:
        clauses.append(f"r.id NOT IN ({marks(f.exclude_ids)})")
        params.extend(f.exclude_ids)
    if f.viewer is not None:
        clauses.append(VISIBLE.replace("%s", "?"))
        params.append(f.viewer)
    if f.private is not None:
        clauses.append("r.private = ?")
        params.append(int(f.private))
    return " AND ".join(clauses), params


def _plain(tags: Collection[str]) -> bool:
    """Whether each tag is written the same in JSON with and without ASCII escapes."""
    return all(t.isascii() and t.isprintable() and '"' not in t and "\\" not in t for t in tags)


def tags_sql(tags: Collection[str]) -> str:
    """A record has one of these tags (parameters: for plain tags, each one as a JSON
    string, then each tag).

    A test for the tag's JSON text in the column comes first when it cannot miss:
    parsing every record's tags cost a search filtered by a tag, which tests the
    records of a posting list one by one, 40 ms at 200,000 memories.
    """
    exact = f"EXISTS (SELECT 1 FROM json_each(r.tags) WHERE json_each.value IN ({marks(tags)}))"
    if not _plain(tags):
        return exact
    return f"({' OR '.join(['instr(r.tags, ?) > 0'] * len(tags))}) AND {exact}"


def by_seq_sql(seqs: Collection[int], where: str) -> str:
    """Given records (by ``seq``) that pass the filters ``where``.

    Left to itself, SQLite reads them through ``records_live`` (the filters'
    equalities), i.e. every live record of the project: 14-18 ms at 50,000.
    NOT INDEXED leaves it the rowid lookups.
    """
    return (
        f"SELECT {SELECT}, r.seq FROM records r NOT INDEXED "
        f"WHERE r.seq IN ({marks(seqs)}) AND {where}"
    )


def passing_sql(seqs: Collection[int], where: str) -> str:
    """Which of the given records (by ``seq``) pass the filters ``where`` (as
    ``by_seq_sql``, without reading their rows)."""
    return f"SELECT r.seq FROM records r NOT INDEXED WHERE r.seq IN ({marks(seqs)}) AND {where}"


def slots_sql(record_ids: Collection[str]) -> str:
    """Where the vectors of the given records are, by id.

    The unary ``+`` keeps SQLite from reading them through ``records_embedder``,
    i.e. every record with a vector: 48 ms at 50,000 memories.
    """
    return (
        f"SELECT seq, id, vec_rows, scope_key FROM records WHERE id IN ({marks(record_ids)}) "
        "AND +embedder = ? AND vec_rows > 0"
    )


def awaiting_sql(embedder: str, incomplete: bool) -> tuple[str, list[Any]]:
    """How many current records lack vectors from ``embedder``, and its parameters: with
    ``incomplete``, those whose passages beyond the whole text are still due count too.

    Read as ranges of ``records_embedder`` (embedder, live), it reads the records that
    await and no other: ``embedder != ?`` scanned every record, 60-70 ms at 200,000
    memories, on a server's first search (``Engine.awaiting_vectors``), every 30 s of
    searching after it and every round of maintenance. The due ones come from their
    own index (``records_vectors_due``); the unary ``+`` keeps SQLite from walking
    every record with a vector in ``records_embedder`` for them instead.
    """
    missing = (
        "SELECT count(*) FROM records WHERE live = 1 "
        "AND (embedder IS NULL OR embedder < ? OR embedder > ?)"
    )
    if not incomplete:
        return missing, [embedder, embedder]
    due = "SELECT count(*) FROM records WHERE vectors_due = 1 AND live = 1 AND +embedder = ?"
    return f"SELECT ({missing}) + ({due})", [embedder, embedder, embedder]


CONFLICT_COLUMNS = "id, scope_key, record_id, other_id, reason, created_at, resolved_at, resolution"


def conflicts_sql(where: str) -> str:
    """The conflicts ``where`` says (``Conflict``'s columns), oldest first."""
    return f"SELECT {CONFLICT_COLUMNS} FROM conflicts WHERE {where} ORDER BY id"


def open_conflicts_where(record_ids: Collection[str]) -> tuple[str, list[Any]]:
    """``conflicts_sql``'s condition for the open conflicts that any of ``record_ids`` is
    part of, with its parameters."""
    ids = marks(record_ids)
    where = f"resolved_at IS NULL AND (record_id IN ({ids}) OR other_id IN ({ids}))"
    return where, [*record_ids, *record_ids]


def hash_sql(where: str) -> str:
    """Records with a given content hash, newest first.

    Without statistics, SQLite picks ``records_live`` (three equalities too) and
    tests the hash of every live record of the project: 26 ms at 50,000.
    """
    return (
        f"SELECT {SELECT} FROM records r INDEXED BY records_hash "
        f"WHERE r.content_hash = ? AND {where} ORDER BY r.created_at DESC"
    )


def lexical_sql(where: str) -> str:
    """The full-text query: BM25 over the matches of ``?``, filtered by ``where``.

    CROSS JOIN keeps the full-text match as the outer loop: with a time bound the
    planner otherwise walks the date index and runs MATCH once per row (161 ms
    instead of 29 ms per search at 1,000 memories).
    """
    return (
        f"SELECT {SELECT}, bm25(records_fts, {', '.join(map(str, COLUMN_WEIGHTS))}) AS s "
        "FROM records_fts "
        "CROSS JOIN records r ON r.seq = records_fts.rowid "
        f"WHERE records_fts MATCH ? AND {where} ORDER BY s LIMIT ?"
    )


def fts_query(text: str | list[str]) -> str:
    """An FTS5 MATCH expression: any of the text's ``query_terms`` (or these), quoted.

    Quoting every term makes FTS5 syntax in user text (``AND``, ``NEAR``, ``*``,
    ``:``, quotes, parentheses) plain words.
    """
    terms = query_terms(text) if isinstance(text, str) else text
    return " OR ".join(f'"{term}"' for term in terms)


def storage_error(exc: Exception) -> StorageError:
    text = str(exc)
    if "locked" in text or "busy" in text:
        return StorageError(BUSY_HINT)
    if "full" in text:
        return StorageError(
            "the disk is full (or the database reached its size limit); nothing was written. "
            "Free some space and try again"
        )
    if "readonly" in text or "read-only" in text:
        return StorageError(
            "the database is read-only (file or folder permissions, or a read-only disk); "
            "nothing was written. Searches still work"
        )
    return StorageError(f"database error: {text}")
