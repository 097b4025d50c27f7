"""Maintenance (SPEC §7): upkeep that needs no human, and that can be undone.

One run does these tasks, in this order:

============ =====================================================================
secrets      when the secret rules changed since the stored texts were last scanned,
             every record (current, history, archived; folded texts and earlier LLM
             texts too) is scanned again and redacted; its vectors are made again
reembed      current records without a vector from the active embedder get one
consolidate  duplicates the write-time fold missed are folded with the same rules
             (``write.neighbours``, ``fold.decide``), across each whole scope;
             contradictions become conflicts. An LLM may then rewrite the text of
             a fold as one statement; the previous text is kept in ``meta``.
insights     summaries of groups of related facts (rules, or the LLM), each listing
             its sources; rewritten when the group changes, the old one archived
staleness    facts never returned by a search, in projects without activity for
             ``dormant_days``, are archived (reason ``dormant``)
purge        records archived longer than ``grace_days`` are deleted: the only
             hard delete there is
============ =====================================================================

Every destructive step is a soft archive first (``memory-mcp restore`` undoes
it until the purge). Each task holds a lease in the database while it runs, so
that of several server processes on one store only one runs it; a running task
renews the lease and saves its cursor between small transactions. A failing
task (an embedder outage) backs off, doubling its wait.

``--dry-run`` runs the same code on a private copy of the database (SQLite's
online backup) and throws the copy away, so the counts it reports are what a
real run would do, task after task. It calls no LLM (counts do not depend on
its answers); records awaiting vectors are embedded on the copy, as the real
run would, so that the later tasks see what they will see.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import anyio
import numpy as np

from memory_mcp import ranker
from memory_mcp.brief import top_by_prior
from memory_mcp.errors import EmbedderError, InvalidInput, NotFound
from memory_mcp.fold import compare, decide
from memory_mcp.lexical import content_words, stems
from memory_mcp.llm import LLM, LLMError, build_llm, insight_prompt, refine_prompt
from memory_mcp.records import CORPORA, Conflict, Record, format_time, parse_time
from memory_mcp.scope import Scope, project_scope
from memory_mcp.secret_scan import FINGERPRINT, redact, redact_record
from memory_mcp.service import MemoryService
from memory_mcp.storage.base import Filters, Position, TaskState, Vector
from memory_mcp.write import absorb, clean_text, neighbours, new_id, prepare

log = logging.getLogger(__name__)

# secrets first: the vectors it drops are made again by reembed in the same run.
TASKS: tuple[str, ...] = ("secrets", "reembed", "consolidate", "insights", "staleness", "purge")
_BATCH = 200  # records per transaction and between two lease renewals
_REEMBED_ROUND = 512  # records re-embedded between two lease renewals
# Records per embedding call when re-embedding: small, so that a search waiting for
# the model (one call at a time) waits ~0.1 s, not the 0.8 s of 64 passages.
_REEMBED_BATCH = 8
INSIGHT_POOL = 1000  # facts of a scope, best by prior, that insights group
LEXICAL_INSIGHT_SIMILARITY = 0.3  # word overlap that relates two facts without vectors
_HIGHLIGHTS = 5
_HIGHLIGHT_CHARS = 180
_KEYWORDS = 12

Progress = Callable[[str], None]
Matrix = np.ndarray[Any, np.dtype[np.float32]]


@dataclass
class TaskReport:
    """What one task did (or, in a dry run, would do)."""

    task: str
    counts: dict[str, int] = field(default_factory=dict)
    pending: int = 0  # work left for a later run
    skipped: str = ""  # why it did not run
    error: str = ""  # why it failed (it backs off)

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "counts": dict(self.counts),
            "pending": self.pending,
            "skipped": self.skipped,
            "error": self.error,
        }

    def describe(self) -> str:
        if self.skipped:
            return f"skipped: {self.skipped}"
        if self.error:
            return f"failed: {self.error}"
        done = ", ".join(f"{n} {what}" for what, n in self.counts.items() if n) or "nothing to do"
        return done + (f"; {self.pending} left" if self.pending else "")


class LeaseLost(RuntimeError):
    """Another process took the task's lease over (this one stalled past it)."""


