"""Keeping the store in shape: ``maintain``, ``reembed``, the conflicts inbox,
``archived`` / ``restore``, ``project done``, ``doctor`` and ``backup``."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from memory_mcp.cli.base import (
    CwdOption,
    JsonOption,
    ago,
    err,
    out,
    print_json,
    progress_bar,
    settings_for,
    short,
    with_memory,
)
from memory_mcp.scope import project_root
from memory_mcp.service import MemoryService

if TYPE_CHECKING:
    from memory_mcp.maintenance import TaskReport

conflicts_app = typer.Typer(
    help="The operator's inbox: open conflicts, and `conflicts resolve`.",
    invoke_without_command=True,
)
project_app = typer.Typer(help="Whole-project actions.", no_args_is_help=True)


class Task(StrEnum):
    secrets = "secrets"
    reembed = "reembed"
    consolidate = "consolidate"
    insights = "insights"
    staleness = "staleness"
    purge = "purge"


def reembed(
    batch_size: Annotated[int, typer.Option(min=1, max=1024, help="Records per batch.")] = 64,
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Give every current record a vector from the active embedder (resumable)."""

    async def use(memory: MemoryService) -> Any:
        total = await memory.awaiting_embedding()
        with progress_bar("re-embedding", total) as report:
            return await memory.reembed(batch_size=batch_size, progress=report)

    summary = with_memory(cwd, use, needs_vectors=True)
    if as_json:
        print_json(asdict(summary))
    else:
        out.print(
            f"embedded {summary.embedded} records with {summary.embedder}; "
            f"{summary.remaining} remaining"
        )


def maintain(
    task: Annotated[
        list[Task] | None, typer.Option("--task", help="Run only this task (repeatable).")
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="Count what a run would do, on a copy of the database (no LLM)."
        ),
    ] = False,
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Run the maintenance tasks now: secrets, re-embed, consolidate, insights, staleness, purge."""
    chosen = [t.value for t in task] if task else None

    async def use(memory: MemoryService) -> list[TaskReport]:
        with err.console.status("maintenance") as spinner:

            def say(name: str) -> None:
                spinner.update(f"maintenance: {name}")

            return await memory.maintain(chosen, dry_run=dry_run, progress=say)

    reports = with_memory(cwd, use)
    if as_json:
        print_json({"dry_run": dry_run, "tasks": [r.to_json() for r in reports]})
    else:
        verb = "would do" if dry_run else "did"
        for report in reports:
            out.print(f"{report.task:<12} {verb}: {report.describe()}")
    if any(r.error for r in reports):
        raise typer.Exit(69)


@conflicts_app.callback()
def conflicts(ctx: typer.Context, cwd: CwdOption = None, as_json: JsonOption = False) -> None:
    """List the open conflicts: both texts, the scope and the age."""
    if ctx.invoked_subcommand is not None:
        return
    views = with_memory(cwd, MemoryService.conflicts, embeds=False)
    if as_json:
        print_json([v.to_json() for v in views])
        return
    if not views:
        out.print("no open conflicts")
        return
    now = datetime.now(UTC)
    for view in views:
        c = view.conflict
        where = c.scope_key or "global"
        out.print(f"#{c.id}  {where}  {ago(c.created_at, now)}  ({c.reason})")
        for label, record, record_id in (
            ("new", view.new, c.record_id),
            ("old", view.old, c.other_id),
        ):
            text = short(record.content) if record is not None else "(purged)"
            out.print(f"  {label} {record_id}: {text}")
    out.print("resolve with: memory-mcp conflicts resolve ID --keep new|old|both|merged")


class KeepChoice(StrEnum):
    new = "new"
    old = "old"
    both = "both"
    merged = "merged"


@conflicts_app.command("resolve")
def conflicts_resolve(
    conflict_id: Annotated[str, typer.Argument(help="The conflict's number, as listed (#3 or 3).")],
    keep: Annotated[KeepChoice, typer.Option(help="Which statement holds.")],
    text: Annotated[
        str | None, typer.Option(help="With --keep merged: the statement that replaces both.")
    ] = None,
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Resolve a conflict: keep the newer, the older, both, or a merged text."""
    number = conflict_id.strip().removeprefix("#")
    if not number.isdigit():
        err.print(f"error: {conflict_id!r} is not a conflict number; use one `conflicts` lists")
        raise typer.Exit(2)

    async def use(memory: MemoryService) -> Any:
        return await memory.resolve_conflict(int(number), keep.value, text)

    closed, merged = with_memory(cwd, use, embeds=text is not None)
    if as_json:
        print_json(
            {"conflict": closed.to_json(), "merged": None if merged is None else merged.to_json()}
        )
    else:
        out.print(f"conflict #{closed.id} resolved: {closed.resolution}")


