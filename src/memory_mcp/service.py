"""The engine's one entry point: ``MemoryService``.

The CLI and the MCP server each parse input, call one method here and format
the result. Nothing in this package imports ``mcp`` or ``typer``.

    async with MemoryService.open(settings) as memory:
        result = await memory.store("We deploy with GitHub Actions to Fly.io", cwd=path)
        hits = await memory.search("how do we deploy", cwd=path)
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import anyio

from memory_mcp import ranker
from memory_mcp.config import LoadedSettings, Settings
from memory_mcp.embedders.base import Embedder
from memory_mcp.embedders.runtime import EmbedderStatus, Embeddings
from memory_mcp.errors import EmbedderError, InvalidInput, NotFound, StorageError
from memory_mcp.passages import record_passages
from memory_mcp.records import (
    CORPORA,
    CORPUS_OF_KIND,
    Corpus,
    Hit,
    Record,
    SearchResult,
    StoreResult,
    format_time,
    parse_time,
    utcnow,
    without_surrogates,
)
from memory_mcp.scope import GLOBAL_KEY, Scope, project_scope
from memory_mcp.search import (
    Candidates,
    SearchPlan,
    candidates,
    fuse,
    read_around,
    shown,
    shown_record,
)
from memory_mcp.storage.base import Filters, Store, StoreStats, TaskState, Vector
from memory_mcp.storage.factory import open_store
from memory_mcp.write import Draft, apply, clean_text, prepare

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
SearchScope = Literal["project", "global", "all"]
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
_COMMIT_BATCH = 64
_AWAITING_TTL_S = 30.0


@dataclass
class StoreRequest:
    """One write, as given to ``store_many``."""

    content: str
    kind: str = "fact"
    scope: Literal["project", "global"] = "project"
    cwd: str | Path | None = None
    importance: float | None = None
    tags: Sequence[str] = ()
    agent: str = "cli"
    created_at: datetime | None = None
    pinned: bool = False


@dataclass(frozen=True)
class ReembedSummary:
    embedder: str
    embedded: int
    remaining: int


@dataclass
class Status:
    """What ``memory-mcp status`` shows."""

    backend: str  # which storage backend (sqlite)
    database: str  # where: its file, or its URL without credentials
    database_bytes: int
    driver: str  # how the backend runs
    vectors: bool
    embedder: EmbedderStatus
    awaiting_embedding: int
    stats: StoreStats
    settings_sources: list[str] = field(default_factory=list)
    tasks: dict[str, TaskState] = field(default_factory=dict)  # maintenance, by task


class MemoryService:
    """Store, fold, search and rank memories."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        embeddings: Embeddings,
        *,
        clock: Clock = utcnow,
        sources: Sequence[str] = (),
    ) -> None:
        self.settings = settings
        self.db = store
        self.embeddings = embeddings
        self.clock = clock
        self.sources = list(sources)
        self._awaiting: tuple[float, int] = (-_AWAITING_TTL_S * 2, 0)
        self._plan = SearchPlan(
            candidates=settings.search.candidates,
            lexical_weight=settings.search.lexical_weight,
            min_relevance=settings.search.min_relevance,
            context_seconds=settings.search.context_minutes * 60,
            feedback_weight=settings.search.feedback_weight,
            ranking=ranker.RankerConfig(
                half_life_days=settings.ranking.half_life_days,
                durable_half_life_days=settings.ranking.durable_half_life_days,
                prior_weight=settings.ranking.prior_weight,
            ),
            redact=settings.write.secrets != "off",
        )

    @property
    def ranking(self) -> ranker.RankerConfig:
        """The one ranker's settings (half-life, prior weight)."""
        return self._plan.ranking

    @property
    def redacts(self) -> bool:
        """Whether what is shown goes through the current secret rules (``write.secrets``
        not off): search hits, the records they name, the brief."""
        return self._plan.redact

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        settings: Settings | LoadedSettings,
        *,
        database: Path | None = None,
        embedder: Embedder | None = None,
        clock: Clock = utcnow,
        wait_for_embedder: float = 0.0,
        load_embedder: bool = True,
        probe_network: bool = False,
    ) -> AsyncIterator[MemoryService]:
        """Open the store and start the embedder (loading in the background).

        Args:
            settings: the settings (or loaded settings with their sources).
            database: overrides the database path of the settings.
            embedder: use this embedder instead of the configured ones (tests).
            clock: the time source.
            wait_for_embedder: seconds to wait for the embedder's first load attempt.
            load_embedder: False finds the model without loading it (work that
                embeds nothing, such as ``status``).
            probe_network: with ``load_embedder`` False, also check whether a model
                that is not here could be downloaded (``status``).
        """
        sources: list[str] = []
        if isinstance(settings, LoadedSettings):
            sources = settings.sources
            settings = settings.settings
        store = await open_store(settings, database=database, clock=clock)
        try:
            embeddings = Embeddings(
                settings.embedder,
                candidates=[embedder] if embedder is not None else None,
            )
            if store.vectors_available:
                embeddings.start(
                    await store.dense_embedders(), load=load_embedder, probe=probe_network
                )
            else:
                embeddings.start({}, load=load_embedder, probe=probe_network)
                if embedder is None:
                    log.warning("vectors are off: %s", store.details)
            if wait_for_embedder > 0:
                await embeddings.wait_settled(wait_for_embedder)
            yield cls(settings, store, embeddings, clock=clock, sources=sources)
        finally:
            await store.close()

    # Writes --------------------------------------------------------------------------

    async def store(
        self,
        content: str,
        *,
        kind: str = "fact",
        scope: Literal["project", "global"] = "project",
        cwd: str | Path | None = None,
        importance: float | None = None,
        tags: Sequence[str] = (),
        agent: str = "cli",
        created_at: datetime | None = None,
        pinned: bool = False,
    ) -> StoreResult:
        """Store one memory through the write pipeline (fold / supersede / conflict / insert).

        Raises:
            InvalidInput: a bad argument (the message says what to change).
        """
        request = StoreRequest(
            content, kind, scope, cwd, importance, tags, agent, created_at, pinned
        )
        return (await self.store_many([request]))[0]

    async def store_many(
        self,
        requests: Sequence[StoreRequest],
        *,
        progress: Callable[[int], None] | None = None,
    ) -> list[StoreResult]:
        """Store several memories in order, embedding them in length-sorted batches.

        Each write is decided against everything stored before it, earlier items
        of the same call included. Validation happens first, for all of them:
        one bad item fails the call before anything is written.

        Raises:
            InvalidInput: an item is unusable (nothing was written).
        """
        results = await self._store_drafts(
            [self._draft(request, self.clock()) for request in requests], progress
        )
        return [r for r in results if isinstance(r, StoreResult)]

    async def store_valid(
        self,
        requests: Sequence[StoreRequest],
        *,
        progress: Callable[[int], None] | None = None,
    ) -> list[StoreResult | InvalidInput]:
        """Like ``store_many``, but an unusable item is skipped: its place holds the error."""
        drafts: list[Draft | InvalidInput] = []
        now = self.clock()
        for request in requests:
            try:
                drafts.append(self._draft(request, now))
            except InvalidInput as exc:
                drafts.append(exc)
        return await self._store_drafts(drafts, progress)

    async def _store_drafts(
        self,
        items: Sequence[Draft | InvalidInput],
        progress: Callable[[int], None] | None,
    ) -> list[StoreResult | InvalidInput]:
        drafts = [d for d in items if isinstance(d, Draft)]
        vectors = await self._embed_records([d.record.content for d in drafts])
        vector_of = dict(zip((id(d) for d in drafts), vectors or [], strict=False))
        identity = self.embeddings.identity if vectors is not None else None
        if identity is not None:  # load the scopes' vectors before taking the write lock
            await self.db.load_vectors(identity, {d.record.scope_key for d in drafts})
        stamp = format_time(self.clock())
        results: list[StoreResult | InvalidInput] = []
        for start in range(0, len(items), _COMMIT_BATCH):
            batch = items[start : start + _COMMIT_BATCH]
            async with self.db.write() as tx:
                for item in batch:
                    if isinstance(item, InvalidInput):
                        results.append(item)
                        continue
                    results.append(
                        await apply(
                            tx,
                            item,
                            vector_of.get(id(item)),
                            embedder=identity,
                            fold_settings=self.settings.fold,
                            now=stamp,
                        )
                    )
            if progress is not None:
                progress(len(batch))
        return results

    def _draft(self, request: StoreRequest, now: datetime) -> Draft:
        if request.scope not in ("project", "global"):
            raise InvalidInput(f"scope must be 'project' or 'global', got {request.scope!r}")
        scope = Scope.global_() if request.scope == "global" else project_scope(request.cwd)
        return prepare(
            request.content,
            kind=request.kind,
            scope=scope,
            importance=request.importance,
            tags=request.tags,
            agent=request.agent,
            at=request.created_at or now,
            pinned=request.pinned,
            settings=self.settings.write,
        )

    async def _embed_records(
        self, texts: Sequence[str], *, merged: Sequence[Sequence[str]] = ()
    ) -> list[Vector] | None:
        """Passage vectors per record (its whole text first), or None on the lexical floor.

        Args:
            texts: each record's content.
            merged: each record's folded texts (their passages follow its own).
        """
        if not texts:
            return None
        await self.embeddings.settle()
        if self.embeddings.identity is None or not self.embeddings.ready:
            return None
        folded = list(merged) or [[] for _ in texts]
        passages = [
            record_passages(text, list(extra)) for text, extra in zip(texts, folded, strict=True)
        ]
        flat = [p for group in passages for p in group]
        matrix = await self.embeddings.embed(flat)
        if matrix is None:
            return None
        import numpy as np

        out: list[Vector] = []
        offset = 0
        for group in passages:
            out.append(np.asarray(matrix[offset : offset + len(group)], dtype=np.float32))
            offset += len(group)
        return out

    async def forget(
        self,
        record_id: str,
        *,
        reason: str = "forgotten",
        cwd: str | Path | None = None,
        anywhere: bool = True,
    ) -> Record:
        """Archive a record (reversible until the purge's grace window ends).

        Args:
            anywhere: False limits it to records of ``cwd``'s project and the global
                scope (what an agent may touch); the operator's CLI may archive any.

        Raises:
            NotFound: no record has that id (in reach).
            InvalidInput: the record is already archived, or no reason is given.
        """
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidInput("reason is empty; say why the memory no longer holds")
        if not isinstance(record_id, str) or not record_id.strip():
            raise InvalidInput("id is empty; pass the id of the memory to forget")
        record = await self.db.get(without_surrogates(record_id.strip()))
        if (
            record is not None
            and not anywhere
            and record.scope_key not in self.scope_keys("all", cwd)
        ):
            record = None
        if record is None:
            where = "" if anywhere else " in this project or the global scope"
            raise NotFound(f"no record with id {record_id!r}{where}")
        if record.archived_at is not None:
            raise InvalidInput(f"record {record_id} is already archived ({record.archived_reason})")
        async with self.db.write() as tx:
            await tx.archive(record.id, clean_text(reason), format_time(self.clock()))
        archived = await self.db.get(record.id)
        assert archived is not None
        return archived

    async def warm_up(self, cwd: str | Path | None = None) -> None:
        """Load the project's and the global scope's vectors into memory ahead of use.

        A server calls this in the background at start, once its embedder has
        settled, so that its first search or store does not pay for the load
        (0.35 s at 50,000 memories). Failures are logged, never raised.
        """
        try:
            await self.embeddings.wait_settled(120)
            identity = self.embeddings.identity
            if identity is not None:
                await self.db.load_vectors(identity, self.scope_keys("all", cwd))
        except Exception:
            log.warning("could not load the vectors ahead of use", exc_info=True)

    # Reads ---------------------------------------------------------------------------

    def scope_keys(self, scope: SearchScope, cwd: str | Path | None) -> tuple[str, ...]:
        """The scope keys a search reads: the project's, the global one, or both."""
        if scope == "global":
            return (GLOBAL_KEY,)
        if scope not in ("project", "all"):
            raise InvalidInput(f"scope must be 'project', 'global' or 'all', got {scope!r}")
        project = project_scope(cwd).key
        return (project,) if scope == "project" else (project, GLOBAL_KEY)

    async def search(
        self,
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
    ) -> SearchResult:
        """Hybrid search, ranked by the one ranker; hits count as accesses.

        ``min_relevance`` overrides ``search.min_relevance`` (0: a full ranking,
        as a benchmark run needs).

        Raises:
            InvalidInput: a bad argument (the message says what to change).
        """
        text = _query_text(query)
        _check_limit(limit, max_limit)
        for kind in kinds:
            if kind not in CORPUS_OF_KIND:
                raise InvalidInput(
                    f"unknown kind {kind!r}; use one of: {', '.join(CORPUS_OF_KIND)}"
                )
        for corpus in corpora:
            if corpus not in CORPORA:
                raise InvalidInput(f"unknown corpus {corpus!r}; use one of: {', '.join(CORPORA)}")
        if kinds:
            corpora = tuple(dict.fromkeys(CORPUS_OF_KIND[k] for k in kinds))
        after, before = _time_bound(since, "since"), _time_bound(until, "until")
        if after is not None and before is not None and after >= before:
            raise InvalidInput(
                f"since ({since}) is not before until ({until}): nothing can match; "
                "swap them or leave one out"
            )
        filters = Filters(
            scope_keys=self.scope_keys(scope, cwd),
            corpora=tuple(corpora),
            kinds=tuple(kinds),
            tags=tuple(without_surrogates(t).strip().casefold() for t in tags if t.strip()),
            since=after,
            until=before,
        )
        query_vector, identity, warnings = await self._embed_query(text)
        at = now or self.clock()
        found = await candidates(self.db, text, query_vector, identity, filters, self._plan)
        await read_around(self.db, found, query_vector, identity, self._plan)
        hits = fuse(
            found,
            dense=query_vector is not None,
            limit=limit,
            now=at,
            plan=self._plan,
            min_relevance=min_relevance,
        )
        await self._annotate(hits)
        if count_access:
            await self._count_access(hits, at)
        return SearchResult(hits=hits, mode=_mode(query_vector), warnings=warnings)

    async def project_search(
        self, query: str, *, cwd: str | Path | None = None, limit: int = 8
    ) -> SearchResult:
        """Search the project's facts, journal, docs and knowledge at once, ranked together.

        Each corpus is searched concurrently with one query vector; the hits are
        fused and ranked once (``search.fuse``), each labelled by its record's
        corpus. A corpus that fails adds a warning; the others still answer.

        Raises:
            InvalidInput: a bad argument (the message says what to change).
        """
        text = _query_text(query)
        _check_limit(limit, MAX_SEARCH_LIMIT)
        keys = self.scope_keys("all", cwd)
        branches = [(c, Filters(scope_keys=keys, corpora=(c,))) for c in PROJECT_CORPORA]
        query_vector, found, warnings = await self._fan_out(text, branches)
        at = self.clock()
        hits = fuse(found, dense=query_vector is not None, limit=limit, now=at, plan=self._plan)
        await self._annotate(hits)
        await self._count_access(hits, at)
        return SearchResult(hits=hits, mode=_mode(query_vector), warnings=warnings)

    async def unified_search(
        self,
        query: str,
        *,
        sources: Sequence[str] | None = None,
        cwd: str | Path | None = None,
        limit: int = 8,
        threshold: float = 0.35,
    ) -> UnifiedResult:
        """The cross-source contract (SPEC §2, ``searchUnifiedMemory``).

        ``similarity`` is the one ranker's score of the fused relevance (``search``
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
                f"sources is empty; leave it out for all, or name some of: "
                f"{', '.join(UNIFIED_SOURCES)}"
            )
        if isinstance(threshold, bool) or not 0 <= threshold <= 1:
            raise InvalidInput(f"threshold must be a number from 0 to 1, got {threshold!r}")
        keys = self.scope_keys("all", cwd)
        branches = [
            (source, Filters(scope_keys=keys, corpora=UNIFIED_SOURCES[source]))
            for source in dict.fromkeys(chosen)
        ]
        query_vector, found, warnings = await self._fan_out(text, branches)
        at = self.clock()
        hits = fuse(
            found,
            dense=query_vector is not None,
            limit=len(found.records),
            now=at,
            plan=self._plan,
            min_relevance=0.0,
            redact=False,  # every candidate comes back: only those kept are shown
        )
        # At the threshold on its own text too: its neighbours and the feedback of
        # the best hits re-order results, they never make one (search.read_around).
        kept = [
            h
            for h in hits
            if round(h.score, 4) >= threshold
            and round(h.score if h.own_score is None else h.own_score, 4) >= threshold
        ]
        kept.sort(
            key=lambda h: (-round(h.score, 4), SOURCE_OF_CORPUS[h.record.corpus], h.record.id)
        )
        kept = kept[:limit]
        await self._annotate(kept)
        await self._count_access(kept, at)
        results = [_unified_item(shown(h) if self.redacts else h) for h in kept]
        return UnifiedResult(results=results, warnings=warnings, mode=_mode(query_vector))

    async def _embed_query(self, text: str) -> tuple[Vector | None, str | None, list[str]]:
        """The query's vector and its embedder, or None and why on the lexical floor."""
        await self.embeddings.settle()
        identity = self.embeddings.identity
        vector = None
        if identity is not None:
            matrix = await self.embeddings.embed([text])
            vector = matrix[0] if matrix is not None else None
        warnings: list[str] = []
        if vector is None:
            status = self.embeddings.status()
            if status.degraded or status.state == "loading":
                warnings.append(f"lexical search only: {status.reason}")
        elif identity is not None and (waiting := await self._awaiting_vectors(identity)):
            which = "1 record still awaits" if waiting == 1 else f"{waiting} records still await"
            warnings.append(
                f"{which} vectors from {identity}: until maintenance re-embeds them, they are "
                "found by their words only"
            )
        return vector, identity if vector is not None else None, warnings

    async def _awaiting_vectors(self, identity: str) -> int:
        """How many current records lack vectors from ``identity`` (counted every 30 s)."""
        at, count = self._awaiting
        if time.monotonic() - at > _AWAITING_TTL_S:
            count = await self.db.count_needing_embedding(identity)
            self._awaiting = (time.monotonic(), count)
        return count

    async def _fan_out(
        self, text: str, branches: Sequence[tuple[str, Filters]]
    ) -> tuple[Vector | None, Candidates, list[str]]:
        """Every branch's candidates, gathered concurrently with one query vector.

        A branch that fails adds a warning naming it; the others still answer.
        """
        query_vector, identity, warnings = await self._embed_query(text)
        found = Candidates()
        failures: list[str] = []

        async def gather(label: str, filters: Filters) -> None:
            try:
                part = await candidates(self.db, text, query_vector, identity, filters, self._plan)
            except Exception as exc:  # one source failing must not sink the others
                log.warning("search branch %s failed: %s", label, exc, exc_info=True)
                failures.append(f"{label}: search failed ({exc}); the other sources answered")
                return
            found.update(part)

        async with anyio.create_task_group() as group:
            for label, filters in branches:
                group.start_soon(gather, label, filters)
        await read_around(self.db, found, query_vector, identity, self._plan)
        return query_vector, found, [*warnings, *sorted(failures)]

    async def _annotate(self, hits: Sequence[Hit]) -> None:
        """Note on each hit the older value it supersedes and the open conflict it is in.

        A reader must not take a replaced value for the current one, nor act on
        one side of a contradiction without seeing the other.
        """
        if not hits:
            return
        from memory_mcp import views

        conflicts = await self.db.open_conflicts_of([h.record.id for h in hits])
        older = {h.record.id: h.record.supersedes[-1] for h in hits if h.record.supersedes}
        sides = {i for c in conflicts for i in (c.record_id, c.other_id)}
        found = await self.db.get_many([*older.values(), *sides])
        if self.redacts:  # the other record's text is shown too
            found = [shown_record(record) for record in found]
        related = {r.id: r for r in found}
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

    async def _count_access(self, hits: Sequence[Hit], at: datetime) -> None:
        """Count hits as accesses; a store that cannot be written (read-only, full,
        busy) loses the count, not the search."""
        if not hits:
            return
        try:
            await self.db.record_access([h.record.id for h in hits], format_time(at))
        except StorageError as exc:
            log.warning("search hits were not counted: %s", exc)

    async def reembed(
        self,
        *,
        batch_size: int = 64,
        progress: Callable[[int, int], None] | None = None,
        most: int | None = None,
    ) -> ReembedSummary:
        """Give every current record a vector from the active embedder.

        Batched and resumable: each batch commits on its own, and a record done
        is no longer "awaiting", so an interrupted run continues where it stopped.

        Args:
            batch_size: records per batch (and per transaction).
            progress: called with (records done so far, records to do).
            most: stop after about this many records (maintenance renews its lease
                between such rounds).

        Raises:
            EmbedderError: no dense embedder is ready.
        """
        await self.embeddings.settle()
        identity = self.embeddings.identity
        if identity is None or not self.embeddings.ready:
            raise EmbedderError(
                f"no embedder is ready to re-embed with: {self.embeddings.status().reason}"
            )
        total = await self.db.count_needing_embedding(identity)
        done = 0
        seen: set[str] = set()
        while most is None or len(seen) < most:
            records = await self.db.needing_embedding(identity, batch_size)
            fresh = [r for r in records if r.id not in seen]
            if not fresh:
                break
            seen.update(r.id for r in fresh)
            vectors = await self._embed_records(
                [r.content for r in fresh],
                merged=[[m.content for m in r.merged_from] for r in fresh],
            )
            if vectors is None:
                raise EmbedderError(
                    f"the embedder stopped answering: {self.embeddings.status().reason}"
                )
            async with self.db.write() as tx:
                done += await tx.set_vectors(list(zip(fresh, vectors, strict=True)), identity)
            if progress is not None:
                progress(done, total)
        remaining = await self.db.count_needing_embedding(identity)
        self._awaiting = (time.monotonic(), remaining)
        return ReembedSummary(embedder=identity, embedded=done, remaining=remaining)

    async def get(self, record_id: str) -> Record:
        record = await self.db.get(record_id)
        if record is None:
            raise NotFound(f"no record with id {record_id!r}")
        return record

    async def sources_of(self, record: Record) -> list[str]:
        """Every id a record stands for: itself, what it folded, what it superseded."""
        ids = [record.id, *(m.id for m in record.merged_from)]
        for old in await self.db.get_many(record.supersedes):
            ids.extend(i for i in [old.id, *(m.id for m in old.merged_from)] if i not in ids)
        return ids

    async def status(self) -> Status:
        stats = await self.db.stats()
        identity = self.embeddings.identity
        return Status(
            backend=self.db.backend,
            database=self.db.location,
            database_bytes=stats.database_bytes,
            driver=self.db.details,
            vectors=self.db.vectors_available,
            embedder=self.embeddings.status(),
            awaiting_embedding=await self.db.count_needing_embedding(identity),
            stats=stats,
            settings_sources=self.sources,
            tasks=await self.db.tasks(),
        )


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


def _time_bound(value: datetime | str | None, name: str) -> str | None:
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
