"""``status``: the store, the embedder, the counts, the maintenance tasks and the agent CLIs."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from memory_mcp import views
from memory_mcp.cli.base import (
    CwdOption,
    JsonOption,
    ago,
    out,
    print_json,
    short,
    with_memory,
)
from memory_mcp.cli.projects import HOW
from memory_mcp.cli.upkeep import Task
from memory_mcp.records import format_time
from memory_mcp.scope import project_root
from memory_mcp.service import MemoryService, Status

STATES = ("current", "history", "archived")


def status(cwd: CwdOption = None, as_json: JsonOption = False) -> None:
    """Show the storage backend and its size, the embedder (effective / configured), counts."""

    async def use(memory: MemoryService) -> tuple[Status, dict[str, Any]]:
        return await memory.status(), views.project(await memory.project(cwd))

    from memory_mcp.agents.install import inspect

    info, identity = with_memory(cwd, use, embeds=False, probe=True)
    root = project_root(cwd)
    project = str(root)
    agents = inspect(root)
    if as_json:
        data = asdict(info)
        data["project"] = project
        data["identity"] = identity
        data["stats"]["records"] = [
            {"corpus": c, "scope": s, "state": st, "count": n}
            for (c, s, st), n in info.stats.records.items()
        ]
        data["agents"] = [setup.to_json() for setup in agents]
        print_json(data)
        return
    e = info.embedder
    size = f"{info.database_bytes / 1e6:.1f} MB"
    if info.stats.cache_bytes:
        size += f"; {info.stats.cache_bytes / 1e6:.1f} MB of vectors kept beside it"
    out.print(f"storage         {info.backend}: {info.database} ({size})")
    out.print(f"driver          {info.driver}")
    effective = e.effective if e.effective != "bm25" else "bm25 (lexical floor, no vectors)"
    out.print(f"embedder        {effective}  [configured: {e.configured}, state: {e.state}]")
    if e.identity and e.identity != e.effective:
        out.print(f"store vectors   {e.identity}")
    if e.degraded:
        out.print(f"degraded        {e.reason}")
    elif e.state == "available":
        out.print(f"model           {e.reason.removeprefix('not loaded by this command; ')}")
    out.print(f"awaiting embed  {info.awaiting_embedding}")
    out.print(f"project         {project}")
    out.print(f"project key     {identity['key']}  ({HOW[identity['how']]})")
    attached = [a["alias"] for a in identity["aliases"] if a["detached_at"] is None]
    if attached:
        out.print(f"aliases         {', '.join(attached)}")
    out.print(f"settings        {', '.join(info.settings_sources) or 'defaults'}")
    keys = sorted({(c, s) for c, s, _ in info.stats.records})
    rows = [
        [corpus, scope] + [str(info.stats.records.get((corpus, scope, st), 0)) for st in STATES]
        for corpus, scope in keys
    ]
    if rows:
        out.table(("corpus", "scope", *STATES), rows)
    else:
        out.print("records         none yet")
    out.print(f"open conflicts  {info.stats.open_conflicts}")
    _print_tasks(info)
    out.print("agent CLIs (memory-mcp install)")
    out.table(
        ("cli", "server", "session-start hook"),
        [
            [s.agent, ", ".join(s.servers) or "not installed", ", ".join(s.hooks) or "none"]
            for s in agents
        ],
    )
    for setup in agents:
        for step in setup.todo:
            out.print(f"to do ({setup.agent}): {step}")


def _print_tasks(info: Status) -> None:
    """When each maintenance task last ran, what it did, and what waits."""

    now = datetime.now(UTC)
    rows: list[list[str]] = []
    for name in Task:  # the maintenance tasks, without importing maintenance (status is fast)
        state = info.tasks.get(name)
        if state is None or state.last_finished_at is None:
            rows.append([name, "never", "", ""])
            continue
        if state.last_error:
            result = f"failed ({state.failures}x): {short(state.last_error, 60)}"
        else:
            result = short(state.outcome, 80)
        later = f"retry after {state.retry_after}" if state.retry_after else ""
        if state.holder and state.lease_until and state.lease_until > format_time(now):
            later = f"running ({state.holder})"
        rows.append([name, ago(state.last_finished_at, now), result, later])
    out.print("maintenance")
    out.table(("task", "last run", "result", "next"), rows)