def holder_name() -> str:
    """This process, as a lease holder: host, pid and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Maintenance:
    """Runs the tasks on one service's store."""

    def __init__(
        self,
        memory: MemoryService,
        *,
        holder: str | None = None,
        llm: LLM | None = None,
        dry_run: bool = False,
        progress: Progress | None = None,
        sweep_budget: int | None = None,
    ) -> None:
        self.memory = memory
        self.db = memory.db
        self.settings = memory.settings.maintenance
        self.holder = holder or holder_name()
        self.llm = llm if llm is not None else build_llm(self.settings)
        self.dry_run = dry_run
        self.sweep_budget = sweep_budget  # facts one consolidation run compares at most
        self._say = progress or (lambda _: None)
        self._task = ""
        self._cursor: dict[str, Any] = {}
        self._renewed = memory.clock()  # when the running task's lease was last renewed

    # Running -------------------------------------------------------------------------

    async def run(
        self, tasks: Sequence[str] = TASKS, *, due_only: bool = False
    ) -> list[TaskReport]:
        """Run ``tasks`` in order; ``due_only`` skips those not due yet (the server's loop).

        Raises:
            InvalidInput: an unknown task name.
        """
        unknown = [t for t in tasks if t not in TASKS]
        if unknown:
            raise InvalidInput(f"unknown task {unknown[0]!r}; use one of: {', '.join(TASKS)}")
        await self.memory.embeddings.settle()
        reports = []
        for name in TASKS:
            if name in tasks:
                reports.append(await self._run_one(name, due_only=due_only))
        return reports

    def not_due(self, state: TaskState | None, now: datetime) -> str:
        """Why a task is not due yet ('' when it is)."""
        if state is None:
            return ""
        stamp = format_time(now)
        # A re-embedding that waits out an outage goes as soon as the embedder is back.
        recovered = state.task == "reembed" and self.memory.embeddings.ready
        if state.retry_after and stamp < state.retry_after and not recovered:
            return f"waiting until {state.retry_after} after a failure: {state.last_error}"
        if state.last_summary.get("pending") and not state.last_error:
            return ""  # it stopped with work left: go on
        if state.task == "secrets":
            return self._secrets_not_due(state)
        if state.task != "reembed" and state.last_finished_at and not state.last_error:
            due = parse_time(state.last_finished_at) + timedelta(
                minutes=self.settings.interval_minutes
            )
            if now < due:
                return f"next run at {format_time(due)}"
        return ""

    async def _run_one(self, name: str, *, due_only: bool) -> TaskReport:
        now = self.memory.clock()
        claimed = await self.db.now()  # the lease runs on the store's clock
        if not self.dry_run and not await self._claim(name, claimed):
            return TaskReport(name, skipped="another process is running it")
        # Read under the lease: another process may have run it a moment ago.
        state = (await self.db.tasks()).get(name) or TaskState(task=name)
        if due_only and (why := self.not_due(state, now)):
            await self._release(name)
            return TaskReport(name, skipped=why)
        self._task, self._cursor = name, dict(state.cursor)
        self._renewed = claimed
        self._say(name)
        work: Callable[[], Awaitable[TaskReport]] = getattr(self, f"_{name}")
        try:
            report = await work()
        except LeaseLost:
            return TaskReport(name, skipped="another process took its lease over")
        except Exception as exc:
            log.warning("maintenance task %s failed: %s", name, exc, exc_info=True)
            state.failures += 1
            wait = min(
                self.settings.retry_minutes * 2 ** (state.failures - 1),
                self.settings.retry_max_minutes,
            )
            state.retry_after = format_time(self.memory.clock() + timedelta(minutes=wait))
            state.last_error = str(exc) or type(exc).__name__
            report = TaskReport(name, error=state.last_error)
        except BaseException:  # cancelled (the server stops): let a restart take it at once
            with anyio.CancelScope(shield=True):
                await self._release(name)
            raise
        else:
            state.failures, state.retry_after, state.last_error = 0, None, None
        state.last_started_at = format_time(now)
        state.last_finished_at = format_time(self.memory.clock())
        state.last_summary = report.to_json()
        state.cursor = self._cursor
        if not self.dry_run:
            async with self.db.write() as tx:
                await tx.finish(state, self.holder)
        return report

    async def _release(self, task: str) -> None:
        if not self.dry_run:
            async with self.db.write() as tx:
                await tx.release(task, self.holder)

    async def _claim(self, task: str, now: datetime) -> bool:
        """Take ``task``'s lease from ``now``, the store's time (``Store.now``)."""
        until = now + timedelta(seconds=self.settings.lease_seconds)
        async with self.db.write() as tx:
            return await tx.claim(task, self.holder, format_time(now), format_time(until))

    async def _renew(self) -> None:
        """Extend the running task's lease and save its cursor; raise if it was lost."""
        if self.dry_run:
            return
        now = await self.db.now()
        until = now + timedelta(seconds=self.settings.lease_seconds)
        async with self.db.write() as tx:
            kept = await tx.claim(
                self._task, self.holder, format_time(now), format_time(until), self._cursor
            )
        if not kept:
            raise LeaseLost(self._task)
        self._renewed = now

    async def _keep_lease(self) -> None:
        """Renew the lease if a third of it has gone by (before a slow LLM call)."""
        elapsed = (await self.db.now() - self._renewed).total_seconds()
        if elapsed > self.settings.lease_seconds / 3:
            await self._renew()

    # secrets -------------------------------------------------------------------------

    def _secrets_not_due(self, state: TaskState) -> str:
        if self.memory.settings.write.secrets == "off":
            return "write.secrets is off"
        if state.cursor.get("rules") == FINGERPRINT:
            return "the stored texts were scanned with the current rules"
        return ""

    async def _secrets(self) -> TaskReport:
        """Scan every stored text again when the secret rules changed since the last scan.

        A record stored before a rule existed keeps its secret in the database, the
        full-text index and its vectors until then (searches and the brief redact what
        they show meanwhile). Counts are by kind; no secret goes to a log or summary.
        """
        if self.memory.settings.write.secrets == "off":
            return TaskReport("secrets", skipped="write.secrets is off")
        if self._cursor.get("rules") == FINGERPRINT:
            return TaskReport("secrets")
        resuming = self._cursor.get("scanning") == FINGERPRINT
        mark = _position(self._cursor) if resuming else None
        scanned, changed = 0, 0
        kinds: Counter[str] = Counter()
        while batch := await self.db.after(CORPORA, mark, _BATCH, current_only=False):
            holding = [record.id for _, record in batch if redact_record(record)[1]]
            if holding:
                async with self.db.write() as tx:
                    for record_id in holding:
                        record = await tx.get(record_id)  # as it is now, not as it was read
                        if record is None:
                            continue
                        clean, found_kinds = redact_record(record)
                        if found_kinds and await tx.rewrite_texts(clean):
                            changed += 1
                            kinds.update(found_kinds)
            scanned += len(batch)
            mark = batch[-1][0]
            self._cursor = {"scanning": FINGERPRINT, "seq": mark}
            await self._renew()
        self._cursor = {"rules": FINGERPRINT}
        counts = {"scanned": scanned, "redacted": changed, **dict(sorted(kinds.items()))}
        return TaskReport("secrets", counts=counts)

    # reembed -------------------------------------------------------------------------

    async def _reembed(self) -> TaskReport:
        embeddings = self.memory.embeddings
        identity = embeddings.identity
        if identity is None:
            return TaskReport("reembed", skipped="no dense embedder (lexical search only)")
        pending = await self.db.count_needing_embedding(identity)
        if not pending:
            return TaskReport("reembed")
        if not embeddings.ready:
            raise EmbedderError(
                f"{pending} records await vectors from {identity}, which is not ready: "
                f"{embeddings.status().reason}"
            )
        done = 0
        while True:
            summary = await self.memory.reembed(batch_size=_REEMBED_BATCH, most=_REEMBED_ROUND)
            done += summary.embedded
            if not summary.remaining or not summary.embedded:
                break
            await self._renew()
        return TaskReport("reembed", counts={"embedded": done}, pending=summary.remaining)

    # consolidate ---------------------------------------------------------------------

    def _dense(self) -> str | None:
        """The embedder whose vectors maintenance compares, or None (words only).

        Raises:
            EmbedderError: a dense embedder is configured but not ready (wait for it).
        """
        embeddings = self.memory.embeddings
        if embeddings.identity is None:
            return None
        if not embeddings.ready:
            raise EmbedderError(
                f"waiting for the embedder {embeddings.identity}: {embeddings.status().reason}"
            )
        return embeddings.identity

    async def _consolidate(self) -> TaskReport:
        """Compare each fact written since the last sweep with its nearest facts."""
        if not self.settings.consolidate:
            return TaskReport("consolidate", skipped="maintenance.consolidate is off")
        identity = self._dense()
        self.db.forget_word_counts()  # fresh, as on a dry run's copy: the same candidates
        mark = _position(self._cursor) if self._cursor.get("embedder") == identity else None
        counts: Counter[str] = Counter()
        compared = 0
        while True:
            batch = await self.db.after(("facts",), mark, _BATCH)
            if not batch:
                break
            for seq, listed in batch:
                if self.sweep_budget is not None and compared >= self.sweep_budget:
                    self._cursor = {"embedder": identity, "seq": mark}
                    left = await self.db.count_after(("facts",), mark)
                    return TaskReport("consolidate", counts=dict(counts), pending=left)
                record = await self.db.get(listed.id)
                if record is None or not record.current:
                    mark = seq
                    continue
                if identity is not None and record.embedder != identity:
                    # Awaiting its vectors: the next run resumes here, after re-embedding.
                    pending = await self.db.count_needing_embedding(identity)
                    self._cursor = {"embedder": identity, "seq": mark}
                    return TaskReport("consolidate", counts=dict(counts), pending=pending)
                action = await self._consolidate_one(record, identity)
                if action:
                    counts[action] += 1
                mark = seq
                compared += 1
            self._cursor = {"embedder": identity, "seq": mark}
            await self._renew()
        return TaskReport("consolidate", counts=dict(counts))

    async def _consolidate_one(self, record: Record, identity: str | None) -> str | None:
        vectors = await self.db.vectors_of(record.id, identity) if identity else None
        filters = Filters(scope_keys=(record.scope_key,), corpora=("facts",))
        fold_settings = self.memory.settings.fold
        found = await neighbours(self.db, record, vectors, identity, filters, fold_settings)
        for other, similarity in found:
            old, new = sorted((record, other), key=lambda r: (r.created_at, r.id))
            decision = decide(compare(old.content, new.content, similarity), fold_settings)
            if decision.action == "insert":
                continue
            if decision.action == "conflict" and await self.db.conflict_between(old.id, new.id):
                continue  # already in the inbox (or resolved by the operator)
            return await self._apply(decision.action, decision.reason, old, new, identity)
        return None

    async def _apply(
        self, action: str, reason: str, old: Record, new: Record, identity: str | None
    ) -> str | None:
        """Write one decision of the sweep, if both records are still as they were read."""
        at = format_time(self.memory.clock())
        async with self.db.write() as tx:
            old_now, new_now = await tx.get(old.id), await tx.get(new.id)
            if (
                old_now is None
                or new_now is None
                or not (old_now.current and new_now.current)
                or (old_now.content, new_now.content) != (old.content, new.content)
            ):
                return None
            if action == "fold":
                entry = absorb(new_now, old_now, at)
                await tx.update_merged(new_now, at)
                if identity is not None and old_now.embedder == new_now.embedder == identity:
                    await tx.carry_vectors(old_now.id, new_now.id, identity)
                await tx.fold_into(old_now, new_now.id, entry, at)
            elif action == "supersede":
                history = [*old_now.supersedes, old_now.id]
                new_now.supersedes = list(dict.fromkeys([*history, *new_now.supersedes]))
                await tx.update_merged(new_now, at)
                await tx.replace(old_now, new_now.id)
            else:
                await tx.add_conflict(new_now.scope_key, new_now.id, old_now.id, reason, at)
        if action == "fold":
            await self._refine(new_now)
        return {"fold": "folded", "supersede": "superseded", "conflict": "conflicts"}[action]

    async def _refine(self, record: Record) -> None:
        """Let the LLM write a folded record's texts as one statement (if one is configured)."""
        if self.llm is None or self.dry_run:
            return
        texts = [record.content, *(m.content for m in record.merged_from)]
        text = await self._ask(refine_prompt(texts))
        if text is None or text == record.content:
            return
        at = format_time(self.memory.clock())
        previous = [*record.meta.get("previous_texts", [])]
        previous.append({"content": record.content, "replaced_at": at, "by": self.llm.name})
        record.meta = {**record.meta, "previous_texts": previous}
        record.content = text
        async with self.db.write() as tx:
            changed = await tx.set_content(record, at)
        if changed:
            await self._embed_now([record.id])

    async def _ask(self, prompt: str) -> str | None:
        """The LLM's answer, cleaned and redacted like any write; None if it gave none.

        The task's lease is renewed first if a third of it has gone by: an answer
        may take up to ``llm_timeout``.
        """
        if self.llm is None or self.dry_run:
            return None
        await self._keep_lease()
        try:
            answer = await self.llm.complete(prompt)
        except LLMError as exc:
            log.warning("no answer from the LLM: %s", exc)
            return None
        text = clean_text(answer)
        if self.memory.settings.write.secrets != "off":
            text = redact(text).text
        if not text or len(text) > self.memory.settings.write.max_chars:
            return None
        return text

    async def _embed_now(self, record_ids: Sequence[str]) -> None:
        """Embed records whose vectors were dropped; re-embed catches up if this fails."""
        await embed_records(self.memory, record_ids)

    # insights ------------------------------------------------------------------------

    async def _insights(self) -> TaskReport:
        if not self.settings.insights:
            return TaskReport("insights", skipped="maintenance.insights is off")
        identity = self._dense()
        counts: Counter[str] = Counter()
        for scope_key in await self.db.scope_keys():
            written, retired = await self._scope_insights(scope_key, identity)
            counts["written"] += written
            counts["retired"] += retired
        return TaskReport("insights", counts=dict(counts))

    async def _scope_insights(self, scope_key: str, identity: str | None) -> tuple[int, int]:
        now = self.memory.clock()
        facts = await top_by_prior(
            self.memory, Filters(scope_keys=(scope_key,), corpora=("facts",)), now, INSIGHT_POOL
        )
        groups = await self._groups(facts, identity)
        wanted = {_fingerprint(group): group for group in groups}
        existing = await self.db.current(
            Filters(scope_keys=(scope_key,), corpora=("insights",)), 100_000
        )
        have = {str(r.meta.get("fingerprint", "")): r for r in existing}
        stale = [r for fp, r in have.items() if fp not in wanted]
        stale += [r for r in existing if have.get(str(r.meta.get("fingerprint", ""))) is not r]
        fresh = [(fp, group) for fp, group in wanted.items() if fp not in have]
        at = format_time(now)
        records = [await self._insight(group, fp, at) for fp, group in fresh]
        for start in range(0, max(len(records), len(stale)), _BATCH):
            async with self.db.write() as tx:
                for record in records[start : start + _BATCH]:
                    await tx.insert(record, None)
                for old in stale[start : start + _BATCH]:
                    await tx.archive(old.id, "regenerated", at)
            await self._renew()
        if records and not self.dry_run:
            await self._embed_now([r.id for r in records])
        return len(records), len(stale)

    async def _groups(self, facts: list[Record], identity: str | None) -> list[list[Record]]:
        """Facts related closely enough to summarize together, each group best first.

        Pairs are joined most similar first; a join that would make a group larger
        than ``insight_max_facts`` is left out, so that groups stay topics.
        """
        if len(facts) < self.settings.insight_min_facts:
            return []
        similarity, threshold = await self._similarities(facts, identity)
        labels = await anyio.to_thread.run_sync(
            _join, similarity, threshold, self.settings.insight_max_facts
        )
        members: dict[int, list[Record]] = {}
        for label, fact in zip(labels, facts, strict=True):  # best first: so are the members
            members.setdefault(label, []).append(fact)
        return [g for g in members.values() if len(g) >= self.settings.insight_min_facts]

    async def _similarities(
        self, facts: list[Record], identity: str | None
    ) -> tuple[Matrix, float]:
        """Pairwise similarity of the facts and the threshold that relates two of them."""
        if identity is not None:
            vectors: list[Vector | None] = [await self.db.vectors_of(f.id, identity) for f in facts]
            if all(v is not None for v in vectors):
                matrix = np.stack([v[0] for v in vectors if v is not None]).astype(np.float32)
                matrix /= np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
                return matrix @ matrix.T, self.settings.insight_similarity
        texts = [f.content for f in facts]
        return await anyio.to_thread.run_sync(_overlaps, texts), LEXICAL_INSIGHT_SIMILARITY

    async def _insight(self, group: list[Record], fingerprint: str, at: str) -> Record:
        """The insight record of a group: an LLM summary, else highlights and keywords."""
        keywords = _keywords([f.content for f in group])
        content = await self._ask(insight_prompt([f.content for f in group]))
        method = self.llm.name if content and self.llm else "rules"
        if not content:
            content = _rule_summary(group, keywords)
        first = group[0]
        return Record(
            id=new_id("insights"),
            corpus="insights",
            kind="insight",
            scope=first.scope,
            scope_key=first.scope_key,
            content=content,
            agent="memory-mcp",
            created_at=at,
            updated_at=at,
            tags=list(dict.fromkeys(t for f in group for t in f.tags))[:20],
            importance=0.75,
            meta={
                "sources": [f.id for f in group],
                "keywords": keywords,
                "fingerprint": fingerprint,
                "method": method,
            },
        )

    # staleness -----------------------------------------------------------------------

    async def _staleness(self) -> TaskReport:
        days = self.settings.dormant_days
        if days < 0:
            return TaskReport("staleness", skipped="maintenance.dormant_days is negative (off)")
        now = self.memory.clock()
        quiet_since = format_time(now - timedelta(days=days))
        created_before = format_time(now - timedelta(days=self.settings.stale_days))
        at = format_time(now)
        counts: Counter[str] = Counter()
        for scope_key, last in sorted((await self.db.project_activity()).items()):
            if last >= quiet_since:
                continue
            archived = 0
            while facts := await self.db.unused_facts(scope_key, created_before, _BATCH):
                async with self.db.write() as tx:
                    for fact in facts:
                        archived += await tx.archive(fact.id, "dormant", at)
                await self._renew()
            if archived:
                counts["archived"] += archived
                counts["projects"] += 1
        return TaskReport("staleness", counts=dict(counts))

    # purge ---------------------------------------------------------------------------

    async def _purge(self) -> TaskReport:
        now = self.memory.clock()
        before = format_time(now - timedelta(days=self.settings.grace_days))
        purged = 0
        while old := await self.db.archived(before=before, limit=_BATCH):
            async with self.db.write() as tx:
                purged += await tx.purge([r.id for r in old], before, format_time(now))
            await self._renew()
        return TaskReport("purge", counts={"purged": purged})


