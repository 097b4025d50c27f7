"""``store``, ``search``, ``forget`` and ``brief``: the memories themselves."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from memory_mcp import views
from memory_mcp.cli.agents import CliChoice
from memory_mcp.cli.base import (
    CwdOption,
    JsonOption,
    ago,
    err,
    out,
    print_json,
    short,
    with_memory,
)
from memory_mcp.records import STORABLE_KINDS, Corpus, Hit, StoreResult
from memory_mcp.scope import project_root
from memory_mcp.service import MemoryService


def store(
    content: Annotated[str, typer.Argument(help="What to remember ('-' reads standard input).")],
    kind: Annotated[
        str, typer.Option("--kind", "-k", help=f"One of: {', '.join(STORABLE_KINDS)}.")
    ] = "fact",
    scope: Annotated[
        str, typer.Option(help="project (default) or global (every project).")
    ] = "project",
    importance: Annotated[float | None, typer.Option(help="0 to 1; inferred if omitted.")] = None,
    tag: Annotated[
        list[str] | None, typer.Option("--tag", "-t", help="A tag (repeatable).")
    ] = None,
    agent: Annotated[str, typer.Option(help="Who is writing (provenance).")] = "cli",
    private: Annotated[
        bool,
        typer.Option(
            "--private",
            help="Yours alone: no teammate sees it (global memories are personal anyway).",
        ),
    ] = False,
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Store a memory: it is folded, superseded, flagged as a conflict, or inserted."""
    text = sys.stdin.read() if content == "-" else content
    if scope not in ("project", "global"):
        err.print(f"error: --scope must be project or global, got {scope!r}")
        raise typer.Exit(2)

    async def use(memory: MemoryService) -> StoreResult:
        return await memory.store(
            text,
            kind=kind,
            scope="global" if scope == "global" else "project",
            cwd=cwd,
            importance=importance,
            tags=tag or [],
            agent=agent,
            private=private,
        )

    result = with_memory(cwd, use)
    if as_json:
        shown = views.stored(result)
        print_json(
            {**shown, "kind": result.kind, "scope": result.scope, "embedded": result.embedded}
        )
        return
    what = {
        "inserted": "stored",
        "appended": "appended to the journal",
        "folded": "stored; an existing memory said the same and is folded into it",
        "superseded": "stored; it supersedes an older memory",
        "conflict": "stored; it CONTRADICTS an existing memory (conflict recorded)",
        "replaced": f"stored; it replaces the previous {result.kind}",
    }[result.action]
    out.print(f"{result.id}  {what}")
    if result.related_id:
        out.print(f"  related: {result.related_id}  {short(result.related_content or '')}")
    for redaction in result.redactions:
        out.print(f"  redacted: {redaction.count} x {redaction.kind}")
    if not result.embedded:
        out.print("  note: stored without a vector (lexical floor); `memory-mcp reembed` adds it")


