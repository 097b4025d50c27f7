"""The three searches (SPEC §2): ``memory_search``, ``project_search`` and
``searchUnifiedMemory``, over an engine.

Each checks its arguments, gathers candidates with ``fusion.candidates`` (one
branch, or one per corpus or source, concurrently, with one query vector),
fuses and ranks them once (``fusion.fuse``), notes on each hit the value it
supersedes and the open conflict it is in, and counts the hits as accesses.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import anyio

from memory_mcp import views
from memory_mcp.engine import Engine, SearchScope, check_scope
from memory_mcp.errors import InvalidInput
from memory_mcp.fusion import Candidates, candidates, fuse, read_around, shown, shown_record
from memory_mcp.overlap import alongside
from memory_mcp.records import (
    CORPORA,
    CORPUS_OF_KIND,
    Corpus,
    Hit,
    SearchResult,
    format_time,
    parse_time,
    without_surrogates,
)
from memory_mcp.storage.base import IVF_PROBES, Filters, Scored, Vector

log = logging.getLogger(__name__)

MAX_SEARCH_LIMIT = 50
# project_search: every corpus an agent or ingest writes for the project.
PROJECT_CORPORA: tuple[Corpus, ...] = ("facts", "journal", "docs", "knowledge")
# searchUnifiedMemory's sources and the corpora each one reads.
UNIFIED_SOURCES: dict[str, tuple[Corpus, ...]] = {
    "memory": ("facts", "journal", "docs"),
    "insights": ("insights",),
    "knowledge": ("knowledge",),
}
SOURCE_OF_CORPUS: dict[str, str] = {c: s for s, cs in UNIFIED_SOURCES.items() for c in cs}
UNIFIED_MAX_LIMIT = 20
UNIFIED_CONTENT_CAP = 1200


async def search(
    engine: Engine,
    query: str,
    *,
    scope: SearchScope = "all",
    cwd: str | Path | None = None,
    corpora: Sequence[Corpus] = ("facts",),
    kinds: Sequence[str] = (),
    tags: Sequence[str] = (),
    since: datetime | str | None = None,
    until: datetime | str | None = None,
    limit: int = 8,
    max_limit: int = MAX_SEARCH_LIMIT,
    now: datetime | None = None,
    count_access: bool = True,
    min_relevance: float | None = None,
    agents: Sequence[str] = (),
    keys: Sequence[str] | None = None,
) -> SearchResult:
    """Hybrid search, ranked by the one ranker; hits count as accesses.

    ``min_relevance`` overrides ``search.min_relevance`` (0: a full ranking,
    as a benchmark run needs). ``agents``: only what these agents wrote. ``keys``:
    the scope keys to read, instead of those ``scope`` and ``cwd`` name.

    Raises:
        InvalidInput: a bad argument (the message says what to change).
    """
    text = _query_text(query)
    _check_limit(limit, max_limit)
    for kind in kinds:
        if kind not in CORPUS_OF_KIND:
            raise InvalidInput(f"unknown kind {kind!r}; use one of: {', '.join(CORPUS_OF_KIND)}")
    for corpus in corpora:
        if corpus not in CORPORA:
            raise InvalidInput(f"unknown corpus {corpus!r}; use one of: {', '.join(CORPORA)}")
    if keys is None:
        check_scope(scope)  # before the model is asked
    if kinds:
        corpora = tuple(dict.fromkeys(CORPUS_OF_KIND[k] for k in kinds))
    after, before = time_window(since, until)

    async def scoped() -> Filters:
        return Filters(
            viewer=engine.user,
            scope_keys=tuple(keys) if keys is not None else await engine.scope_keys(scope, cwd),
            corpora=tuple(corpora),
            kinds=tuple(kinds),
            agents=tuple(a.strip() for a in agents if a.strip()),
            tags=tuple(without_surrogates(t).strip().casefold() for t in tags if t.strip()),
            since=after,
            until=before,
        )

    filters, lexical, (query_vector, identity, warnings), ahead = await _words_while_embedding(
        engine, text, scoped
    )
    at = now or engine.clock()
    found = await candidates(
        engine.store,
        text,
        query_vector,
        identity,
        filters,
        engine.plan,
        lexical=lexical,
        ahead=ahead,
        conflicts=True,
    )
    await read_around(engine.store, found, query_vector, identity, engine.plan)
    hits = fuse(
        found,
        dense=query_vector is not None,
        limit=limit,
        now=at,
        plan=engine.plan,
        min_relevance=min_relevance,
    )
    await _annotate(engine, hits, found)
    if count_access:
        _count_access(engine, hits, at)
    return SearchResult(hits=hits, mode=_mode(query_vector), warnings=warnings)


async def project_search(
    engine: Engine, query: str, *, cwd: str | Path | None = None, limit: int = 8
) -> SearchResult:
    """Search the project's facts, journal, docs and knowledge at once, ranked together.

    Each corpus is searched concurrently with one query vector; the hits are
    fused and ranked once (``fusion.fuse``), each labelled by its record's
    corpus. A corpus that fails adds a warning; the others still answer.

    Raises:
        InvalidInput: a bad argument (the message says what to change).
    """
    text = _query_text(query)
    _check_limit(limit, MAX_SEARCH_LIMIT)

    def branches(keys: tuple[str, ...]) -> list[tuple[str, Filters]]:
        return [
            (c, Filters(scope_keys=keys, corpora=(c,), viewer=engine.user)) for c in PROJECT_CORPORA
        ]

    query_vector, found, warnings = await _fan_out(engine, text, cwd, branches)
    at = engine.clock()
    hits = fuse(found, dense=query_vector is not None, limit=limit, now=at, plan=engine.plan)
    await _annotate(engine, hits, found)
    _count_access(engine, hits, at)
    return SearchResult(hits=hits, mode=_mode(query_vector), warnings=warnings)


async def unified_search(
    engine: Engine,
    query: str,
    *,
    sources: Sequence[str] | None = None,
    cwd: str | Path | None = None,
    limit: int = 8,
    threshold: float = 0.35,
) -> UnifiedResult:
    """The cross-source contract (SPEC §2, ``searchUnifiedMemory``).

    ``similarity`` is the one ranker's score of the fused relevance (``fusion``
    module), computed with one query vector and one BM25 scale over every
    source, so it compares across sources. Results at or above ``threshold``,
    sorted by similarity, then type, then id; content capped at
    ``UNIFIED_CONTENT_CAP`` characters.

    Raises:
        InvalidInput: a bad argument (the message says what to change).
    """
    text = _query_text(query)
    _check_limit(limit, UNIFIED_MAX_LIMIT)
    chosen = list(UNIFIED_SOURCES if sources is None else sources)
    for source in chosen:
        if source not in UNIFIED_SOURCES:
            raise InvalidInput(
                f"unknown source {source!r}; use any of: {', '.join(UNIFIED_SOURCES)}"
            )
    if not chosen:
        raise InvalidInput(
            f"sources is empty; leave it out for all, or name some of: {', '.join(UNIFIED_SOURCES)}"
        )
    if isinstance(threshold, bool) or not 0 <= threshold <= 1:
        raise InvalidInput(f"threshold must be a number from 0 to 1, got {threshold!r}")

    def branches(keys: tuple[str, ...]) -> list[tuple[str, Filters]]:
        return [
            (source, Filters(scope_keys=keys, corpora=UNIFIED_SOURCES[source], viewer=engine.user))
            for source in dict.fromkeys(chosen)
        ]

    query_vector, found, warnings = await _fan_out(engine, text, cwd, branches)
    at = engine.clock()
    hits = fuse(
        found,
        dense=query_vector is not None,
        limit=len(found.records),
        now=at,
        plan=engine.plan,
        min_relevance=0.0,
        redact=False,  # every candidate comes back: only those kept are shown
    )
    # At the threshold on its own text too: its neighbours and the feedback of
    # the best hits re-order results, they never make one (fusion.read_around).
    kept = [
        h
        for h in hits
        if round(h.score, 4) >= threshold
        and round(h.score if h.own_score is None else h.own_score, 4) >= threshold
    ]
    kept.sort(key=lambda h: (-round(h.score, 4), SOURCE_OF_CORPUS[h.record.corpus], h.record.id))
    kept = kept[:limit]
    await _annotate(engine, kept, found)
    _count_access(engine, kept, at)
    results = [_unified_item(shown(h) if engine.redacts else h) for h in kept]
    return UnifiedResult(results=results, warnings=warnings, mode=_mode(query_vector))


async def _words_while_embedding(
    engine: Engine, text: str, scoped: Callable[[], Awaitable[Filters]]
) -> tuple[Filters, list[Scored], tuple[Vector | None, str | None, list[str]], object | None]:
    """The search's filters (``scoped``: its scope keys read from the store) and the
    lexical branch's candidates, read while the model embeds the query
    (``_embed_query``): about 3 ms of a 16 ms search at 50,000 memories; and, if the
    lexical read is still going when the query's vector comes, the dense branch's
    ranking done meanwhile (``rank_ahead``, for ``candidates``).

    At 200,000 memories the lexical read ends after the embedding in two searches
    of three (by 0.4-3.8 ms p50, by query): ranking then took search p50 0.50-0.70
    ms down there, 0.02-0.32 at 50,000, 0.16-0.19 at 10,000 (``bench perf``'s
    searches in one process, with and without, alternating). Reading the scope's
    keys beside the model too, instead of before it, took 0.22 ms off at 200,000
    and 0.21 at 50,000 (p50 of 400 searches each, alternating).
    """
    known: list[Filters] = []
    scoped_done = anyio.Event()
    lexical_done = anyio.Event()

    async def words() -> list[Scored]:
        try:
            try:
                known.append(await scoped())
            finally:
                scoped_done.set()
            return await engine.store.lexical(text, known[0], engine.plan.candidates)
        finally:
            lexical_done.set()

    async def vector() -> tuple[tuple[Vector | None, str | None, list[str]], object | None]:
        embedded = await _embed_query(engine, text)
        query_vector, identity, _ = embedded
        if query_vector is None or identity is None:
            return embedded, None
        await scoped_done.wait()
        if not known or lexical_done.is_set():
            return embedded, None
        ahead = await engine.store.rank_ahead(query_vector, identity, known[0], IVF_PROBES)
        return embedded, ahead

    lexical, (embedded, ahead) = await alongside(words, vector)
    return known[0], lexical, embedded, ahead


async def _embed_query(engine: Engine, text: str) -> tuple[Vector | None, str | None, list[str]]:
    """The query's vector and its embedder, or None and why on the lexical floor.

    A search needs the model as a store does: the passages stores deferred wait for
    quiet after it too (``Engine.note_activity``). Searches right after a burst of 200
    stores at 50,000 memories waited for them: p50 26.2 ms, against 9.7 before it.
    """
    engine.note_activity()
    await engine.embeddings.settle()
    identity = engine.embeddings.identity
    vector = None
    if identity is not None:
        matrix = await engine.embeddings.embed([text])
        vector = matrix[0] if matrix is not None else None
    warnings: list[str] = []
    if vector is None:
        status = engine.embeddings.status()
        if status.degraded or status.state == "loading":
            warnings.append(f"lexical search only: {status.reason}")
    elif identity is not None and (waiting := await engine.awaiting_vectors(identity)):
        which = "1 record still awaits" if waiting == 1 else f"{waiting} records still await"
        warnings.append(
            f"{which} vectors from {identity}: until maintenance re-embeds them, they are "
            "found by their words only"
        )
    return vector, identity if vector is not None else None, warnings


async def _fan_out(
    engine: Engine,
    text: str,
    cwd: str | Path | None,
    branches: Callable[[tuple[str, ...]], list[tuple[str, Filters]]],
) -> tuple[Vector | None, Candidates, list[str]]:
    """Every branch's candidates (``branches`` of the project's and the global scope
    keys, read while the model embeds the query), gathered concurrently with one
    query vector.

    A branch that fails adds a warning naming it; the others still answer.
    """
    keys, (query_vector, identity, warnings) = await alongside(
        lambda: engine.scope_keys("all", cwd), lambda: _embed_query(engine, text)
    )
    found = Candidates()
    failures: list[str] = []

    async def gather(label: str, filters: Filters) -> None:
        try:
            part = await candidates(
                engine.store, text, query_vector, identity, filters, engine.plan, conflicts=True
            )
        except Exception as exc:  # one source failing must not sink the others
            log.warning("search branch %s failed: %s", label, exc, exc_info=True)
            failures.append(f"{label}: search failed ({exc}); the other sources answered")
            return
        found.update(part)

    async with anyio.create_task_group() as group:
        for label, filters in branches(keys):
            group.start_soon(gather, label, filters)
    await read_around(engine.store, found, query_vector, identity, engine.plan)
    return query_vector, found, [*warnings, *sorted(failures)]


async def _annotate(engine: Engine, hits: Sequence[Hit], found: Candidates) -> None:
    """Note on each hit the older value it supersedes and the open conflict it is in
    (read with the candidates where the store could: ``Candidates.open_conflicts``).

    A reader must not take a replaced value for the current one, nor act on
    one side of a contradiction without seeing the other.
    """
    if not hits:
        return
    ids = [h.record.id for h in hits]
    conflicts = found.open_conflicts(ids)
    if conflicts is None:
        conflicts = await engine.store.open_conflicts_of(ids)
    older = {h.record.id: h.record.supersedes[-1] for h in hits if h.record.supersedes}
    sides = {i for c in conflicts for i in (c.record_id, c.other_id)}
    read = await engine.store.get_many([*older.values(), *sides])
    if engine.redacts:  # the other record's text is shown too
        read = [shown_record(record) for record in read]
    related = {r.id: r for r in read}
    for hit in hits:
        replaced = related.get(older.get(hit.record.id, ""))
        if replaced is not None:
            hit.notes["supersedes"] = views.related(replaced)
        for conflict in conflicts:
            if hit.record.id not in (conflict.record_id, conflict.other_id):
                continue
            other_id = (
                conflict.other_id if conflict.record_id == hit.record.id else conflict.record_id
            )
            other = related.get(other_id)
            hit.notes["conflict"] = {
                "id": conflict.id,
                "with": views.related(other) if other else {"id": other_id},
            }
            break


def _count_access(engine: Engine, hits: Sequence[Hit], at: datetime) -> None:
    """Count the hits as accesses, after the answer (``Engine.count_access``)."""
    engine.count_access([h.record.id for h in hits], format_time(at))


@dataclass
class UnifiedItem:
    """One ``searchUnifiedMemory`` result."""

    type: str  # the source: memory, insights or knowledge
    id: str
    content: str
    similarity: float
    metadata: dict[str, Any]


@dataclass
class UnifiedResult:
    results: list[UnifiedItem]
    warnings: list[str]
    mode: Literal["hybrid", "lexical"]


def _unified_item(hit: Hit) -> UnifiedItem:
    record = hit.record
    content = record.content
    if len(content) > UNIFIED_CONTENT_CAP:
        content = content[: UNIFIED_CONTENT_CAP - 1] + "…"
    metadata: dict[str, Any] = {
        "corpus": record.corpus,
        "kind": record.kind,
        "scope": record.scope,
        "agent": record.agent,
        "created_at": record.created_at,
        "relevance": round(hit.relevance, 4),
    }
    if record.tags:
        metadata["tags"] = list(record.tags)
    for key in ("path", "heading", "sources"):
        if key in record.meta:
            metadata[key] = record.meta[key]
    metadata.update(hit.notes)
    return UnifiedItem(
        type=SOURCE_OF_CORPUS[record.corpus],
        id=record.id,
        content=content,
        similarity=round(hit.score, 4),
        metadata=metadata,
    )


def _query_text(query: object) -> str:
    text = without_surrogates(query).strip() if isinstance(query, str) else ""
    if not text:
        raise InvalidInput("query is empty; pass words to search for")
    return text


def _check_limit(limit: int, most: int) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= most:
        raise InvalidInput(f"limit must be a whole number from 1 to {most}, got {limit!r}")


def _mode(query_vector: Vector | None) -> Literal["hybrid", "lexical"]:
    return "hybrid" if query_vector is not None else "lexical"


def time_window(
    since: datetime | str | None, until: datetime | str | None
) -> tuple[str | None, str | None]:
    """``[since, until)`` as stored times compare (None: no bound on that side). An
    ``until`` that is a date takes in that whole day (the window ends where the next
    day begins, UTC): "until 2026-01-31" means through the 31st, as people say it.

    Raises:
        InvalidInput: a bound is not a date or time, or ``since`` is not before ``until``.
    """
    after, before = time_bound(since, "since"), time_bound(until, "until")
    if before is not None and isinstance(until, str) and _is_date(until):
        before = format_time(parse_time(before) + timedelta(days=1))
    if after is not None and before is not None and after >= before:
        raise InvalidInput(
            f"since ({since}) is not before until ({until}): nothing can match; "
            "swap them or leave one out"
        )
    return after, before


def _is_date(value: str) -> bool:
    """Whether ``value`` names a day (``2026-01-31``), not a time."""
    try:
        date.fromisoformat(value.strip())
    except ValueError:
        return False
    return True


def time_bound(value: datetime | str | None, name: str) -> str | None:
    """A ``since``/``until`` bound as stored times compare (None: no bound).

    Raises:
        InvalidInput: it is not a date or time.
    """
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return format_time(value)
    try:
        return format_time(parse_time(value))
    except ValueError:
        raise InvalidInput(
            f"{name} must be an ISO-8601 date or time (e.g. 2026-01-31), got {value!r}"
        ) from None
