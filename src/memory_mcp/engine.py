"""The engine: what every feature module works with.

An ``Engine`` holds the settings, the store (typed as ``storage.base.Store``:
whichever backend the factory opened), the embeddings, the clock, and the
embedding work several features share: vectors for texts, vectors for stored
records, the re-embedding queue. The feature modules (``write``, ``search``,
``brief``, ``ingest``, ``exchange``, ``maintenance``, ``conflicts``,
``archive``) each take one; ``service.MemoryService`` is the facade over them
that the CLI and the MCP server call.

    async with Engine.open(settings) as engine:
        vectors = await engine.embed_records(["We deploy with GitHub Actions"])
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Literal

from memory_mcp import ranker
from memory_mcp.config import LoadedSettings, Settings, replaced
from memory_mcp.embedders.base import Embedder
from memory_mcp.embedders.runtime import Embeddings
from memory_mcp.errors import EmbedderError, InvalidInput, StorageError
from memory_mcp.fusion import SearchPlan
from memory_mcp.identity import ProjectIdentity
from memory_mcp.overlap import alongside
from memory_mcp.passages import record_passages, split_passages
from memory_mcp.records import Record, format_time, utcnow
from memory_mcp.scope import GLOBAL_KEY, Project, project_identity
from memory_mcp.storage.base import Store, Vector
from memory_mcp.storage.factory import open_store

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
SearchScope = Literal["project", "global", "all"]


def check_scope(scope: str) -> None:
    """Raise ``InvalidInput`` unless ``scope`` is a ``SearchScope``."""
    if scope not in ("project", "global", "all"):
        raise InvalidInput(f"scope must be 'project', 'global' or 'all', got {scope!r}")


# Records per embedding call when embedding stored records: small, so that a search
# waiting for the model (one call at a time) waits ~0.1 s, not the 0.8 s of 64 passages.
EMBED_BATCH = 8
_AWAITING_TTL_S = 30.0
_NOT_COUNTED = (-_AWAITING_TTL_S * 2, 0)  # ``Engine._awaiting`` before its first count
# The passages a store defers (``complete_later``) are embedded once the engine has had
# no store or search for this long, so that they do not hold up the next one; sooner
# when this many wait, or when the oldest has waited this long. Then they are embedded
# between stores, each of which may wait for a record's windows: at 64 and 5 s, a burst
# of 300 stores with no pause at 50,000 memories had p95 61.4 / 57.1 ms in two runs (the
# last 100: p50 26.5 / 29.0); with these, 15.6 / 15.5 ms (10.7 / 9.3), the windows of
# the 151 / 167 records left embedded in 4.6 / 4.9 s after it.
_QUIET_S = 0.25
_DUE_MOST = 1000
_DUE_WAIT_S = 60.0
_CLOSE_WAIT_S = 30.0  # a closing engine finishes its deferred embedding for this long
# The vector rows of records that stopped being current are deleted after their commits,
# at the same quiet, about this many rows a transaction (``Store.sweep_vectors``): a
# store that comes meanwhile waits for one (0.3 ms a row at 10,000 memories).
_SWEEP_BATCH = 24
# Hits returned by searches are counted as accesses at the same quiet, or once the first
# of them has waited this long: another process's maintenance reads the counts, and
# would take a project searched a moment ago for dormant (``Engine.count_access``).
_ACCESS_WAIT_S = 2.0


def embed_due_now(quiet_s: float, due: int, oldest_s: float) -> bool:
    """Whether deferred passages are embedded now: ``quiet_s`` after the last store or
    search, ``due`` records waiting, the oldest for ``oldest_s``."""
    return quiet_s >= _QUIET_S or due >= _DUE_MOST or oldest_s >= _DUE_WAIT_S


# Who the work of this task is for, when a request says (a shared server's caller).
_acting: ContextVar[str | None] = ContextVar("memory_mcp_acting_user", default=None)


@dataclass(frozen=True)
class ReembedSummary:
    embedder: str
    embedded: int
    remaining: int


class Engine:
    """The settings, the store, the embeddings and the clock, shared by every feature."""

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
        self.store = store
        self.embeddings = embeddings
        self.clock = clock
        self.sources = list(sources)  # where the settings came from (``status``)
        self._awaiting: tuple[float, int] = _NOT_COUNTED
        self._adopted: set[str] = set()  # project keys whose earlier keys were looked at
        self._due: dict[str, float] = {}  # records whose other passages await, since when
        # hits returned and not counted yet (``count_access``): new accesses and the last
        self._accessed: dict[str, tuple[int, str]] = {}
        self._accessed_since = 0.0  # when the first of them was returned (monotonic)
        self._completing: asyncio.Task[None] | None = None
        self._sweep_after = 0.0  # a failed sweep is not tried again before then (monotonic)
        # when a store or search last asked for the model (opening counts: a session's
        # first calls come right after its server starts)
        self._active_at = time.monotonic()
        self.plan = SearchPlan(
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
    ) -> AsyncIterator[Engine]:
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
            engine = cls(settings, store, embeddings, clock=clock, sources=sources)
            try:
                yield engine
            finally:
                await engine.finish_deferred(_CLOSE_WAIT_S)
        finally:
            await store.close()

    @asynccontextmanager
    async def beside(self, url: str) -> AsyncIterator[Engine]:
        """Another store (``url``, a ``storage.url``), worked on with this engine's
        settings, embeddings and clock: where ``push`` copies to."""
        settings = replaced(self.settings, storage=replaced(self.settings.storage, url=url))
        store = await open_store(settings, clock=self.clock)
        try:
            yield Engine(settings, store, self.embeddings, clock=self.clock)
        finally:
            await store.close()

    @property
    def user(self) -> str:
        """Who is acting: the caller of the request being served (``acting_as``), else
        the store's user (its database role, or the local login). What they write is
        theirs; what they read is what ``Record.visible_to`` lets them."""
        return _acting.get() or self.store.user

    @staticmethod
    @contextmanager
    def acting_as(user: str | None) -> Iterator[None]:
        """Work done inside (in this task and the tasks it starts) is ``user``'s; None
        leaves it to the store's user."""
        token = _acting.set(user)
        try:
            yield
        finally:
            _acting.reset(token)

    @property
    def ranking(self) -> ranker.RankerConfig:
        """The one ranker's settings (half-life, prior weight)."""
        return self.plan.ranking

    @property
    def redacts(self) -> bool:
        """Whether what is shown goes through the current secret rules (``write.secrets``
        not off): search hits, the records they name, the brief."""
        return self.plan.redact

    async def scope_keys(self, scope: SearchScope, cwd: str | Path | None) -> tuple[str, ...]:
        """The scope keys a search reads: the project's (with its aliases), the global
        one, or both."""
        check_scope(scope)
        if scope == "global":
            return (GLOBAL_KEY,)
        keys = (await self.project(cwd)).keys
        return keys if scope == "project" else (*keys, GLOBAL_KEY)

    # Projects and their aliases ------------------------------------------------------

    async def project(self, cwd: str | Path | None) -> Project:
        """The project of ``cwd``: its identity and aliases.

        The first time a process meets a project, the keys it had before its
        identity (``ProjectIdentity.earlier``: its worktrees' paths, the keys of
        the lower rules) that hold records become its aliases (``adopt``).
        """
        identity = project_identity(cwd)
        if identity.key not in self._adopted:
            try:
                await self.adopt(identity)
            except StorageError:  # a read-only store still answers, without the aliases
                log.warning("could not attach %s's earlier keys", identity.key, exc_info=True)
        return Project(identity, tuple(await self.store.aliases(identity.key)))

    async def adopt(self, identity: ProjectIdentity) -> list[str]:
        """Attach the project's earlier keys that hold records as its aliases; which.

        A key that already has an alias row (attached anywhere, or detached by an
        operator) is left as it is. The aliases of an adopted key move with it,
        so no alias ever names another alias.
        """
        self._adopted.add(identity.key)
        earlier = [k for k in identity.earlier if k != GLOBAL_KEY]
        known = await self.store.alias_of(earlier) if earlier else {}
        fresh: list[tuple[str, list[str]]] = []
        for key in earlier:
            if key in known:
                continue
            moved = [a.alias for a in await self.store.aliases(key) if a.attached]
            if moved or await self.store.count_unarchived(key):
                fresh.append((key, moved))
        if not fresh:
            return []
        at = format_time(self.clock())
        adopted: list[str] = []
        async with self.store.write() as tx:
            for key, moved in fresh:
                if await tx.add_alias(key, identity.key, at, replace=False):
                    adopted.append(key)
                    for alias in moved:
                        await tx.add_alias(alias, identity.key, at)
        if adopted:
            log.info("project %s: earlier keys now read as its own: %s", identity.key, adopted)
        return adopted

    async def same_scope(self, scope_key: str) -> tuple[str, ...]:
        """Every key read as the same scope as a stored record's ``scope_key``: its
        project's key, then that key's attached aliases."""
        if scope_key == GLOBAL_KEY:
            return (GLOBAL_KEY,)
        row = (await self.store.alias_of([scope_key])).get(scope_key)
        key = row.key if row is not None and row.attached else scope_key
        return (key, *(a.alias for a in await self.store.aliases(key) if a.attached))

    async def projects_of(self, scope_keys: Sequence[str]) -> dict[str, list[str]]:
        """Scope keys grouped by the key they are read as (an alias by its project's)."""
        rows = await self.store.alias_of(scope_keys)
        groups: dict[str, list[str]] = {}
        for key in scope_keys:
            row = rows.get(key)
            groups.setdefault(row.key if row is not None and row.attached else key, []).append(key)
        return groups

    # Embedding -----------------------------------------------------------------------

    async def embed_records(
        self,
        texts: Sequence[str],
        *,
        merged: Sequence[Sequence[str]] = (),
        whole_only: bool = False,
    ) -> list[Vector] | None:
        """Passage vectors per record (its whole text first), or None on the lexical floor.

        Args:
            texts: each record's content.
            merged: each record's folded texts (their passages follow its own).
            whole_only: each record's whole text only, one vector each (a store's
                hot path; ``complete_later`` embeds the rest).
        """
        if not texts:
            return None
        await self.embeddings.settle()
        if self.embeddings.identity is None or not self.embeddings.ready:
            return None
        folded = list(merged) or [[] for _ in texts]
        passages = [
            [text] if whole_only else record_passages(text, list(extra))
            for text, extra in zip(texts, folded, strict=True)
        ]
        flat = [p for group in passages for p in group]
        matrix = await self.embeddings.embed(flat)
        if matrix is None:
            return None
        import numpy as np  # here, not at the top: commands that embed nothing skip its load

        out: list[Vector] = []
        offset = 0
        for group in passages:
            out.append(np.asarray(matrix[offset : offset + len(group)], dtype=np.float32))
            offset += len(group)
        return out

    async def embed_stored(self, record_ids: Sequence[str]) -> int:
        """Give stored records their vectors now (restored, refined, new insights); how
        many got one.

        A few records per model call, so that searches waiting for the model are not
        held up; what cannot be embedded now waits for the re-embed task.
        """
        identity = self.embeddings.identity
        records = [r for r in await self.store.get_many(record_ids) if r.current]
        if identity is None:
            return 0
        done = 0
        for start in range(0, len(records), EMBED_BATCH):
            batch = records[start : start + EMBED_BATCH]
            vectors = await self.embed_records(
                [r.content for r in batch],
                merged=[[m.content for m in r.merged_from] for r in batch],
            )
            if vectors is None:
                break
            async with self.store.write() as tx:
                done += await tx.set_vectors(list(zip(batch, vectors, strict=True)), identity)
        return done

    # Deferred passages ---------------------------------------------------------------

    def note_activity(self) -> None:
        """A store or a search is using the model: deferred embedding waits for quiet."""
        self._active_at = time.monotonic()
        if self._to_sweep():
            self._work_later()

    async def quiet(self, seconds: float, most: float) -> None:
        """Wait until no store or search has asked for the model for ``seconds`` (since
        this engine opened), or for ``most`` seconds at the longest."""
        deadline = time.monotonic() + most
        while (now := time.monotonic()) < deadline:
            left = self._active_at + seconds - now
            if left <= 0:
                return
            await asyncio.sleep(min(left, deadline - now))

    def complete_later(self, record_ids: Collection[str]) -> None:
        """Embed the rest of these records' passages after the caller has its answer.

        In this process, in the background, once stores and searches pause
        (``_QUIET_S``). The records are marked in the store
        (``mark_vectors_due``), so that what a crash or a closed process leaves
        undone, maintenance's re-embedding does.
        """
        now = time.monotonic()
        for record_id in record_ids:
            self._due.setdefault(record_id, now)
        self._work_later()

    def count_access(self, record_ids: Sequence[str], at: str) -> None:
        """Count these returned hits as accesses once the search has answered: written at
        the quiet the deferred passages wait for (``_complete_due``, one transaction for
        every search since; at the latest ``_ACCESS_WAIT_S`` after the first), or as the
        engine closes. A search that wrote them itself answered 0.8 ms later (p50 at
        50,000 memories, SQLite); ranking reads the counts as a slow signal, and a crash
        loses the counts of the last two seconds at most, never a memory."""
        if not record_ids:
            return
        if not self._accessed:
            self._accessed_since = time.monotonic()
        for record_id in record_ids:
            self._add_access(record_id, 1, at)
        self._work_later()

    def _add_access(self, record_id: str, times: int, at: str) -> None:
        """Add ``times`` accesses, the last at ``at``, to those of the record not written."""
        more, last = self._accessed.get(record_id, (0, at))
        self._accessed[record_id] = (times + more, max(last, at))

    def _work_later(self) -> None:
        """Start the background work that waits for quiet (``_complete_due``) if there
        is some and it is not running."""
        if not (self._due or self._accessed or self._to_sweep()):
            return
        if self._completing is None or self._completing.done():
            self._completing = asyncio.get_running_loop().create_task(self._complete_due())

    async def _complete_due(self) -> None:
        """Access counts, deferred passages, then the retired records' vector rows
        (``Store.sweep_vectors``), each once stores and searches pause."""
        started = time.monotonic()
        while self._due or self._accessed or self._to_sweep():
            now = time.monotonic()
            quiet = now - self._active_at
            oldest = min(self._due.values(), default=started)
            if self._accessed and (
                quiet >= _QUIET_S or now - self._accessed_since >= _ACCESS_WAIT_S
            ):
                await self.write_accesses()
                continue
            if (self._due or self._to_sweep()) and embed_due_now(
                quiet, len(self._due), now - oldest
            ):
                if self._due:
                    await self._embed_due()
                elif not await self._sweep():
                    return
                continue
            wait = _QUIET_S - quiet
            if self._accessed:
                wait = min(wait, self._accessed_since + _ACCESS_WAIT_S - now)
            await asyncio.sleep(max(wait, 0.001))

    def _to_sweep(self) -> bool:
        """Whether retired records' vector rows wait, and no sweep failed a moment ago."""
        return self.store.vectors_to_sweep and time.monotonic() >= self._sweep_after

    async def _sweep(self) -> bool:
        """One batch of retired vector rows deleted; False if that failed (tried again
        after ``_DUE_WAIT_S``, or at close: a store that cannot be written, say, is not
        asked at every search)."""
        try:
            await self.store.sweep_vectors(_SWEEP_BATCH)
        except Exception:
            log.warning("could not delete the vectors of retired records now", exc_info=True)
            self._sweep_after = time.monotonic() + _DUE_WAIT_S
            return False
        return True

    async def write_accesses(self) -> None:
        """Write the access counts noted since the last write (``count_access``), in one
        transaction (a store, whose folds carry them, and maintenance, which reads them,
        ask first); a store that cannot be written loses them, not the searches."""
        if not self._accessed:
            return
        accessed, self._accessed = self._accessed, {}
        try:
            await self.store.record_access(accessed)
        except asyncio.CancelledError:  # closing: ``finish_deferred`` writes them
            for record_id, (times, at) in accessed.items():
                self._add_access(record_id, times, at)
            raise
        except StorageError as exc:  # read-only, full, busy
            log.warning("search hits were not counted as accesses: %s", exc)
        except Exception:
            log.warning("search hits were not counted as accesses", exc_info=True)

    async def _embed_due(self) -> None:
        """One record's passages: one short model call, so that a store or search that
        arrives meanwhile waits for little (the model runs one call at a time)."""
        record_id = next(iter(self._due))
        del self._due[record_id]
        try:
            if not await self._embed_windows(record_id):
                await self.embed_stored([record_id])
        except Exception:  # maintenance's re-embedding finishes it
            log.warning("could not embed the passages of %s now", record_id, exc_info=True)

    async def _embed_windows(self, record_id: str) -> bool:
        """The passages after a stored record's whole text, whose vector it holds from the
        store (``Store.add_passages``): its whole text is not embedded again. False if it
        holds anything else (a fold's rows, another model's): ``embed_stored`` redoes
        them all.

        The model pads a batch to its longest text: the whole text with its windows
        cost about four whole texts, and its row was deleted and written again; the
        windows alone took the background work per deferred record from 49 to 25 ms
        at 50,000 memories (sweeps included)."""
        identity = self.embeddings.identity
        record = await self.store.get(record_id)
        if identity is None or record is None or not record.current or record.merged_from:
            return False
        if record.embedder != identity:
            return False
        windows = split_passages(record.content)[1:]
        if not windows:
            return False
        await self.embeddings.settle()
        matrix = await self.embeddings.embed(windows)
        if matrix is None:
            return False
        import numpy as np

        async with self.store.write() as tx:
            return await tx.add_passages(record, np.asarray(matrix, dtype=np.float32), identity)

    async def finish_deferred(self, seconds: float) -> None:
        """Write the access counts, embed the deferred passages now, and delete the retired
        records' vector rows, for at most ``seconds`` (a closing process); what is left,
        maintenance does (and the next process to write, the rows)."""
        task = self._completing
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.write_accesses()
        deadline = time.monotonic() + seconds
        while self._due and time.monotonic() < deadline:
            await self._embed_due()
        self._due.clear()
        while self.store.vectors_to_sweep and time.monotonic() < deadline:
            if not await self._sweep():
                break

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
        A batch is written while the model embeds the next one, so the model never
        waits for the database (Postgres's writes cost a third of the embedding).

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
        total = await self.store.count_needing_embedding(identity)
        done = 0
        seen: set[str] = set()

        async def embedded(ahead: int) -> list[tuple[Record, Vector]]:
            """The next batch with its vectors; ``ahead``: records being written
            meanwhile, which the read may still see awaiting."""
            if most is not None and len(seen) >= most:
                return []
            records = await self.store.needing_embedding(identity, batch_size + ahead)
            fresh = [r for r in records if r.id not in seen][:batch_size]
            if not fresh:
                return []
            seen.update(r.id for r in fresh)
            vectors = await self.embed_records(
                [r.content for r in fresh],
                merged=[[m.content for m in r.merged_from] for r in fresh],
            )
            if vectors is None:
                raise EmbedderError(
                    f"the embedder stopped answering: {self.embeddings.status().reason}"
                )
            return list(zip(fresh, vectors, strict=True))

        async def write(batch: list[tuple[Record, Vector]]) -> int:
            async with self.store.write() as tx:
                written = await tx.set_vectors(batch, identity)
            # the searches' count of records awaiting vectors is stale from this commit
            # on, not only once the run ends (a run cancelled between them left it so)
            self._awaiting = _NOT_COUNTED
            return written

        batch = await embedded(0)
        while batch:
            written, batch = await alongside(partial(write, batch), partial(embedded, len(batch)))
            done += written
            if progress is not None:
                progress(done, total)
        remaining = await self.store.count_needing_embedding(identity)
        missing = await self.store.count_needing_embedding(identity, incomplete=False)
        self._awaiting = (time.monotonic(), missing)
        return ReembedSummary(embedder=identity, embedded=done, remaining=remaining)

    async def awaiting_vectors(self, identity: str) -> int:
        """How many current records lack vectors from ``identity`` (counted every 30 s)."""
        at, count = self._awaiting
        if time.monotonic() - at > _AWAITING_TTL_S:
            count = await self.store.count_needing_embedding(identity, incomplete=False)
            self._awaiting = (time.monotonic(), count)
        return count

    async def warm_up(self, cwd: str | Path | None = None) -> None:
        """Load the project's and the global scope's vectors into memory ahead of use.

        A server calls this in the background at start, so that its first search or
        store does not pay for the load (0.2-0.6 s at 50,000 memories). It does not
        wait for the model when the vectors it will use are known already (the
        store's, or those the settings name): the load goes on beside the model's.
        Failures are logged, never raised.
        """
        try:
            if self.embeddings.identity is None:
                await self.embeddings.wait_settled(120)
            identity = self.embeddings.identity
            if identity is not None:
                await self.store.load_vectors(identity, await self.scope_keys("all", cwd))
        except Exception:
            log.warning("could not load the vectors ahead of use", exc_info=True)
