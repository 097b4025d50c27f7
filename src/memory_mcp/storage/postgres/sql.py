"""SQL shared by the Postgres backend's reads and writes: filters, BM25, errors."""

from __future__ import annotations

from typing import Any

from memory_mcp.errors import StorageError
from memory_mcp.storage.base import Filters
from memory_mcp.storage.bm25 import K1, B
from memory_mcp.storage.rows import SELECT, VISIBLE


def filters_sql(f: Filters, *, live_only: bool = True) -> tuple[str, list[Any]]:
    """The WHERE clause over ``records r`` that keeps what ``f`` lets through."""
    clauses = ["r.scope_key = ANY(%s)", "r.corpus = ANY(%s)"]
    params: list[Any] = [list(f.scope_keys), list(f.corpora)]
    if live_only:
        clauses.append("r.live")
    if f.kinds:
        clauses.append("r.kind = ANY(%s)")
        params.append(list(f.kinds))
    if f.tags:
        clauses.append(
            "EXISTS (SELECT 1 FROM jsonb_array_elements_text(r.tags::jsonb) t(tag) "
            "WHERE t.tag = ANY(%s))"
        )
        params.append(list(f.tags))
    if f.since:
        clauses.append("r.created_at >= %s")
        params.append(f.since)
    if f.until:
        clauses.append("r.created_at < %s")
        params.append(f.until)
    if f.exclude_ids:
        clauses.append("NOT (r.id = ANY(%s))")
        params.append(list(f.exclude_ids))
    if f.viewer is not None:
        clauses.append(VISIBLE)
        params.append(f.viewer)
    if f.private is not None:
        clauses.append("r.private = %s")
        params.append(int(f.private))
    return " AND ".join(clauses), params


def lexical_sql(where: str) -> str:
    """FTS5's BM25 (``bm25``) over the records holding a stem of ``%s`` (one a phrase),
    filtered by ``where``, best first, ``LIMIT %s``.

    ``n(q)`` counts the postings of each stem, and the scores are summed over
    them, both from ``record_terms``'s primary key alone (it covers the weighted
    frequency and the record's length: index-only scans, no visit to the
    records). Then the records are visited best first, each checked against
    ``where``, until ``LIMIT`` have passed: a few more than ``LIMIT`` reads of
    ``records`` however many records hold the words. ``N`` and the mean length
    come from ``lexical_stats``. Ties go to the older record.
    """
    return f"""
WITH q AS (SELECT t.term FROM unnest(%s::text[]) AS t(term)),
stats AS (SELECT greatest(documents, 1)::float8 AS n, greatest(tokens, 1)::float8
          / greatest(documents, 1) AS avgdl FROM lexical_stats),
idf AS (
    SELECT q.term, greatest(ln((stats.n - h.n + 0.5) / (h.n + 0.5)), 1e-6) AS w
    FROM q CROSS JOIN stats
    CROSS JOIN LATERAL (SELECT count(*)::float8 AS n FROM record_terms x WHERE x.term = q.term) h
),
scored AS MATERIALIZED (
    SELECT t.seq, sum(idf.w * t.tf * {K1 + 1} / (t.tf + {K1} * (1 - {B} + {B} * t.doc_len
           / stats.avgdl))) AS s
    FROM idf JOIN record_terms t ON t.term = idf.term CROSS JOIN stats
    GROUP BY t.seq
)
SELECT {SELECT}, x.s FROM (SELECT seq, s FROM scored ORDER BY s DESC, seq) x
JOIN records r ON r.seq = x.seq
WHERE {where}
ORDER BY x.s DESC, x.seq LIMIT %s
"""


def hash_sql(where: str) -> str:
    """Records with a given content hash (``%s``), newest first."""
    return (
        f"SELECT {SELECT} FROM records r WHERE r.content_hash = %s AND {where} "
        "ORDER BY r.created_at DESC"
    )


def storage_error(exc: Exception) -> StorageError:
    """A driver error as the engine's ``StorageError`` (never with a password in it)."""
    from psycopg import errors

    if isinstance(exc, errors.DiskFull):
        return StorageError(
            "the database server's disk is full; nothing was written. Free some space and retry"
        )
    if isinstance(exc, errors.ReadOnlySqlTransaction):
        return StorageError(
            "the database is read-only (a standby, or default_transaction_read_only); "
            "nothing was written. Searches still work"
        )
    if isinstance(exc, errors.InsufficientPrivilege):
        return StorageError(f"the database refused this role: {exc}")
    return StorageError(f"database error: {exc}")
