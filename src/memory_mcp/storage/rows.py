"""A record as a table row, and the ranker's prior as SQL over that row: one for every
SQL backend.

Both backends keep the same columns with the same text encodings (JSON text for
lists and maps, ISO-8601 UTC text for times), so that a record reads back
exactly as it was written, whichever store holds it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from memory_mcp.ranker import (
    DURABLE_KINDS,
    KIND_IMPORTANCE,
    RECENCY_FLOOR,
    REINFORCEMENT_FLOOR,
    RankerConfig,
)
from memory_mcp.records import Conflict, Corpus, MergedEntry, Record, derived
from memory_mcp.storage.base import Filters, RecordCount, TaskState

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
    """The record of a row that starts with ``COLUMNS`` (more columns may follow).

    A search reads a hundred or more rows: the empty lists and maps most records
    hold are not parsed as JSON (half of the cost of a row).
    """
    (
        record_id,
        corpus,
        kind,
        scope,
        scope_key,
        content,
        tags,
        importance,
        pinned,
        agent,
        created_at,
        updated_at,
        access_count,
        last_access_at,
        fold_count,
        merged_from,
        supersedes,
        replaced_by,
        embedder,
        meta,
        archived_at,
        archived_reason,
        user_name,
        private,
    ) = row[: len(COLUMNS)]
    return Record(
        id=record_id,
        corpus=corpus,
        kind=kind,
        scope=scope,
        scope_key=scope_key,
        content=content,
        tags=_json_list(tags),
        importance=importance,
        pinned=bool(pinned),
        agent=agent,
        created_at=created_at,
        updated_at=updated_at,
        access_count=access_count,
        last_access_at=last_access_at,
        fold_count=fold_count,
        merged_from=[MergedEntry.from_json(m) for m in _json_list(merged_from)],
        supersedes=_json_list(supersedes),
        replaced_by=replaced_by,
        embedder=embedder,
        meta={} if meta == "{}" else json.loads(meta),
        archived_at=archived_at,
        archived_reason=archived_reason,
        user=user_name,
        private=bool(private),
    )


def _json_list(text: str) -> list[Any]:
    return [] if text == "[]" else list(json.loads(text))


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
    # how a CTE read several times is kept: SQLite keeps one read twice or more on its
    # own, and its hint needs 3.35 (older system builds reject it)
    materialized: str = ""


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
    "MATERIALIZED",
)


# What the prior and the visibility rule read, after the worth in ``records_worth``: a
# list is walked by worth without reading its records' rows.
WORTH_COVERS = (
    "created_at, kind, pinned, importance, emphasis, fold_count, access_count, "
    "user_name, private, id"
)


def worth_sql(dialect: Dialect = SQLITE, table: str = "r.") -> str:
    """A record's prior without its recency: importance times reinforcement, as an SQL
    expression over ``records`` (columns prefixed by ``table``).

    It depends on the record alone, not on the time, so an index can hold it
    (``records_worth``), and as the recency is at most 1, no record's prior exceeds
    its worth: the top records by prior are among those worth at least the k-th
    best prior found (``top_by_prior``).
    """
    d, t = dialect, table
    kinds = " ".join(f"WHEN '{kind}' THEN {value}" for kind, value in KIND_IMPORTANCE.items())
    importance = (
        f"COALESCE({t}importance, {d.least}(1.0, (CASE {t}kind {kinds} ELSE 0.5 END) "
        f"+ 0.1 * {d.real.format(f'{t}emphasis')}))"
    )
    signal = f"({d.real.format(f'{t}fold_count')} + {d.real.format(f'{t}access_count')} / 2.0)"
    reinforcement = f"(1.0 - 1.0 / (1.0 + {signal} / 3.0))"
    boost = f"({REINFORCEMENT_FLOOR} + {1 - REINFORCEMENT_FLOOR} * {reinforcement})"
    return f"({importance} * {boost})"


def prior_sql(
    config: RankerConfig, now: datetime, dialect: Dialect = SQLITE
) -> tuple[str, list[object]]:
    """``ranker.prior`` as an SQL expression over ``records r`` (with its parameters):
    ``worth_sql`` times the recency.

    The same formula, term for term, reading the emphasis count stored with each
    record, so the top records by prior come from the database without reading
    every record into Python. The contract suite holds it to ``ranker.prior``.
    """
    d = dialect
    durable = ", ".join(f"'{kind}'" for kind in sorted(DURABLE_KINDS))
    age = f"{d.greatest}(0.0, {d.placeholder} - {d.days.format('r.created_at')})"
    half_life = f"(CASE WHEN r.kind IN ({durable}) THEN {d.placeholder} ELSE {d.placeholder} END)"
    decay = f"exp(-0.6931471805599453 * {age} / {half_life})"
    recency = (
        f"(CASE WHEN r.pinned <> 0 THEN 1.0 "
        f"ELSE {RECENCY_FLOOR} + {1 - RECENCY_FLOOR} * {decay} END)"
    )
    julian = now.timestamp() / 86400 + _JULIAN_UNIX_EPOCH
    params: list[object] = [julian, config.durable_half_life_days, config.half_life_days]
    return f"{worth_sql(d)} * {recency}", params


Fetch = Callable[[str, Sequence[Any]], Awaitable[list[Any]]]
"""Runs one read query and returns its rows."""


_DEEPER = 2  # how many times more records each round of ``top_by_prior`` reads in a list


async def top_by_prior(
    fetch: Fetch,
    filters_sql: Callable[[Filters], tuple[str, list[Any]]],
    dialect: Dialect,
    filters: Filters,
    ranking: RankerConfig,
    now: datetime,
    limit: int,
) -> list[tuple[Record, float]]:
    """Current records by ``ranker.prior`` (``prior_sql``), highest first, with it: the
    store's ``top_by_prior``, for either backend (its ``fetch`` and ``filters_sql``).

    Without computing every record's prior (150 ms over the 166,000 facts of a
    200,000-memory project): each list the filters name (scope and corpus) is read
    in the order of its records' worth (``worth_sql``, the ``records_worth``
    index), ``limit`` records first, then twice as many as the last round each
    round, until the worth where its reading stopped is below the ``limit``-th
    best prior read in any list: as no prior exceeds its record's worth, no
    record left unread can take a place.
    """
    if limit <= 0:
        return []
    order_sql, params = prior_sql(ranking, now, dialect)
    worth, mark = worth_sql(dialect), dialect.placeholder
    # One round of one list: its next ``?`` records by worth (after the first ``?``); of
    # those, the ``?`` best by prior, each with the last worth read and how many were read.
    walk = (
        f"WITH walk AS {dialect.materialized} (SELECT r.seq AS seq, r.id AS id, {worth} AS w, "
        f"{order_sql} AS o FROM records r WHERE r.scope_key = {mark} AND r.corpus = {mark} "
        f"AND {{where}} ORDER BY {worth} DESC "
        f"LIMIT {mark} OFFSET {mark}) "
        "SELECT seq, id, o, (SELECT min(w) FROM walk), (SELECT count(*) FROM walk) "
        f"FROM walk ORDER BY o DESC, id LIMIT {mark}"
    )
    best: dict[tuple[str, Corpus], list[tuple[float, str, int]]] = {}  # (prior, id, seq)
    # each list's next round: (records read before it, records it reads)
    rounds = {(k, c): (0, limit) for k in filters.scope_keys for c in filters.corpora}
    while rounds:
        stopped: dict[tuple[str, Corpus], float] = {}  # each list's last worth read
        for (key, corpus), (done, count) in rounds.items():
            one = replace(filters, scope_keys=(key,), corpora=(corpus,))
            where, where_params = filters_sql(one)
            # the list's own equalities too: Postgres walks the index only with them
            rows = await fetch(
                walk.format(where=where),
                [*params, key, corpus, *where_params, count, done, limit],
            )
            # by seq: a write between rounds (an access counted) can move a record
            # across the OFFSET, so that two rounds read it
            found = {row[2]: row for row in best.get((key, corpus), [])}
            found.update((int(seq), (float(o), str(rid), int(seq))) for seq, rid, o, _, _ in rows)
            best[(key, corpus)] = sorted(found.values(), key=lambda r: (-r[0], r[1]))[:limit]
            if rows and int(rows[0][4]) == count:  # else the list is read to its end
                stopped[(key, corpus)] = float(rows[0][3])
        priors = sorted((o for found in best.values() for o, _, _ in found), reverse=True)
        floor = priors[limit - 1] if len(priors) >= limit else -1.0
        rounds = {
            pair: (rounds[pair][0] + rounds[pair][1], rounds[pair][1] * _DEEPER)
            for pair, last in stopped.items()
            if last >= floor
        }
    top = sorted((row for found in best.values() for row in found), key=lambda r: (-r[0], r[1]))
    top = top[:limit]
    if not top:
        return []
    rows = await fetch(
        f"SELECT {SELECT}, r.seq FROM records r WHERE r.seq IN ({', '.join([mark] * len(top))})",
        [seq for _, _, seq in top],
    )
    by_seq = {int(row[-1]): record_of(row) for row in rows}
    return [(by_seq[seq], prior) for prior, _, seq in top if seq in by_seq]


async def record_counts(
    fetch: Fetch, filters_sql: Callable[[Filters], tuple[str, list[Any]]], filters: Filters
) -> list[RecordCount]:
    """The store's ``record_counts``, for either backend (its ``fetch`` and ``filters_sql``):
    one pass over the records the filters let through, grouped."""
    where, params = filters_sql(filters)
    rows = await fetch(
        "SELECT r.corpus, r.agent, substr(r.created_at, 1, 7), count(*), count(r.embedder) "
        f"FROM records r WHERE {where} GROUP BY r.corpus, r.agent, substr(r.created_at, 1, 7)",
        params,
    )
    return [RecordCount(str(c), str(a), str(m), int(n), int(e)) for c, a, m, n, e in rows]


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