def archived(
    reason: Annotated[str | None, typer.Option(help="Only those archived for this reason.")] = None,
    all_scopes: Annotated[
        bool, typer.Option("--all", help="Every project, not only this one and global.")
    ] = False,
    limit: Annotated[int, typer.Option(min=1, help="Most records to list.")] = 50,
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """List archived records, most recent first (restore them with `memory-mcp restore`)."""

    async def use(memory: MemoryService) -> Any:
        keys = () if all_scopes else await memory.scope_keys("all", cwd)
        return await memory.archived(keys, reason=reason, limit=limit)

    records = with_memory(cwd, use, embeds=False)
    if as_json:
        print_json([r.to_json() for r in records])
        return
    if not records:
        out.print("no archived records")
        return
    now = datetime.now(UTC)
    for record in records:
        assert record.archived_at is not None
        when = ago(record.archived_at, now)
        out.print(f"{record.id}  {record.archived_reason}  {when}  {short(record.content, 80)}")


def restore(
    record_ids: Annotated[list[str], typer.Argument(help="Ids of archived records.")],
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Bring archived records back exactly as they were (until the purge)."""

    async def use(memory: MemoryService) -> Any:
        records = await memory.restore(record_ids)
        return records, await memory.conflicts_of([r.id for r in records])

    records, reopened = with_memory(cwd, use)
    if as_json:
        print_json([r.to_json() for r in records])
    else:
        for record in records:
            out.print(f"{record.id} restored: {short(record.content, 80)}")
            if record.id in reopened:  # in the inbox (again, if a resolution set it aside)
                out.print(f"  in open conflict #{reopened[record.id]} (memory-mcp conflicts)")


@project_app.command("done")
def project_done(
    cwd: CwdOption = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only count.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Archive a finished project's records (reason project-done; restorable until purged)."""

    async def use(memory: MemoryService) -> int:
        return await memory.archive_project(cwd, dry_run=dry_run)

    count = with_memory(cwd, use, embeds=False)
    root = project_root(cwd)
    if as_json:
        print_json({"project": str(root), "archived": count, "dry_run": dry_run})
    else:
        verb = "would archive" if dry_run else "archived"
        out.print(f"{verb} {count} records of {root}")


def doctor(
    repair: Annotated[
        bool, typer.Option("--repair", help="Rebuild what disagrees with the records.")
    ] = False,
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Check the database: SQLite's integrity, the full-text and vector indexes, conflicts."""

    async def use(memory: MemoryService) -> Any:
        return await memory.doctor(repair=repair)

    found = with_memory(cwd, use, embeds=False)
    if as_json:
        print_json(found.to_json())
    else:
        for check in found.checks:
            state = "ok" if check.ok else ("repaired" if check.repaired else "PROBLEM")
            out.print(f"{check.name:<28} {state}")
            for problem in check.problems:
                out.print(f"  {problem}")
        if not found.healthy:
            hint = "run memory-mcp doctor --repair" if repair is False else "restore a backup"
            out.print(f"problems remain: {hint}")
    if not found.healthy:
        raise typer.Exit(74)


def backup(
    path: Annotated[Path, typer.Argument(help="The copy's file, or a directory for it.")],
    force: Annotated[bool, typer.Option("--force", help="Replace an existing file.")] = False,
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Copy the database while servers keep writing (a consistent, owner-only copy)."""

    async def use(memory: MemoryService) -> Path:
        return await memory.backup(path.expanduser(), force=force)

    written = with_memory(cwd, use, embeds=False)
    size = written.stat().st_size
    if as_json:
        print_json({"path": str(written), "bytes": size})
    else:
        out.print(f"backed up to {written} ({size / 1e6:.1f} MB)")
        database = _database(cwd)
        out.print(
            f"to restore: stop the servers, delete {database.name}-wal and {database.name}-shm "
            f"beside {database} if they are there, then copy the backup over {database}"
        )


def _database(cwd: Path | None) -> Path:
    return settings_for(cwd).settings.database_path()
