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
    if f.agents:
        clauses.append("r.agent = ANY(%s)")
        params.append(list(f.agents))
    if f.since:
        clauses.append("r.created_at >= %s")
        params.append(f.since)
    if f.until:
        clauses.append("r.created_at < %s")
        params.append(f.until)
    if f.through:
        clauses.append("r.created_at <= %s")
        params.append(f.through)
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


def lexical_sql(where: str, *, narrowed: bool = False, kinds: bool = False) -> str:
    """FTS5's BM25 (``bm25``) of the records among the first postings of each finder
    in each list (``bm25.TopPlan``), filtered by ``where``, best first.

    Parameters: the lists (``%s::int[]``), the finders (``text[]``), if ``kinds`` the
    kinds asked (``text[]``: each walk reads the postings of those kinds only, from the
    row, as on SQLite), the depth; if
    ``narrowed``, the filters' parameters and how many to keep; every stem and its
    idf (``text[]``, ``float8[]``); the mean length; the filters' parameters;
    ``LIMIT``. Each (list, finder) is a backward walk of ``postings``' key, ``depth``
    rows at most; the candidates are scored from ``postings_seq`` alone (it covers
    the weighted frequency and the record's length), then visited best first and
    checked against ``where``. Ties go to the older record.

    ``narrowed``: the filters ask more than the lists' scope and corpus, so each walk
    keeps the first of its records that pass them, as many as asked, before any is
    scored (as on SQLite: ``sqlite.postings.top_sql``).

    The scored candidates' records are read best first, until ``LIMIT`` of them pass
    ``where`` (a nested loop over the sorted scores), not all of them before the sort:
    at 10,000 memories a store's rare-word lookup (about 350 candidates for 6) took
    6.01 ms instead of 8.34, a search's 4.18 instead of 5.01 (the statements of 11
    stores and 11 searches, five times each, the same rows).
    """
    # The walk's order is the key's, backwards: postings of equal impact newest first, as
    # SQLite's walk reads them. With the impact alone, which of the postings tied at the
    # walk's end it kept was the plan's choice (another for a narrowed walk).
    first = "SELECT p.seq, p.impact FROM postings p WHERE p.list = l.id AND p.term = f.term "
    if kinds:
        first += "AND p.kind = ANY(%s) "
    first += "ORDER BY p.impact DESC, p.seq DESC LIMIT %s"
    if narrowed:  # the join may not keep the walk's order: ordered again before the cut
        first = (
            f"SELECT p.seq, p.impact FROM ({first}) p JOIN records r ON r.seq = p.seq "
            f"WHERE {where} ORDER BY p.impact DESC, p.seq DESC LIMIT %s"
        )
    return f"""
WITH candidates AS MATERIALIZED (
    SELECT DISTINCT c.seq FROM unnest(%s::int[]) AS l(id) CROSS JOIN unnest(%s::text[]) AS f(term)
    CROSS JOIN LATERAL ({first}) c
),
weights AS (SELECT * FROM unnest(%s::text[], %s::float8[]) AS w(term, idf)),
scored AS MATERIALIZED (
    SELECT p.seq, sum(w.idf * p.tf * {K1 + 1} / (p.tf + {K1} * (1 - {B} + {B} * p.doc_len
           / %s::float8))) AS s
    FROM candidates c JOIN postings p ON p.seq = c.seq JOIN weights w ON w.term = p.term
    GROUP BY p.seq
)
SELECT r.*, x.s FROM (SELECT seq, s FROM scored ORDER BY s DESC, seq) x
CROSS JOIN LATERAL (SELECT {SELECT} FROM records r WHERE r.seq = x.seq AND {where}) r
ORDER BY x.s DESC, x.seq LIMIT %s
"""


def probes_sql(probes: int) -> str:
    """How many ivfflat lists the transaction's next statements score."""
    return f"SET LOCAL ivfflat.probes = {int(probes)}"


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
