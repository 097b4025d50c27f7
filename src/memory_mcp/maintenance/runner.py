"""The maintenance runner: which tasks are due, their leases, their state, their back-off.

``Maintenance.run`` runs tasks in order (``TASKS``). For each it claims the
task's lease on the store's clock, reads its state under the lease, hands the
task a ``TaskRun`` and records what it did, its cursor and, on a failure, when
to try again (the wait doubles, up to ``retry_max_minutes``). ``loop`` is the
server's: every ``check_seconds``, the tasks that are due. ``dry_run`` runs the
same tasks on the store's scratch copy.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta

import anyio

from memory_mcp.engine import Engine
from memory_mcp.errors import InvalidInput
from memory_mcp.llm import LLM, build_llm
from memory_mcp.maintenance import tasks
from memory_mcp.maintenance.context import LeaseLost, TaskReport, TaskRun
from memory_mcp.maintenance.insights import insights
from memory_mcp.records import format_time, parse_time
from memory_mcp.storage.base import TaskState

log = logging.getLogger(__name__)

# secrets first: the vectors it drops are made again by reembed in the same run.
TASKS: tuple[str, ...] = ("secrets", "reembed", "consolidate", "insights", "staleness", "purge")
_WORK: dict[str, Callable[[TaskRun], Awaitable[TaskReport]]] = {
    "secrets": tasks.secrets,
    "reembed": tasks.reembed,
    "consolidate": tasks.consolidate,
    "insights": insights,
    "staleness": tasks.staleness,
    "purge": tasks.purge,
}

Progress = Callable[[str], None]

QUIET_S = 2.0  # without a store or search, before a round of the server's loop


def holder_name() -> str:
    """This process, as a lease holder: host, pid and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Maintenance:
    """Runs the tasks on one engine's store."""

    def __init__(
        self,
        engine: Engine,
        *,
        holder: str | None = None,
        llm: LLM | None = None,
        dry_run: bool = False,
        progress: Progress | None = None,
        sweep_budget: int | None = None,
    ) -> None:
        self.engine = engine
        self.store = engine.store
        self.settings = engine.settings.maintenance
        self.holder = holder or holder_name()
        self.llm = llm if llm is not None else build_llm(self.settings)
        self.dry_run = dry_run
        self.sweep_budget = sweep_budget  # facts one consolidation run compares at most
        self._say = progress or (lambda _: None)

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
        await self.engine.embeddings.settle()
        await self.engine.write_accesses()  # this process's searches' hits, counted
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
        recovered = state.task == "reembed" and self.engine.embeddings.ready
        if state.retry_after and stamp < state.retry_after and not recovered:
            return f"waiting until {state.retry_after} after a failure: {state.last_error}"
        if state.last_summary.get("pending") and not state.last_error:
            return ""  # it stopped with work left: go on
        if state.task == "secrets":
            return tasks.secrets_not_due(self.engine.settings.write.secrets, state)
        if state.task != "reembed" and state.last_finished_at and not state.last_error:
            due = parse_time(state.last_finished_at) + timedelta(
                minutes=self.settings.interval_minutes
            )
            if now < due:
                return f"next run at {format_time(due)}"
        return ""

    async def _run_one(self, name: str, *, due_only: bool) -> TaskReport:
        clock = self.engine.clock
        now = clock()
        claimed = await self.store.now()  # the lease runs on the store's clock
        if not self.dry_run and not await self._claim(name, claimed):
            return TaskReport(name, skipped="another process is running it")
        # Read under the lease: another process may have run it a moment ago.
        state = (await self.store.tasks()).get(name) or TaskState(task=name)
        if due_only and (why := self.not_due(state, now)):
            await self._release(name)
            return TaskReport(name, skipped=why)
        run = TaskRun(
            self.engine,
            name,
            holder=self.holder,
            llm=self.llm,
            dry_run=self.dry_run,
            cursor=dict(state.cursor),
            claimed=claimed,
            sweep_budget=self.sweep_budget,
        )
        self._say(name)
        try:
            report = await _WORK[name](run)
        except LeaseLost:
            return TaskReport(name, skipped="another process took its lease over")
        except Exception as exc:
            log.warning("maintenance task %s failed: %s", name, exc, exc_info=True)
            state.failures += 1
            wait = min(
                self.settings.retry_minutes * 2 ** (state.failures - 1),
                self.settings.retry_max_minutes,
            )
            state.retry_after = format_time(clock() + timedelta(minutes=wait))
            state.last_error = str(exc) or type(exc).__name__
            report = TaskReport(name, error=state.last_error)
        except BaseException:  # cancelled (the server stops): let a restart take it at once
            with anyio.CancelScope(shield=True):
                await self._release(name)
            raise
        else:
            state.failures, state.retry_after, state.last_error = 0, None, None
        state.last_started_at = format_time(now)
        state.last_finished_at = format_time(clock())
        state.last_summary = report.to_json()
        state.cursor = run.cursor
        if not self.dry_run:
            async with self.store.write() as tx:
                await tx.finish(state, self.holder)
        return report

    async def _release(self, task: str) -> None:
        if not self.dry_run:
            async with self.store.write() as tx:
                await tx.release(task, self.holder)

    async def _claim(self, task: str, now: datetime) -> bool:
        """Take ``task``'s lease from ``now``, the store's time (``Store.now``)."""
        until = now + timedelta(seconds=self.settings.lease_seconds)
        async with self.store.write() as tx:
            return await tx.claim(task, self.holder, format_time(now), format_time(until))


async def dry_run(
    engine: Engine, tasks: Sequence[str] = TASKS, *, progress: Progress | None = None
) -> list[TaskReport]:
    """What ``run`` would do now: the same tasks on a copy of the database, thrown away."""
    async with engine.store.scratch_copy() as store:
        shadow = Engine(engine.settings, store, engine.embeddings, clock=engine.clock)
        return await Maintenance(shadow, dry_run=True, progress=progress).run(tasks)


async def loop(engine: Engine) -> None:
    """The server's maintenance: every ``check_seconds``, the tasks that are due. Never raises.

    Re-embedding is due whenever records await vectors; the other tasks every
    ``interval_minutes``, and at once while a sweep has facts left; a failed task
    waits out its back-off. Each round waits for ``QUIET_S`` without a store or
    search (at most ``check_seconds``), the first one too: a session's first calls
    come as its server starts, and a first search at 200,000 memories waited 0.4 s
    for a round (its reads, and the vectors of another scope it loaded).
    """
    settings = engine.settings.maintenance
    await engine.embeddings.wait_settled(120)
    worker: Maintenance | None = None
    while True:
        await engine.quiet(QUIET_S, settings.check_seconds)
        try:
            worker = worker or Maintenance(engine, sweep_budget=settings.sweep_facts)
            for report in await worker.run(due_only=True):
                if any(report.counts.values()) or report.error:
                    log.info("maintenance %s: %s", report.task, report.describe())
        except Exception:
            log.warning("maintenance failed", exc_info=True)
        await anyio.sleep(settings.check_seconds)