def search(
    query: Annotated[str, typer.Argument(help="What to look for.")],
    scope: Annotated[
        str, typer.Option(help="all (project + global, default), project or global.")
    ] = "all",
    kind: Annotated[
        list[str] | None, typer.Option("--kind", "-k", help="Only this kind (repeatable).")
    ] = None,
    tag: Annotated[list[str] | None, typer.Option("--tag", "-t", help="Any of these tags.")] = None,
    since: Annotated[str | None, typer.Option(help="Written at or after (ISO date).")] = None,
    until: Annotated[
        str | None,
        typer.Option(help="Written on or before this date (the whole day), or before a time."),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", help="How many (1-50).")] = 8,
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Search memories (facts, journal, goal and plan) and ingested documents, best first."""
    if scope not in ("all", "project", "global"):
        err.print(f"error: --scope must be all, project or global, got {scope!r}")
        raise typer.Exit(2)
    corpora: tuple[Corpus, ...] = ("facts", "journal", "docs", "knowledge")

    async def use(memory: MemoryService) -> Any:
        return await memory.search(
            query,
            scope=scope,  # type: ignore[arg-type]
            cwd=cwd,
            corpora=corpora,
            kinds=kind or [],
            tags=tag or [],
            since=since,
            until=until,
            limit=limit,
        )

    result = with_memory(cwd, use)
    if as_json:
        print_json(views.results(result))
        return
    for warning in result.warnings:
        err.print(f"warning: {warning}")
    if not result.hits:
        out.print("no memories found")
        raise typer.Exit(0)
    now = datetime.now(UTC)
    for hit in result.hits:
        _print_hit(hit, now)


def _print_hit(hit: Hit, now: datetime) -> None:
    """One search result: score, kind, where, age, text, id; then what it replaced or
    contradicts."""
    record = hit.record
    where = "global" if record.scope == "global" else "project"
    if "path" in record.meta:
        heading = f" > {record.meta['heading']}" if record.meta.get("heading") else ""
        where = f"{record.meta['path']}{heading}"
    out.print(
        f"{hit.score:.2f}  [{record.kind}, {where}, {ago(record.created_at, now)}]  "
        f"{short(record.content, 160)}  ({record.id})"
    )
    if replaced := hit.notes.get("supersedes"):
        out.print(f"      supersedes {replaced['id']}: {short(replaced['content'], 120)}")
    if conflict := hit.notes.get("conflict"):
        other = conflict["with"]
        text = f": {short(other['content'], 100)}" if "content" in other else ""
        out.print(
            f"      CONFLICT #{conflict['id']} with {other['id']}{text} "
            f"(memory-mcp conflicts resolve {conflict['id']} --keep new|old|both|merged)"
        )


def forget(
    record_id: Annotated[str, typer.Argument(help="The id of the record to archive.")],
    reason: Annotated[str, typer.Option(help="Why (kept with the record).")] = "forgotten",
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Archive a record (reversible; purged only after the grace window)."""

    async def use(memory: MemoryService) -> Any:
        return await memory.forget(record_id, reason=reason)

    record = with_memory(cwd, use, embeds=False)
    if as_json:
        print_json(views.forgotten(record))
    else:
        out.print(f"{record.id} archived ({record.archived_reason})")


def brief(
    budget: Annotated[
        int | None,
        typer.Option(min=100, max=20000, help="Token budget (default brief.budget_tokens)."),
    ] = None,
    hook: Annotated[
        bool,
        typer.Option(
            "--hook",
            help="Print it as a SessionStart hook's JSON (Claude Code, Codex, Gemini CLI).",
        ),
    ] = False,
    agent: Annotated[
        CliChoice | None,
        typer.Option(
            "--agent",
            help="With --hook: the CLI running it; nothing is printed when that CLI's prompt "
            "file already holds an injected brief (it would arrive twice).",
        ),
    ] = None,
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Print the spawn brief: goal, plan, top facts by the prior, recent journal."""
    if hook and cwd is None:
        cwd = _hook_cwd()
    if hook and agent is not None:
        from memory_mcp.agents.inject import injected

        if injected(project_root(cwd), agent.value):
            typer.echo("{}")  # the CLI reads the brief from its prompt file already
            return

    async def use(memory: MemoryService) -> Any:
        return await memory.brief(cwd, budget=budget)

    result = with_memory(cwd, use, embeds=False)
    if hook:
        context = {"hookEventName": "SessionStart", "additionalContext": result.text}
        typer.echo(json.dumps({"hookSpecificOutput": context}, ensure_ascii=False))
    elif as_json:  # memory_brief's fields, and what the budget kept
        print_json(
            {
                "brief": result.text,
                "tokens": result.tokens,
                "budget": result.budget,
                "ids": result.ids,
                "counts": result.counts,
            }
        )
    elif result.empty:
        err.print("no memories for this project yet")
    else:
        typer.echo(result.text, nl=False)


def _hook_cwd() -> Path | None:
    """The session's directory from the JSON a CLI's SessionStart hook gets on stdin.

    All three send ``cwd``; a hook may run elsewhere. Nothing on stdin (a
    terminal, or no input within a moment): None, the process's own directory.
    """
    if sys.stdin is None or sys.stdin.isatty():
        return None
    try:
        import select

        ready, _, _ = select.select([sys.stdin], [], [], 2.0)
        if not ready:
            return None
        data = json.loads(sys.stdin.read() or "{}")
    except (OSError, ValueError):
        return None
    where = data.get("cwd") if isinstance(data, dict) else None
    if isinstance(where, str) and Path(where).is_absolute() and Path(where).is_dir():
        return Path(where)
    return None
