"""A record as a table row, and the ranker's prior as SQL over that row: one for every
SQL backend.

Both backends keep the same columns with the same text encodings (JSON text for
lists and maps, ISO-8601 UTC text for times), so that a record reads back
exactly as it was written, whichever store holds it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from memory_mcp.ranker import (
    DURABLE_KINDS,
    KIND_IMPORTANCE,
    RECENCY_FLOOR,
    REINFORCEMENT_FLOOR,
    RankerConfig,
)
from memory_mcp.records import Conflict, MergedEntry, Record, derived
from memory_mcp.storage.base import TaskState

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
    "user_name",
    "private",
)
SELECT = ", ".join(f"r.{c}" for c in COLUMNS)
# The columns ``record_params`` fills, in its order (derived ones included).
INSERT_COLUMNS = (
    "id, corpus, kind, scope, scope_key, content, content_hash, tags, importance, pinned, "
    "agent, created_at, updated_at, access_count, last_access_at, fold_count, merged_from, "
    "merged_text, supersedes, replaced_by, embedder, meta, archived_at, archived_reason, emphasis, "
    "user_name, private"
)
INSERT_WIDTH = 27
# Who may read a record (``records.visible_to``; ``%s``: the reader): its writer, anyone
# for a record written before writers were recorded, and, for a shared record of a
# project, everyone. Postgres's row-level security says the same (``postgres.team``).
VISIBLE = "(r.user_name IN (%s, '') OR (r.scope_key <> '' AND r.private = 0))"


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
        user=values["user_name"],
        private=bool(values["private"]),
    )


def tags_json(record: Record) -> str:
    return json.dumps(record.tags, ensure_ascii=False)


def merged_json(record: Record) -> str:
    return json.dumps([m.to_json() for m in record.merged_from], ensure_ascii=False)


def meta_json(record: Record) -> str:
    return json.dumps(record.meta, ensure_ascii=False)


def record_params(record: Record) -> tuple[Any, ...]:
    """The values of ``INSERT_COLUMNS`` for ``record``."""
    columns = derived(record)
    return (
        record.id,
        record.corpus,
        record.kind,
        record.scope,
        record.scope_key,
        record.content,
        columns.content_hash,
        tags_json(record),
        record.importance,
        int(record.pinned),
        record.agent,
        record.created_at,
        record.updated_at,
        record.access_count,
        record.last_access_at,
        record.fold_count,
        merged_json(record),
        columns.merged_text,
        json.dumps(record.supersedes),
        record.replaced_by,
        record.embedder,
        meta_json(record),
        record.archived_at,
        record.archived_reason,
        columns.emphasis,
        record.user,
        int(record.private),
    )


@dataclass(frozen=True)
class Dialect:
    """What differs between the SQL backends in the prior's expression."""

    least: str  # the smaller of two values
    greatest: str  # the larger of two values
    days: str  # a time column (``{}``) as fractional days since any fixed epoch
    placeholder: str  # a query parameter
    real: str = "{}"  # an integer column (``{}``) as a floating-point number


_JULIAN_UNIX_EPOCH = 2440587.5
SQLITE = Dialect("MIN", "MAX", "julianday({})", "?")
# In float8 throughout, as SQLite and ``ranker.prior`` compute: extract() and
# integer / 2.0 give numeric, whose divisions made the brief's prior over 13,000
# records cost 50 ms.
POSTGRES = Dialect(
    "LEAST",
    "GREATEST",
    f"(date_part('epoch', ({{}})::timestamptz) / 86400.0 + {_JULIAN_UNIX_EPOCH})",
    "%s",
    "({}::float8)",
)