async def embed_records(memory: MemoryService, record_ids: Sequence[str]) -> int:
    """Give records their vectors now (restored, refined, new insights); how many got one.

    A few records per model call, so that searches waiting for the model are not
    held up; what cannot be embedded now waits for the re-embed task.
    """
    identity = memory.embeddings.identity
    records = [r for r in await memory.db.get_many(record_ids) if r.current]
    if identity is None:
        return 0
    done = 0
    for start in range(0, len(records), _REEMBED_BATCH):
        batch = records[start : start + _REEMBED_BATCH]
        vectors = await memory._embed_records(
            [r.content for r in batch], merged=[[m.content for m in r.merged_from] for r in batch]
        )
        if vectors is None:
            break
        async with memory.db.write() as tx:
            done += await tx.set_vectors(list(zip(batch, vectors, strict=True)), identity)
    return done


async def dry_run(
    memory: MemoryService, tasks: Sequence[str] = TASKS, *, progress: Progress | None = None
) -> list[TaskReport]:
    """What ``run`` would do now: the same tasks on a copy of the database, thrown away."""
    async with memory.db.scratch_copy() as store:
        shadow = MemoryService(memory.settings, store, memory.embeddings, clock=memory.clock)
        return await Maintenance(shadow, dry_run=True, progress=progress).run(tasks)


