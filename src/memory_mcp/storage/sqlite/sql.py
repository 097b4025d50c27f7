"""SQL shared by the SQLite backend's reads and writes: columns, rows, filters, queries.

Each query builder says why it is shaped as it is: SQLite's planner, left to
itself, picks plans that cost tens of milliseconds at 50,000 memories.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from memory_mcp.errors import StorageError
from memory_mcp.lexical import query_terms
from memory_mcp.ranker import (
    DURABLE_KINDS,
    KIND_IMPORTANCE,
    RECENCY_FLOOR,
    REINFORCEMENT_FLOOR,
    RankerConfig,
)
from memory_mcp.records import MergedEntry, Record, derived
from memory_mcp.storage.base import Filters, Position

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


COLUMNS = (
    "id",
    "corpus",
    "kind",
    "scope",
    "scope_key",
    "content",
    "tags",
    "importance",
    "pinned",
    "agent",
    "created_at",
    "updated_at",
    "access_count",
    "last_access_at",
    "fold_count",
    "merged_from",
    "supersedes",
    "replaced_by",
    "embedder",
    "meta",
    "archived_at",
    "archived_reason",
)
SELECT = ", ".join(f"r.{c}" for c in COLUMNS)
BUSY_HINT = (
    "the database is busy: another memory-mcp process held its write lock longer than "
    "storage.busy_timeout_ms"
)


def record_of(row: Sequence[Any]) -> Record:
    values = dict(zip(COLUMNS, row, strict=False))
    return Record(
        id=values["id"],
        corpus=values["corpus"],
        kind=values["kind"],
        scope=values["scope"],
        scope_key=values["scope_key"],
        content=values["content"],
        tags=json.loads(values["tags"]),
        importance=values["importance"],
        pinned=bool(values["pinned"]),
        agent=values["agent"],
        created_at=values["created_at"],
        updated_at=values["updated_at"],
        access_count=values["access_count"],
        last_access_at=values["last_access_at"],
        fold_count=values["fold_count"],
        merged_from=[MergedEntry.from_json(m) for m in json.loads(values["merged_from"])],
        supersedes=json.loads(values["supersedes"]),
        replaced_by=values["replaced_by"],
        embedder=values["embedder"],
        meta=json.loads(values["meta"]),
        archived_at=values["archived_at"],
        archived_reason=values["archived_reason"],
    )


def record_params(record: Record) -> tuple[Any, ...]:
    columns = derived(record)
    return (
        record.id,
        record.corpus,
        record.kind,
        record.scope,
        record.scope_key,
        record.content,
        columns.content_hash,
        json.dumps(record.tags, ensure_ascii=False),
        record.importance,
        int(record.pinned),
        record.agent,
        record.created_at,
        record.updated_at,
        record.access_count,
        record.last_access_at,
        record.fold_count,
        json.dumps([m.to_json() for m in record.merged_from], ensure_ascii=False),
        columns.merged_text,
        json.dumps(record.supersedes),
        record.replaced_by,
        record.embedder,
        json.dumps(record.meta, ensure_ascii=False),
        record.archived_at,
        record.archived_reason,
        columns.emphasis,
    )


INSERT = (
    "INSERT INTO records (id, corpus, kind, scope, scope_key, content, content_hash, tags, "
    "importance, pinned, agent, created_at, updated_at, access_count, last_access_at, "
    "fold_count, merged_from, merged_text, supersedes, replaced_by, embedder, meta, "
    "archived_at, archived_reason, emphasis) VALUES (" + ", ".join("?" * 25) + ")"
)


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
        clauses.append(
            f"EXISTS (SELECT 1 FROM json_each(r.tags) WHERE json_each.value IN ({marks(f.tags)}))"
        )
        params.extend(f.tags)
    if f.since:
        clauses.append("r.created_at >= ?")
        params.append(f.since)
    if f.until:
        clauses.append("r.created_at < ?")
        params.append(f.until)
    if f.exclude_ids:
        clauses.append(f"r.id NOT IN ({marks(f.exclude_ids)})")
        params.extend(f.exclude_ids)
    return " AND ".join(clauses), params


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


def slots_sql(record_ids: Collection[str]) -> str:
    """Where the vectors of the given records are, by id.

    The unary ``+`` keeps SQLite from reading them through ``records_embedder``,
    i.e. every record with a vector: 48 ms at 50,000 memories.
    """
    return (
        f"SELECT seq, id, vec_rows, scope_key FROM records WHERE id IN ({marks(record_ids)}) "
        "AND +embedder = ? AND vec_rows > 0"
    )


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
        f"SELECT {SELECT}, bm25(records_fts, 1.0, 0.8, 0.3) AS s FROM records_fts "
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


_JULIAN_UNIX_EPOCH = 2440587.5


def prior_sql(config: RankerConfig, now: datetime) -> tuple[str, list[object]]:
    """``ranker.prior`` as an SQL expression over ``records r`` (with its parameters).

    The same formula, term for term, reading the emphasis count stored with each
    record, so the top records by prior come from SQLite without reading every
    record into Python. The contract suite holds it to ``ranker.prior``.
    """
    kinds = " ".join(f"WHEN '{kind}' THEN {value}" for kind, value in KIND_IMPORTANCE.items())
    importance = (
        f"COALESCE(r.importance, MIN(1.0, (CASE r.kind {kinds} ELSE 0.5 END) + 0.1 * r.emphasis))"
    )
    durable = ", ".join(f"'{kind}'" for kind in sorted(DURABLE_KINDS))
    age = "MAX(0.0, ? - julianday(r.created_at))"
    half_life = f"(CASE WHEN r.kind IN ({durable}) THEN ? ELSE ? END)"
    decay = f"exp(-0.6931471805599453 * {age} / {half_life})"
    recency = (
        f"(CASE WHEN r.pinned THEN 1.0 ELSE {RECENCY_FLOOR} + {1 - RECENCY_FLOOR} * {decay} END)"
    )
    signal = "(r.fold_count + r.access_count / 2.0)"
    reinforcement = f"(1.0 - 1.0 / (1.0 + {signal} / 3.0))"
    boost = f"({REINFORCEMENT_FLOOR} + {1 - REINFORCEMENT_FLOOR} * {reinforcement})"
    julian = now.timestamp() / 86400 + _JULIAN_UNIX_EPOCH
    params: list[object] = [julian, config.durable_half_life_days, config.half_life_days]
    return f"{importance} * {recency} * {boost}", params


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