def prior_sql(
    config: RankerConfig, now: datetime, dialect: Dialect = SQLITE
) -> tuple[str, list[object]]:
    """``ranker.prior`` as an SQL expression over ``records r`` (with its parameters).

    The same formula, term for term, reading the emphasis count stored with each
    record, so the top records by prior come from the database without reading
    every record into Python. The contract suite holds it to ``ranker.prior``.
    """
    d = dialect
    kinds = " ".join(f"WHEN '{kind}' THEN {value}" for kind, value in KIND_IMPORTANCE.items())
    importance = (
        f"COALESCE(r.importance, {d.least}(1.0, (CASE r.kind {kinds} ELSE 0.5 END) "
        f"+ 0.1 * {d.real.format('r.emphasis')}))"
    )
    durable = ", ".join(f"'{kind}'" for kind in sorted(DURABLE_KINDS))
    age = f"{d.greatest}(0.0, {d.placeholder} - {d.days.format('r.created_at')})"
    half_life = f"(CASE WHEN r.kind IN ({durable}) THEN {d.placeholder} ELSE {d.placeholder} END)"
    decay = f"exp(-0.6931471805599453 * {age} / {half_life})"
    recency = (
        f"(CASE WHEN r.pinned <> 0 THEN 1.0 "
        f"ELSE {RECENCY_FLOOR} + {1 - RECENCY_FLOOR} * {decay} END)"
    )
    signal = f"({d.real.format('r.fold_count')} + {d.real.format('r.access_count')} / 2.0)"
    reinforcement = f"(1.0 - 1.0 / (1.0 + {signal} / 3.0))"
    boost = f"({REINFORCEMENT_FLOOR} + {1 - REINFORCEMENT_FLOOR} * {reinforcement})"
    julian = now.timestamp() / 86400 + _JULIAN_UNIX_EPOCH
    params: list[object] = [julian, config.durable_half_life_days, config.half_life_days]
    return f"{importance} * {recency} * {boost}", params


# The parameters of the updates both backends make, in their statements' order.


def merged_params(record: Record, at: str) -> list[Any]:
    """A fold into a current record: merged_from, merged_text, fold_count, access_count,
    last_access_at, supersedes, pinned, tags, importance, meta, updated_at, id."""
    return [
        merged_json(record),
        derived(record).merged_text,
        record.fold_count,
        record.access_count,
        record.last_access_at,
        json.dumps(record.supersedes),
        int(record.pinned),
        tags_json(record),
        record.importance,
        meta_json(record),
        at,
        record.id,
    ]


def content_params(record: Record, at: str) -> list[Any]:
    """A refined text: content, content_hash, emphasis, meta, updated_at, id."""
    columns = derived(record)
    return [
        record.content,
        columns.content_hash,
        columns.emphasis,
        meta_json(record),
        at,
        record.id,
    ]


def texts_params(record: Record) -> list[Any]:
    """Rewritten texts: content, content_hash, emphasis, merged_from, merged_text, meta, id."""
    columns = derived(record)
    return [
        record.content,
        columns.content_hash,
        columns.emphasis,
        merged_json(record),
        columns.merged_text,
        meta_json(record),
        record.id,
    ]


def conflict_params(conflict: Conflict) -> list[Any]:
    """An imported conflict: scope_key, record_id, other_id, reason, created_at,
    resolved_at, resolution."""
    return [
        conflict.scope_key,
        conflict.record_id,
        conflict.other_id,
        conflict.reason,
        conflict.created_at,
        conflict.resolved_at,
        conflict.resolution,
    ]


TASK_COLUMNS = (
    "task, holder, lease_until, last_started_at, last_finished_at, last_summary, "
    "last_error, failures, retry_after, cursor"
)


def task_of(row: Sequence[Any]) -> TaskState:
    """A ``maintenance`` row (``TASK_COLUMNS``) as a task's state."""
    return TaskState(
        task=str(row[0]),
        holder=row[1],
        lease_until=row[2],
        last_started_at=row[3],
        last_finished_at=row[4],
        last_summary=json.loads(row[5]),
        last_error=row[6],
        failures=int(row[7]),
        retry_after=row[8],
        cursor=json.loads(row[9]),
    )


def finish_params(state: TaskState, holder: str) -> list[Any]:
    """A task's finished run: last_started_at, last_finished_at, last_summary, last_error,
    failures, retry_after, cursor, task, holder."""
    return [
        state.last_started_at,
        state.last_finished_at,
        json.dumps(state.last_summary),
        state.last_error,
        state.failures,
        state.retry_after,
        json.dumps(state.cursor),
        state.task,
        holder,
    ]