def _position(cursor: dict[str, Any]) -> Position | None:
    """Where a task's walk over the records stopped (the store's opaque position)."""
    seq = cursor.get("seq")
    return None if seq is None else str(seq)


def _join(similarity: Matrix, threshold: float, most: int) -> list[int]:
    """A group label per item (off the event loop).

    Pairs at or above ``threshold`` are joined most similar first, unless the
    joined group would hold more than ``most``.
    """
    n = similarity.shape[0]
    first, second = np.triu_indices(n, k=1)
    values = similarity[first, second]
    keep = np.flatnonzero(values >= threshold)
    order = keep[np.lexsort((second[keep], first[keep], -values[keep]))]
    parent = list(range(n))
    size = [1] * n

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for k in order.tolist():
        a, b = root(int(first[k])), root(int(second[k]))
        if a != b and size[a] + size[b] <= most:
            parent[b] = a
            size[a] += size[b]
    return [root(i) for i in range(n)]


def _overlaps(texts: Sequence[str]) -> Matrix:
    """Pairwise word overlap (Jaccard of stems), upper triangle; off the event loop."""
    words = [frozenset(stems(t)) for t in texts]
    n = len(texts)
    out = np.zeros((n, n), dtype=np.float32)
    for i in range(n):
        for j in range(i + 1, n):
            union = len(words[i] | words[j])
            out[i, j] = len(words[i] & words[j]) / union if union else 0.0
    return out


