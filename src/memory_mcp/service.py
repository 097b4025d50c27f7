"""The facade the adapters call: ``MemoryService``.

The CLI and the MCP server each parse input, call one method here and format
the result; they import nothing else from the engine and never touch the store.
Each method hands the work to the feature module that does it (``write``,
``search``, ``archive``, ``conflicts``, ``brief``, ``ingest``, ``exchange``,
``maintenance``), over one ``engine.Engine``. Nothing in this package imports
``mcp`` or ``typer``.

    async with MemoryService.open(settings) as memory:
        result = await memory.store("We deploy with GitHub Actions to Fly.io", cwd=path)
        hits = await memory.search("how do we deploy", cwd=path)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TextIO

from memory_mcp import archive, projects, search
from memory_mcp.config import LoadedSettings, Settings
from memory_mcp.embedders.base import Embedder
from memory_mcp.embedders.runtime import EmbedderStatus
from memory_mcp.engine import Clock, Engine, ReembedSummary, SearchScope
from memory_mcp.errors import InvalidInput, NotFound
from memory_mcp.records import Conflict, Corpus, Record, SearchResult, StoreResult, utcnow
from memory_mcp.scope import Project
from memory_mcp.search import MAX_SEARCH_LIMIT, UNIFIED_CONTENT_CAP, UnifiedItem, UnifiedResult
from memory_mcp.storage.base import Diagnosis, StoreStats, TaskState
from memory_mcp.write import StoreRequest, store_many, store_valid

if TYPE_CHECKING:
    from memory_mcp.brief import Brief
    from memory_mcp.conflicts import ConflictView, Keep
    from memory_mcp.curation import History, ProjectSummary, Upkeep
    from memory_mcp.exchange import ExportSummary, ImportSummary
    from memory_mcp.ingest import IngestSummary
    from memory_mcp.maintenance import TaskReport

__all__ = [
    "MAX_SEARCH_LIMIT",
    "UNIFIED_CONTENT_CAP",
    "MemoryService",
    "ReembedSummary",
    "Status",
    "StoreRequest",
    "UnifiedItem",
    "UnifiedResult",
]


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
    """Store, fold, search and rank memories; brief, ingest, exchange and upkeep."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # Work done inside ``with MemoryService.acting_as(user):`` is that user's: what it
    # stores is theirs, what it reads is what they may (a shared server's caller).
    acting_as = staticmethod(Engine.acting_as)

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
        """Open the store and start the embedder (``Engine.open`` says how)."""
        async with Engine.open(
            settings,
            database=database,
            embedder=embedder,
            clock=clock,
            wait_for_embedder=wait_for_embedder,
            load_embedder=load_embedder,
            probe_network=probe_network,
        ) as engine:
            yield cls(engine)

    @property
    def settings(self) -> Settings:
        return self.engine.settings

    @property
    def location(self) -> str:
        """Where the store is: its file, or its URL without credentials."""
        return self.engine.store.location

    async def scope_keys(self, scope: SearchScope, cwd: str | Path | None) -> tuple[str, ...]:
        """The scope keys a search reads: the project's (with its aliases), the global
        one, or both."""
        return await self.engine.scope_keys(scope, cwd)

    # Projects -------------------------------------------------------------------------

    async def project(self, cwd: str | Path | None = None) -> Project:
        """The project of ``cwd``: its key, how it was found, its aliases."""
        return await self.engine.project(cwd)

    async def adopt(self, cwd: str | Path | None = None) -> tuple[Project, list[str]]:
        """Attach the project's earlier keys that hold records (``projects.adopt``)."""
        return await projects.adopt(self.engine, cwd)

    async def attach_alias(self, alias: str, cwd: str | Path | None = None) -> Project:
        """Read an earlier key's records as this project's (``projects.attach``)."""
        return await projects.attach(self.engine, alias, cwd)

    async def detach_alias(self, alias: str, cwd: str | Path | None = None) -> Project:
        """Stop reading an alias's records as this project's (``projects.detach``)."""
        return await projects.detach(self.engine, alias, cwd)

    async def wait_for_model(self, seconds: float, say: Callable[[str], None]) -> None:
        """Wait up to ``seconds`` for a model that is still loading (downloading),
        saying so first."""
        embeddings = self.engine.embeddings
        await embeddings.settle()
        state = embeddings.status()
        if not embeddings.ready and state.state == "loading":
            say(f"waiting for the embedding model ({state.reason})")
            await embeddings.wait_loaded(seconds)

    async def warm_up(self, cwd: str | Path | None = None) -> None:
        """Load the vectors a server will search ahead of use (``Engine.warm_up``)."""
        await self.engine.warm_up(cwd)

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
        private: bool = False,
    ) -> StoreResult:
        """Store one memory through the write pipeline (fold / supersede / conflict / insert);
        ``private``: for its writer alone in a team's store.

        Raises:
            InvalidInput: a bad argument (the message says what to change).
        """
        request = StoreRequest(
            content, kind, scope, cwd, importance, tags, agent, created_at, pinned, private
        )
        return (await self.store_many([request]))[0]

    async def store_many(
        self,
        requests: Sequence[StoreRequest],
        *,
        progress: Callable[[int], None] | None = None,
    ) -> list[StoreResult]:
        """Store several memories in order (``write.store_many``)."""
        return await store_many(self.engine, requests, progress=progress)

    async def store_valid(
        self,
        requests: Sequence[StoreRequest],
        *,
        progress: Callable[[int], None] | None = None,
    ) -> list[StoreResult | InvalidInput]:
        """Like ``store_many``, but an unusable item is skipped: its place holds the error."""
        return await store_valid(self.engine, requests, progress=progress)

    async def forget(
        self,
        record_id: str,
        *,
        reason: str = "forgotten",
        cwd: str | Path | None = None,
        anywhere: bool = True,
    ) -> Record:
        """Archive a record, reversibly (``archive.forget``)."""
        return await archive.forget(
            self.engine, record_id, reason=reason, cwd=cwd, anywhere=anywhere
        )

    async def reembed(
        self,
        *,
        batch_size: int = 64,
        progress: Callable[[int, int], None] | None = None,
        most: int | None = None,
    ) -> ReembedSummary:
        """Give every current record a vector from the active embedder (``Engine.reembed``)."""
        return await self.engine.reembed(batch_size=batch_size, progress=progress, most=most)

    async def awaiting_embedding(self) -> int:
        """How many current records await vectors from the active embedder."""
        return await self.engine.store.count_needing_embedding(self.engine.embeddings.identity)

    # Reads ---------------------------------------------------------------------------

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
        agents: Sequence[str] = (),
        keys: Sequence[str] | None = None,
    ) -> SearchResult:
        """Hybrid search, ranked by the one ranker; hits count as accesses (``search.search``)."""
        return await search.search(
            self.engine,
            query,
            scope=scope,
            cwd=cwd,
            corpora=corpora,
            kinds=kinds,
            tags=tags,
            since=since,
            until=until,
            limit=limit,
            max_limit=max_limit,
            now=now,
            count_access=count_access,
            min_relevance=min_relevance,
            agents=agents,
            keys=keys,
        )

    async def project_search(
        self, query: str, *, cwd: str | Path | None = None, limit: int = 8
    ) -> SearchResult:
        """The project's facts, journal, docs and knowledge, ranked together."""
        return await search.project_search(self.engine, query, cwd=cwd, limit=limit)

    async def unified_search(
        self,
        query: str,
        *,
        sources: Sequence[str] | None = None,
        cwd: str | Path | None = None,
        limit: int = 8,
        threshold: float = 0.35,
    ) -> UnifiedResult:
        """``searchUnifiedMemory``'s cross-source contract (``search.unified_search``)."""
        return await search.unified_search(
            self.engine, query, sources=sources, cwd=cwd, limit=limit, threshold=threshold
        )

    async def get(self, record_id: str) -> Record:
        record = await self.engine.store.get(record_id)
        if record is None:
            raise NotFound(f"no record with id {record_id!r}")
        return record

    async def sources_of(self, record: Record) -> list[str]:
        """Every id a record stands for: itself, what it folded, what it superseded."""
        ids = [record.id, *(m.id for m in record.merged_from)]
        for old in await self.engine.store.get_many(record.supersedes):
            ids.extend(i for i in [old.id, *(m.id for m in old.merged_from)] if i not in ids)
        return ids

    async def brief(
        self,
        cwd: str | Path | None = None,
        *,
        now: datetime | None = None,
        budget: int | None = None,
        dated: bool = False,
    ) -> Brief:
        """The spawn brief of ``cwd``'s project (``brief.build_brief``)."""
        from memory_mcp.brief import build_brief

        return await build_brief(self.engine, cwd, now=now, budget=budget, dated=dated)

    async def status(self) -> Status:
        store, embeddings = self.engine.store, self.engine.embeddings
        stats = await store.stats()
        return Status(
            backend=store.backend,
            database=store.location,
            database_bytes=stats.database_bytes,
            driver=store.details,
            vectors=store.vectors_available,
            embedder=embeddings.status(),
            awaiting_embedding=await store.count_needing_embedding(embeddings.identity),
            stats=stats,
            settings_sources=self.engine.sources,
            tasks=await store.tasks(),
        )

    # Documents and files -------------------------------------------------------------

    async def ingest(
        self,
        root: Path,
        paths: Sequence[Path] = (),
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> IngestSummary:
        """Index the project's documents into the knowledge corpus (``ingest.ingest``)."""
        from memory_mcp.ingest import ingest

        return await ingest(self.engine, root, paths, progress=progress)

    async def ingest_agent_memories(
        self, root: Path, *, progress: Callable[[int, int], None] | None = None
    ) -> IngestSummary:
        """Import Claude Code's own memory files for the project as knowledge chunks."""
        from memory_mcp.ingest import ingest_agent_memories

        return await ingest_agent_memories(self.engine, root, progress=progress)

    async def export(self, target: TextIO | Path) -> ExportSummary:
        """Write every record and conflict as JSONL (``exchange.export_jsonl``) to a stream,
        or to a file that only its owner can read."""
        from memory_mcp.exchange import export_jsonl, open_private

        if isinstance(target, Path):
            with open_private(target) as out:
                return await export_jsonl(self.engine, out)
        return await export_jsonl(self.engine, target)

    async def import_(
        self,
        lines: Iterable[str],
        *,
        progress: Callable[[int, int], None] | None = None,
        embed_progress: Callable[[int, int], None] | None = None,
    ) -> ImportSummary:
        """Add an export's records and conflicts, then embed them (``exchange.import_jsonl``)."""
        from memory_mcp.exchange import import_jsonl

        return await import_jsonl(
            self.engine, lines, progress=progress, embed_progress=embed_progress
        )

    async def push(
        self,
        url: str,
        *,
        progress: Callable[[int, int], None] | None = None,
        embed_progress: Callable[[int, int], None] | None = None,
    ) -> ImportSummary:
        """Copy this store into the store ``url`` names (``exchange.push``): every record,
        history and archived ones too, and the conflicts; run again, it adds what is missing.

        Raises:
            InvalidInput: ``url`` names this store.
            ConfigError: ``url`` names no store this version can open.
        """
        from memory_mcp.exchange import push
        from memory_mcp.storage.factory import names_store

        if names_store(url, self.engine.store, self.settings):
            raise InvalidInput(f"{self.engine.store.location} is this store; push names another")
        async with self.engine.beside(url) as target:
            return await push(self.engine, target, progress=progress, embed_progress=embed_progress)

    # Team ----------------------------------------------------------------------------

    async def prepare_team(self) -> list[str]:
        """Ready this (Postgres) store for members with roles of their own: the group
        role, its grants, and the active embedder's vector index; what was done.

        Raises:
            InvalidInput: the store is a SQLite file.
            StorageError: this role is not the database's owner or an administrator.
        """
        identity, dim = None, None
        vectors = await self.engine.embed_records(["memory-mcp"])
        if vectors is not None:
            identity, dim = self.engine.embeddings.identity, int(vectors[0].shape[1])
        return await self.engine.store.prepare_team(identity, dim)

    async def add_member(self, name: str, password: str | None = None) -> str:
        """Give ``name`` a database role in the team ("created", or "joined" if it existed)."""
        return await self.engine.store.add_member(name, password)

    # Upkeep --------------------------------------------------------------------------

    async def maintain(
        self,
        tasks: Sequence[str] | None = None,
        *,
        dry_run: bool = False,
        progress: Callable[[str], None] | None = None,
    ) -> list[TaskReport]:
        """Run the maintenance tasks now (all by default); ``dry_run`` on a throwaway copy."""
        from memory_mcp import maintenance

        chosen = maintenance.TASKS if tasks is None else tasks
        if dry_run:
            return await maintenance.dry_run(self.engine, chosen, progress=progress)
        return await maintenance.Maintenance(self.engine, progress=progress).run(chosen)

    async def maintenance_loop(self) -> None:
        """The server's maintenance, forever: the tasks that are due. Never raises."""
        from memory_mcp import maintenance

        await maintenance.loop(self.engine)

    async def archived(
        self,
        scope_keys: Sequence[str] = (),
        *,
        reason: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> list[Record]:
        """Archived records of these scopes (every scope if none), most recent first."""
        return await archive.archived(
            self.engine, scope_keys, reason=reason, limit=limit, offset=offset
        )

    async def restore(self, record_ids: Sequence[str]) -> list[Record]:
        """Bring archived records back exactly as they were (``archive.restore``)."""
        return await archive.restore(self.engine, record_ids)

    async def archive_project(self, cwd: str | Path | None, *, dry_run: bool = False) -> int:
        """Archive every record of a finished project (``archive.archive_project``)."""
        return await archive.archive_project(self.engine, cwd, dry_run=dry_run)

    async def conflicts(self) -> list[ConflictView]:
        """The operator's inbox: every open conflict, oldest first, with both records."""
        from memory_mcp.conflicts import open_conflicts

        return await open_conflicts(self.engine)

    async def resolve_conflict(
        self, conflict_id: int, keep: Keep, text: str | None = None, *, agent: str = "cli"
    ) -> tuple[Conflict, Record | None]:
        """Close a conflict (``conflicts.resolve_conflict``)."""
        from memory_mcp.conflicts import resolve_conflict

        return await resolve_conflict(self.engine, conflict_id, keep, text, agent=agent)

    # What the viewer shows (``curation``) -----------------------------------------------

    @property
    def user(self) -> str:
        """Whom the work is for: the acting user (``acting_as``), else the store's."""
        return self.engine.user

    async def projects(self) -> list[ProjectSummary]:
        """Every scope the user may read records of, with its counts (``curation.projects``)."""
        from memory_mcp import curation

        return await curation.projects(self.engine)

    async def write_mark(self) -> object | None:
        """A value that changes with every commit to the store, by any process (None:
        the backend has none): what a cache of reads is kept by."""
        return await self.engine.store.write_mark()

    async def upkeep(self) -> Upkeep:
        """The embedder, rows awaiting vectors, open conflicts and the maintenance tasks'
        last runs, without ``status``'s counts (``curation.upkeep``)."""
        from memory_mcp import curation

        return await curation.upkeep(self.engine)

    async def project_keys(self, key: str) -> tuple[str, ...]:
        """A scope's key and the earlier keys attached to it."""
        from memory_mcp import curation

        return await curation.project_keys(self.engine, key)

    async def conflicts_of(self, record_ids: Sequence[str]) -> dict[str, int]:
        """The open conflict each of these records is in, by id (``curation.conflicts_of``)."""
        from memory_mcp import curation

        return await curation.conflicts_of(self.engine, record_ids)

    async def listing(
        self,
        keys: Sequence[str],
        *,
        kind: str = "",
        agent: str = "",
        tag: str = "",
        since: str = "",
        until: str = "",
        limit: int,
        before: str = "",
        seen: Sequence[str] = (),
    ) -> list[Record]:
        """Current records, newest first, a page at a time (``curation.listing``)."""
        from memory_mcp import curation

        return await curation.listing(
            self.engine,
            keys,
            kind=kind,
            agent=agent,
            tag=tag,
            since=since,
            until=until,
            limit=limit,
            before=before,
            seen=seen,
        )

    async def readable(self, record_id: str) -> Record:
        """A record the user may read, current or not (``curation.readable``)."""
        from memory_mcp import curation

        return await curation.readable(self.engine, record_id)

    async def records(self, record_ids: Sequence[str]) -> list[Record]:
        """The records among these that the user may read, in that order, as shown
        (``curation.shown``)."""
        found = {r.id: r for r in await self.engine.store.get_many(record_ids)}
        return self.shown(
            [found[i] for i in record_ids if i in found and found[i].visible_to(self.engine.user)]
        )

    def shown(self, records: Sequence[Record | None]) -> list[Record]:
        """The records a page may show, through the current secret rules (``curation.shown``);
        None stays out."""
        from memory_mcp import curation

        return [curation.shown(self.engine, r) for r in records if r is not None]

    async def history(self, record: Record) -> History:
        """A record's supersede chain both ways and its open conflicts."""
        from memory_mcp import curation

        return await curation.history(self.engine, record)

    async def reinstate(self, record_id: str) -> Record:
        """Make an older value current again (``curation.reinstate``)."""
        from memory_mcp import curation

        return await curation.reinstate(self.engine, record_id)

    async def project_brief(self, key: str, *, budget: int | None = None) -> Brief:
        """The spawn brief of the project stored under ``key``."""
        from memory_mcp import curation

        return await curation.project_brief(self.engine, key, budget=budget)

    async def doctor(self, *, repair: bool = False) -> Diagnosis:
        """Check the store (and with ``repair``, rebuild what disagrees with the records)."""
        return await self.engine.store.doctor(repair=repair)

    async def backup(self, path: Path, *, force: bool = False) -> Path:
        """A consistent copy of the store while servers keep writing; the file written."""
        return await self.engine.store.backup(path, force=force)
