"""What a running maintenance task holds: its lease, its cursor, the LLM it may ask.

The runner (``maintenance.runner``) claims a task's lease and hands the task a
``TaskRun``; the task renews the lease through it between small transactions
(saving its cursor, so that a later run resumes there), and asks the LLM
through it, which renews first when an answer may outlast the lease.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from memory_mcp.config import MaintenanceSettings
from memory_mcp.engine import Engine
from memory_mcp.errors import EmbedderError
from memory_mcp.llm import LLM, LLMError
from memory_mcp.records import format_time
from memory_mcp.secret_scan import redact
from memory_mcp.storage.base import Position, summary_words
from memory_mcp.write import clean_text

log = logging.getLogger(__name__)

BATCH = 200  # records per transaction and between two lease renewals


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
        return summary_words(self.to_json())


class LeaseLost(RuntimeError):
    """Another process took the task's lease over (this one stalled past it)."""


class TaskRun:
    """One task's run: the engine, the task's lease and cursor, and the LLM."""

    def __init__(
        self,
        engine: Engine,
        task: str,
        *,
        holder: str,
        llm: LLM | None,
        dry_run: bool,
        cursor: dict[str, Any],
        claimed: datetime,
        sweep_budget: int | None = None,
    ) -> None:
        self.engine = engine
        self.store = engine.store
        self.settings: MaintenanceSettings = engine.settings.maintenance
        self.task = task
        self.holder = holder
        self.llm = llm
        self.dry_run = dry_run
        self.cursor = cursor  # saved with each renewal; the next run resumes from it
        self.sweep_budget = sweep_budget  # facts one consolidation run compares at most
        self._renewed = claimed  # when the lease was last renewed, on the store's clock

    def position(self) -> Position | None:
        """Where the task's walk over the records stopped (the store's opaque position)."""
        seq = self.cursor.get("seq")
        return None if seq is None else str(seq)

    async def renew(self) -> None:
        """Extend the lease and save the cursor; raise ``LeaseLost`` if it was lost."""
        if self.dry_run:
            return
        now = await self.store.now()
        until = now + timedelta(seconds=self.settings.lease_seconds)
        async with self.store.write() as tx:
            kept = await tx.claim(
                self.task, self.holder, format_time(now), format_time(until), self.cursor
            )
        if not kept:
            raise LeaseLost(self.task)
        self._renewed = now

    async def keep_lease(self) -> None:
        """Renew the lease if a third of it has gone by (before a slow LLM call)."""
        elapsed = (await self.store.now() - self._renewed).total_seconds()
        if elapsed > self.settings.lease_seconds / 3:
            await self.renew()

    def dense(self) -> str | None:
        """The embedder whose vectors the task compares, or None (words only).

        Raises:
            EmbedderError: a dense embedder is configured but not ready (wait for it).
        """
        embeddings = self.engine.embeddings
        if embeddings.identity is None:
            return None
        if not embeddings.ready:
            raise EmbedderError(
                f"waiting for the embedder {embeddings.identity}: {embeddings.status().reason}"
            )
        return embeddings.identity

    async def ask(self, prompt: str) -> str | None:
        """The LLM's answer, cleaned and redacted like any write; None if it gave none.

        The lease is renewed first if a third of it has gone by: an answer may
        take up to ``llm_timeout``.
        """
        if self.llm is None or self.dry_run:
            return None
        await self.keep_lease()
        try:
            answer = await self.llm.complete(prompt)
        except LLMError as exc:
            log.warning("no answer from the LLM: %s", exc)
            return None
        text = clean_text(answer)
        write = self.engine.settings.write
        if write.secrets != "off":
            text = redact(text).text
        if not text or len(text) > write.max_chars:
            return None
        return text