async def loop(memory: MemoryService) -> None:
    """The server's maintenance: every ``check_seconds``, the tasks that are due. Never raises.

    Re-embedding is due whenever records await vectors; the other tasks every
    ``interval_minutes``, and at once while a sweep has facts left; a failed task
    waits out its back-off.
    """
    settings = memory.settings.maintenance
    await memory.embeddings.wait_settled(120)
    worker: Maintenance | None = None
    while True:
        try:
            worker = worker or Maintenance(memory, sweep_budget=settings.sweep_facts)
            for report in await worker.run(due_only=True):
                if any(report.counts.values()) or report.error:
                    log.info("maintenance %s: %s", report.task, report.describe())
        except Exception:
            log.warning("maintenance failed", exc_info=True)
        await anyio.sleep(settings.check_seconds)


def _fingerprint(group: Sequence[Record]) -> str:
    """What an insight was made from: its sources and their texts."""
    parts = sorted(f"{r.id}:{hashlib.sha256(r.content.encode()).hexdigest()[:16]}" for r in group)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _keywords(texts: Sequence[str]) -> list[str]:
    """Up to 12 words that most of the texts use (stop words left out), ties by first use."""
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update({w for w in content_words(text) if len(w) > 2 and not w.isdigit()})
    return [w for w, n in counts.most_common() if n > 1][:_KEYWORDS]


def _rule_summary(group: Sequence[Record], keywords: Sequence[str]) -> str:
    """Highlights (the group's best facts, shortened) and keywords."""
    topic = ", ".join(keywords[:4]) or "one topic"
    lines = [f"{len(group)} related memories about {topic}:"]
    ranked = sorted(group, key=lambda r: (-ranker.importance(r), -r.access_count, r.id))
    for record in ranked[:_HIGHLIGHTS]:
        flat = " ".join(record.content.split())
        if len(flat) > _HIGHLIGHT_CHARS:
            flat = flat[: _HIGHLIGHT_CHARS - 1].rstrip() + "…"
        lines.append(f"- {flat}")
    if keywords:
        lines.append("Keywords: " + ", ".join(keywords))
    return "\n".join(lines)


# The operator's actions -----------------------------------------------------------------


async def restore(memory: MemoryService, record_ids: Sequence[str]) -> list[Record]:
    """Bring archived records back exactly as they were (until the purge takes them).

    All or nothing: an unknown id, or one that is not archived, fails the call
    before anything changes. A record a fold had absorbed leaves the record that
    holds it. Vectors are made again at once when the embedder is ready (else
    re-embedding catches up).

    Raises:
        NotFound: no record has one of the ids (or it was purged).
        InvalidInput: a record is not archived.
    """
    ids = list(dict.fromkeys(i.strip() for i in record_ids if i.strip()))
    if not ids:
        raise InvalidInput("no id given; pass the ids of archived records (memory-mcp archived)")
    at = format_time(memory.clock())
    found: dict[str, Record] = {}
    async with memory.db.write() as tx:  # checked inside: nothing changes on an error
        for record_id in ids:
            record = await tx.get(record_id)
            if record is None:
                raise NotFound(f"no record with id {record_id!r} (purged records cannot come back)")
            if record.archived_at is None:
                raise InvalidInput(f"record {record_id} is not archived")
            found[record_id] = record
        restored = [r for r in [await tx.restore(i, at) for i in ids] if r is not None]
    holders = [r.replaced_by for r in found.values() if r.replaced_by]
    await embed_records(memory, [*ids, *holders])
    return await memory.db.get_many([r.id for r in restored])


async def archive_project(
    memory: MemoryService, cwd: str | Path | None, *, dry_run: bool = False
) -> int:
    """Archive every record of a finished project (reason ``project-done``); how many.

    History goes too, so the purge leaves nothing of the project behind once the
    grace window ends; ``restore`` brings any of it back until then.
    """
    scope_key = project_scope(cwd).key
    if dry_run:
        return await memory.db.count_unarchived(scope_key)
    archived = 0
    at = format_time(memory.clock())
    while batch := await memory.db.unarchived(scope_key, _BATCH):
        async with memory.db.write() as tx:
            for record_id in batch:
                archived += await tx.archive(record_id, "project-done", at)
    return archived


@dataclass
class ConflictView:
    """An open conflict with both texts: one line of the operator's inbox."""

    conflict: Conflict
    new: Record | None
    old: Record | None

    def to_json(self) -> dict[str, Any]:
        return {
            **self.conflict.to_json(),
            "new": None if self.new is None else self.new.to_json(),
            "old": None if self.old is None else self.old.to_json(),
        }


async def open_conflicts(memory: MemoryService) -> list[ConflictView]:
    """The operator's inbox: every open conflict, oldest first, with both records."""
    views = []
    for conflict in await memory.db.conflicts(open_only=True):
        pair = {r.id: r for r in await memory.db.get_many([conflict.record_id, conflict.other_id])}
        views.append(
            ConflictView(conflict, pair.get(conflict.record_id), pair.get(conflict.other_id))
        )
    return views


Keep = Literal["new", "old", "both", "merged"]


async def resolve_conflict(
    memory: MemoryService, conflict_id: int, keep: Keep, text: str | None = None
) -> tuple[Conflict, Record | None]:
    """Close a conflict: keep the newer record, the older, both, or a merged text.

    - ``new``: the older record becomes history of the newer (as a supersede);
    - ``old``: the newer record is archived (reason ``conflict-<id>``; restorable);
    - ``both``: both stay current;
    - ``merged``: a new record with ``text`` replaces both (they become its history).

    Returns the conflict as closed, and the record written for ``merged``.

    Raises:
        NotFound: no such conflict, or one of its records is gone.
        InvalidInput: it is already resolved, a record is no longer current, or
            ``text`` is missing (for merged) or given for another choice.
    """
    conflict = await memory.db.conflict(conflict_id)
    if conflict is None:
        raise NotFound(f"no conflict #{conflict_id} (memory-mcp conflicts lists the open ones)")
    if conflict.resolved_at is not None:
        raise InvalidInput(f"conflict #{conflict_id} was already resolved ({conflict.resolution})")
    if keep not in ("new", "old", "both", "merged"):
        raise InvalidInput(f"keep must be new, old, both or merged, got {keep!r}")
    if (keep == "merged") != bool(text and text.strip()):
        raise InvalidInput(
            "--text is required with --keep merged (the statement that replaces both)"
            if keep == "merged"
            else "--text goes only with --keep merged"
        )
    pair = {r.id: r for r in await memory.db.get_many([conflict.record_id, conflict.other_id])}
    new, old = pair.get(conflict.record_id), pair.get(conflict.other_id)
    if new is None or old is None:
        raise NotFound(f"a record of conflict #{conflict_id} no longer exists")
    if keep != "both":
        for record in (new, old):
            if not record.current:
                state = record.archived_reason or "replaced"
                raise InvalidInput(
                    f"record {record.id} is no longer current ({state}); "
                    "restore it first or keep both"
                )
    at = format_time(memory.clock())
    merged: Record | None = None
    vectors: list[Vector] | None = None
    if keep == "merged":
        assert text is not None
        draft = prepare(
            text,
            kind=new.kind,
            scope=Scope(new.scope, new.scope_key),
            importance=max(
                (x for x in (new.importance, old.importance) if x is not None), default=None
            ),
            tags=list(dict.fromkeys([*old.tags, *new.tags])),
            agent="cli",
            at=memory.clock(),
            settings=memory.settings.write,
        )
        merged = draft.record
        merged.supersedes = list(dict.fromkeys([*old.supersedes, old.id, *new.supersedes, new.id]))
        vectors = await memory._embed_records([merged.content])
        if vectors is not None:
            merged.embedder = memory.embeddings.identity
    resolution = {"new": "kept new", "old": "kept old", "both": "kept both"}.get(keep, "")
    async with memory.db.write() as tx:
        if keep != "both":  # as the transaction sees them: the server may have moved on
            for before in (new, old):
                now_ = await tx.get(before.id)
                if now_ is None or not now_.current or now_.content != before.content:
                    raise InvalidInput(
                        f"record {before.id} changed meanwhile; look at the conflict again"
                    )
        if keep == "new":
            new.supersedes = list(dict.fromkeys([*old.supersedes, old.id, *new.supersedes]))
            await tx.update_merged(new, at)
            await tx.replace(old, new.id)
        elif keep == "old":
            await tx.archive(new.id, f"conflict-{conflict_id}", at)
        elif merged is not None:
            await tx.insert(merged, vectors[0] if vectors else None)
            await tx.replace(old, merged.id)
            await tx.replace(new, merged.id)
            resolution = f"merged into {merged.id}"
        if not await tx.resolve_conflict(conflict_id, resolution, at):
            raise InvalidInput(f"conflict #{conflict_id} was resolved meanwhile")
    closed = await memory.db.conflict(conflict_id)
    assert closed is not None
    return closed, merged
