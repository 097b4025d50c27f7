"""The ``memory-mcp`` command line: argument parsing around one engine call each.

Human-readable output by default, ``--json`` for scripts. Exit codes: 0 done,
1 unexpected error, 2 usage error, 65 bad input, 66 not found, 69 embedder
unavailable, 74 storage error, 78 configuration error.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager, nullcontext
from dataclasses import asdict
from datetime import UTC, datetime
from enum import StrEnum
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar, cast

import anyio
import typer

from memory_mcp import __version__, views
from memory_mcp.config import LoadedSettings, load_settings, replaced
from memory_mcp.errors import ConfigError, MemoryMcpError
from memory_mcp.records import STORABLE_KINDS, Corpus, Hit, StoreResult, format_time
from memory_mcp.scope import project_root
from memory_mcp.service import MemoryService, Status
from memory_mcp.terminal import Printer, Report, progress

if TYPE_CHECKING:
    from memory_mcp.embedders.base import Embedder
    from memory_mcp.inject import Agent, FileChange
    from memory_mcp.install import ConfigChange, InstallScope

T = TypeVar("T")

app = typer.Typer(
    name="memory-mcp",
    help="One project brain shared by Claude Code, Codex CLI and Gemini CLI.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(help="Benchmarks anyone can rerun (see the README).", no_args_is_help=True)
app.add_typer(bench_app, name="bench")

out = Printer()
err = Printer(stderr=True)

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def _absolute(value: Path | None) -> Path | None:
    """``--cwd`` relative to the current directory (``--cwd .``, ``--cwd ../app``)."""
    return None if value is None else Path(os.path.abspath(value))


CwdOption = Annotated[
    Path | None,
    typer.Option(
        help="Working directory whose project to use (default: the current one).",
        callback=_absolute,
    ),
]
# How long work that needs vectors (reembed, benchmarks) waits for a model download.
_DOWNLOAD_WAIT = 600.0
STATES = ("current", "history", "archived")


def main() -> None:
    """Console entry point."""
    app()


@app.callback(invoke_without_command=True)
def _root(
    ctx: typer.Context,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Log progress to stderr.")
    ] = False,
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        out.print(__version__)
        raise typer.Exit()
    if ctx.invoked_subcommand is None:
        err.print("missing command; see memory-mcp --help")
        raise typer.Exit(2)
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        stream=sys.stderr,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not verbose:  # a command reports the embedder's state in its own output, once
        logging.getLogger("memory_mcp.embedders").setLevel(logging.ERROR)


# Plumbing -----------------------------------------------------------------------------


def _settings(cwd: Path | None) -> LoadedSettings:
    return load_settings(project_root=project_root(cwd))


@contextmanager
def _engine_errors() -> Iterator[None]:
    """Engine errors become a message on stderr and their exit code."""
    try:
        yield
    except MemoryMcpError as exc:
        err.print(f"error: {exc}")
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        err.print("interrupted")
        raise typer.Exit(130) from None


def _run(work: Callable[[], Awaitable[T]]) -> T:
    """Run async engine work under ``_engine_errors``."""
    with _engine_errors():
        return anyio.run(work)


def _with_memory(
    cwd: Path | None,
    use: Callable[[MemoryService], Awaitable[T]],
    *,
    database: Path | None = None,
    needs_vectors: bool = False,
    embeds: bool = True,
    probe: bool = False,
) -> T:
    """Run ``use`` with the service open.

    Args:
        needs_vectors: work that is pointless without vectors (re-embedding) waits
            for a model download too.
        embeds: False for work that embeds nothing (the brief, status): the model
            is looked for, not loaded, so the command answers at once.
    """

    async def work() -> T:
        loaded = _settings(cwd)
        async with _open_memory(
            loaded, database, needs_vectors, embeds=embeds, probe=probe
        ) as memory:
            return await use(memory)

    return _run(work)


@asynccontextmanager
async def _open_memory(
    settings: LoadedSettings,
    database: Path | None,
    needs_vectors: bool,
    *,
    embeds: bool = True,
    probe: bool = False,
    embedder: Embedder | None = None,
) -> AsyncIterator[MemoryService]:
    """The service; with ``needs_vectors``, after waiting for a model download too."""
    async with MemoryService.open(
        settings, database=database, load_embedder=embeds, probe_network=probe, embedder=embedder
    ) as memory:
        if needs_vectors:
            await memory.embeddings.settle()
            state = memory.embeddings.status()
            if not memory.embeddings.ready and state.state == "loading":
                err.print(f"waiting for the embedding model ({state.reason})")
                await memory.embeddings.wait_loaded(_DOWNLOAD_WAIT)
        yield memory


def _print_json(data: Any) -> None:
    typer.echo(json.dumps(data, ensure_ascii=False, indent=2, default=str))


def _progress(description: str, total: int | None) -> AbstractContextManager[Report]:
    """A progress bar on stderr (``terminal.progress``)."""
    return progress(err, description, total)


def _short(text: str, width: int = 100) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


# Commands -----------------------------------------------------------------------------


@app.command()
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
        )

    result = _with_memory(cwd, use)
    if as_json:
        shown = views.stored(result)
        _print_json(
            {**shown, "kind": result.kind, "scope": result.scope, "embedded": result.embedded}
        )
        return
    what = {
        "inserted": "stored",
        "appended": "appended to the journal",
        "folded": "folded into an existing memory",
        "superseded": "stored; it supersedes an older memory",
        "conflict": "stored; it CONTRADICTS an existing memory (conflict recorded)",
        "replaced": f"stored; it replaces the previous {result.kind}",
    }[result.action]
    out.print(f"{result.id}  {what}")
    if result.related_id:
        out.print(f"  related: {result.related_id}  {_short(result.related_content or '')}")
    for redaction in result.redactions:
        out.print(f"  redacted: {redaction.count} x {redaction.kind}")
    if not result.embedded:
        out.print("  note: stored without a vector (lexical floor); `memory-mcp reembed` adds it")


@app.command()
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
    until: Annotated[str | None, typer.Option(help="Written before (ISO date).")] = None,
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

    result = _with_memory(cwd, use)
    if as_json:
        _print_json(views.results(result))
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
        f"{hit.score:.2f}  [{record.kind}, {where}, {_ago(record.created_at, now)}]  "
        f"{_short(record.content, 160)}  ({record.id})"
    )
    if replaced := hit.notes.get("supersedes"):
        out.print(f"      supersedes {replaced['id']}: {_short(replaced['content'], 120)}")
    if conflict := hit.notes.get("conflict"):
        other = conflict["with"]
        text = f": {_short(other['content'], 100)}" if "content" in other else ""
        out.print(
            f"      CONFLICT #{conflict['id']} with {other['id']}{text} "
            f"(memory-mcp conflicts resolve {conflict['id']} --keep new|old|both|merged)"
        )


def _ago(stamp: str, now: datetime) -> str:
    """How long ago: "just now", "5m ago", "3d ago" (``brief.age``'s units)."""
    from memory_mcp.brief import age

    short = age(stamp, now)
    return "just now" if short == "now" else f"{short} ago"


class TransportChoice(StrEnum):
    stdio = "stdio"
    sse = "sse"
    streamable_http = "streamable-http"


@app.command()
def serve(
    transport: Annotated[
        TransportChoice,
        typer.Option(
            "--transport",
            "-t",
            help="stdio (what agent CLIs spawn), sse or streamable-http.",
        ),
    ] = TransportChoice.stdio,
    host: Annotated[
        str | None,
        typer.Option(help="Address for sse / streamable-http (default 127.0.0.1)."),
    ] = None,
    port: Annotated[int | None, typer.Option(help="Port for sse / streamable-http (8765).")] = None,
    token: Annotated[
        str | None,
        typer.Option(
            help="Bearer token HTTP clients must send; required off loopback. "
            "Prefer MEMORY_MCP_SERVE_TOKEN: a flag shows in the process list.",
        ),
    ] = None,
    cwd: CwdOption = None,
) -> None:
    """Run the MCP server (stdio by default) for Claude Code, Codex, Gemini CLI and others."""
    from memory_mcp import front
    from memory_mcp.serve import Transport
    from memory_mcp.serve import serve as run_server

    if transport is TransportChoice.stdio:
        front.run(str(cwd) if cwd else None)
    loaded = _settings(cwd)
    given = {"host": host, "port": port, "token": token}
    changes = {key: value for key, value in given.items() if value is not None}
    with _engine_errors():
        try:
            loaded.settings.serve = replaced(loaded.settings.serve, **changes)
        except ConfigError as exc:
            raise ConfigError(f"bad serve option: {exc}") from None
        announce = partial(err.print, "memory-mcp:")
        http: Transport = "sse" if transport is TransportChoice.sse else "streamable-http"
        anyio.run(partial(run_server, loaded, http, ready=announce))


@app.command()
def forget(
    record_id: Annotated[str, typer.Argument(help="The id of the record to archive.")],
    reason: Annotated[str, typer.Option(help="Why (kept with the record).")] = "forgotten",
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Archive a record (reversible; purged only after the grace window)."""

    async def use(memory: MemoryService) -> Any:
        return await memory.forget(record_id, reason=reason)

    record = _with_memory(cwd, use, embeds=False)
    if as_json:
        _print_json(views.forgotten(record))
    else:
        out.print(f"{record.id} archived ({record.archived_reason})")


class CliChoice(StrEnum):
    claude = "claude"
    codex = "codex"
    gemini = "gemini"


@app.command()
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
    from memory_mcp.brief import build_brief

    if hook and cwd is None:
        cwd = _hook_cwd()
    if hook and agent is not None:
        from memory_mcp.inject import injected

        if injected(project_root(cwd), agent.value):
            typer.echo("{}")  # the CLI reads the brief from its prompt file already
            return

    async def use(memory: MemoryService) -> Any:
        return await build_brief(memory, cwd, budget=budget)

    result = _with_memory(cwd, use, embeds=False)
    if hook:
        context = {"hookEventName": "SessionStart", "additionalContext": result.text}
        typer.echo(json.dumps({"hookSpecificOutput": context}, ensure_ascii=False))
    elif as_json:  # memory_brief's fields, and what the budget kept
        _print_json(
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


class AgentChoice(StrEnum):
    claude = "claude"
    codex = "codex"
    gemini = "gemini"
    all = "all"


def _agents(choice: AgentChoice) -> tuple[Agent, ...]:
    from memory_mcp.inject import AGENTS

    return AGENTS if choice is AgentChoice.all else (cast("Agent", choice.value),)


def _inject(cwd: Path | None, agents: tuple[Agent, ...], imports: bool) -> list[FileChange]:
    from memory_mcp.brief import build_brief
    from memory_mcp.inject import inject as write_blocks

    root = project_root(cwd)

    async def use(memory: MemoryService) -> list[FileChange]:
        brief = await build_brief(memory, root, dated=True)
        return write_blocks(root, brief.text, agents, imports=imports)

    return _with_memory(cwd, use, embeds=False)


def _report(changes: list[FileChange], as_json: bool, root: Path) -> None:
    if as_json:
        _print_json([{"path": str(c.path), "outcome": c.outcome, "note": c.note} for c in changes])
        return
    for change in changes:
        where = change.path.relative_to(root) if change.path.is_relative_to(root) else change.path
        note = f" ({change.note})" if change.note else ""
        out.print(f"{where}: {change.outcome}{note}")


AgentOption = Annotated[
    AgentChoice,
    typer.Option("--agent", "-a", help="Whose prompt file: claude, codex, gemini, all."),
]


@app.command()
def inject(
    agent: AgentOption = AgentChoice.all,
    imports: Annotated[
        bool,
        typer.Option(
            "--import",
            help="Keep the brief in the git-ignored .memory-mcp/brief.md and only import it "
            "from CLAUDE.md / GEMINI.md (Codex has no imports: AGENTS.md gets the brief).",
        ),
    ] = False,
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Write the brief into CLAUDE.md / AGENTS.md / GEMINI.md at the project root."""
    changes = _inject(cwd, _agents(agent), imports)
    _report(changes, as_json, project_root(cwd))


@app.command()
def uninject(
    agent: AgentOption = AgentChoice.all, cwd: CwdOption = None, as_json: JsonOption = False
) -> None:
    """Remove what inject added, restoring each file byte for byte."""
    from memory_mcp.inject import uninject as remove_blocks

    root = project_root(cwd)
    with _engine_errors():
        changes = remove_blocks(root, _agents(agent))
    _report(changes, as_json, root)


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def run(
    ctx: typer.Context,
    agent: Annotated[CliChoice, typer.Argument(help="claude, codex or gemini.")],
    imports: Annotated[bool, typer.Option("--import", help="As inject --import.")] = False,
) -> None:
    """Refresh the brief, then become the agent CLI: memory-mcp run claude -- ARGS."""
    import shutil

    program = agent.value
    if shutil.which(program) is None:  # before any file is touched
        err.print(f"error: {program} is not installed (not on PATH); nothing was changed")
        raise typer.Exit(127)
    try:
        with _engine_errors():
            _inject(None, (agent.value,), imports)
    except typer.Exit as stop:
        if stop.exit_code not in (0, None):
            err.print(f"memory-mcp: starting {program} without a fresh brief")
    except Exception as exc:  # the agent starts whatever happened to the brief
        err.print(f"memory-mcp: starting {program} without a fresh brief ({exc})")
    args = [program, *ctx.args]
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(program, args)
    except OSError as exc:
        err.print(f"error: cannot start {program}: {exc.strerror} (is it installed and on PATH?)")
        raise typer.Exit(127) from None


ScopeOption = Annotated[
    str,
    typer.Option(
        "--scope",
        help="user: your own configuration, every project; project: this repository's files.",
    ),
]
NameOption = Annotated[str, typer.Option("--name", help="The MCP server's name in the CLI.")]


def _install_args(agent: AgentChoice, scope: str) -> tuple[tuple[Agent, ...], InstallScope]:
    if scope not in ("user", "project"):
        err.print(f"error: --scope must be user or project, got {scope!r}")
        raise typer.Exit(2)
    return _agents(agent), cast("InstallScope", scope)


def _report_config(changes: list[ConfigChange], as_json: bool, todo: list[str]) -> None:
    if as_json:
        _print_json(
            {
                "changes": [
                    {
                        "path": str(c.path),
                        "outcome": c.outcome,
                        "what": c.what,
                        "backup": str(c.backup) if c.backup else None,
                        "note": c.note,
                    }
                    for c in changes
                ],
                "todo": todo,
            }
        )
        return
    for change in changes:
        backup = f" (backup: {change.backup})" if change.backup else ""
        note = f" ({change.note})" if change.note else ""
        out.print(f"{change.path}: {change.what} {change.outcome}{backup}{note}")
    for step in todo:
        out.print(f"to do: {step}")


@app.command()
def install(
    agent: Annotated[AgentChoice, typer.Argument(help="claude, codex, gemini or all.")],
    scope: ScopeOption = "user",
    hook: Annotated[
        bool,
        typer.Option(
            "--hook", help="Also add a SessionStart hook that gives each session the brief."
        ),
    ] = False,
    name: NameOption = "memory",
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Register the MCP server (and, with --hook, the brief at session start) in a CLI's config.

    The server entry carries the settings this shell has (MEMORY_MCP_*, and where
    the store is), so that every CLI's server uses the same store; run it again
    after changing them.
    """
    from memory_mcp.install import install as add
    from memory_mcp.install import todo

    which, where = _install_args(agent, scope)
    root = project_root(cwd)
    steps: list[str] = []

    def one(cli: Agent) -> list[ConfigChange]:
        changes = add(cli, where, root, hook=hook, name=name)
        steps.extend(todo(cli, where, root, hook=hook, name=name, env=os.environ))
        return changes

    _each_cli(which, one, as_json, steps)


@app.command()
def uninstall(
    agent: Annotated[AgentChoice, typer.Argument(help="claude, codex, gemini or all.")],
    scope: ScopeOption = "user",
    name: NameOption = "memory",
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Remove what install added to a CLI's configuration (the server and the hook)."""
    from memory_mcp.install import uninstall as remove

    which, where = _install_args(agent, scope)
    root = project_root(cwd)
    _each_cli(which, lambda cli: remove(cli, where, root, name=name), as_json, [])


def _each_cli(
    which: tuple[Agent, ...],
    act: Callable[[Agent], list[ConfigChange]],
    as_json: bool,
    steps: list[str],
) -> None:
    """``act`` on each CLI; one CLI's broken file does not stop the others. Reports
    every change and step (filled in meanwhile), then each failure; exits with the
    first failure's code."""
    changes: list[ConfigChange] = []
    failed: list[tuple[Agent, MemoryMcpError]] = []
    for cli in which:
        try:
            changes += act(cli)
        except MemoryMcpError as exc:
            failed.append((cli, exc))
    _report_config(changes, as_json, steps)
    for name, error in failed:
        err.print(f"error ({name}): {error}")
    if failed:
        raise typer.Exit(failed[0][1].exit_code)


@app.command()
def status(cwd: CwdOption = None, as_json: JsonOption = False) -> None:
    """Show the storage backend and its size, the embedder (effective / configured), counts."""

    async def use(memory: MemoryService) -> Status:
        return await memory.status()

    from memory_mcp.install import inspect

    info = _with_memory(cwd, use, embeds=False, probe=True)
    root = project_root(cwd)
    project = str(root)
    agents = inspect(root)
    if as_json:
        data = asdict(info)
        data["project"] = project
        data["stats"]["records"] = [
            {"corpus": c, "scope": s, "state": st, "count": n}
            for (c, s, st), n in info.stats.records.items()
        ]
        data["agents"] = [setup.to_json() for setup in agents]
        _print_json(data)
        return
    e = info.embedder
    size = info.database_bytes / 1e6
    out.print(f"storage         {info.backend}: {info.database} ({size:.1f} MB)")
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
        summary = state.last_summary
        if state.last_error:
            result = f"failed ({state.failures}x): {_short(state.last_error, 60)}"
        elif summary.get("skipped"):
            result = f"skipped: {_short(str(summary['skipped']), 60)}"
        else:
            counts = summary.get("counts", {})
            result = ", ".join(f"{n} {what}" for what, n in counts.items() if n) or "nothing to do"
            if summary.get("pending"):
                result += f"; {summary['pending']} left"
        later = f"retry after {state.retry_after}" if state.retry_after else ""
        if state.holder and state.lease_until and state.lease_until > format_time(now):
            later = f"running ({state.holder})"
        rows.append([name, _ago(state.last_finished_at, now), result, later])
    out.print("maintenance")
    out.table(("task", "last run", "result", "next"), rows)


@app.command("export")
def export_cmd(
    path: Annotated[
        Path | None, typer.Argument(help="Output file (default: standard output).")
    ] = None,
    cwd: CwdOption = None,
) -> None:
    """Export every record (archived and history too) and conflict as JSONL."""
    from memory_mcp.exchange import export_jsonl, open_private

    async def use(memory: MemoryService) -> Any:
        if path is None:
            return await export_jsonl(memory, sys.stdout)
        with open_private(path) as fh:
            return await export_jsonl(memory, fh)

    summary = _with_memory(cwd, use, embeds=False)
    err.print(f"exported {summary.records} records and {summary.conflicts} conflicts")


@app.command("import")
def import_cmd(
    path: Annotated[Path, typer.Argument(help="A file made by `memory-mcp export` ('-': stdin).")],
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Import an export: records are added exactly (existing ids skipped), then embedded."""
    from memory_mcp.exchange import import_jsonl

    if str(path) != "-" and not path.is_file():
        err.print(f"error: {path} is not a file")
        raise typer.Exit(66)

    async def use(memory: MemoryService) -> Any:
        with _progress("importing", None) as report:

            def embedding(done: int, total: int) -> None:
                report(done, total, "embedding")

            source = nullcontext(sys.stdin) if str(path) == "-" else path.open(encoding="utf-8")
            with source as lines:
                return await import_jsonl(memory, lines, progress=report, embed_progress=embedding)

    summary = _with_memory(cwd, use)
    if as_json:
        _print_json(asdict(summary))
        return
    out.print(
        f"added {summary.records_added} records ({summary.records_skipped} already there), "
        f"{summary.conflicts_added} conflicts; embedded {summary.embedded}, "
        f"{summary.awaiting_embedding} awaiting an embedder"
    )


@app.command()
def ingest(
    paths: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Files or directories in the project (default: README*, docs/**/*.md, "
            "CLAUDE.md, AGENTS.md, GEMINI.md)."
        ),
    ] = None,
    agent_memories: Annotated[
        bool,
        typer.Option(
            "--agent-memories/--no-agent-memories",
            help="Also import Claude Code's own memory folder for this project "
            "(~/.claude/projects/<project>/memory); default: when no PATH is given.",
        ),
    ] = True,
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Index the project's own documents into the knowledge corpus (only what changed)."""
    from memory_mcp.ingest import ingest as run_ingest
    from memory_mcp.ingest import ingest_agent_memories

    root = project_root(cwd)
    given = [p if p.is_absolute() else Path.cwd() / p for p in paths or []]

    async def use(memory: MemoryService) -> Any:
        with _progress("files", None) as report:
            summaries = [
                ("project documents", await run_ingest(memory, root, given, progress=report))
            ]
            if agent_memories and not given:
                found = await ingest_agent_memories(memory, root, progress=report)
                if found.files or found.removed:
                    summaries.append(("Claude Code memory files", found))
            return summaries

    results = _with_memory(cwd, use)
    if as_json:
        _print_json({label: asdict(summary) for label, summary in results})
        return
    for label, summary in results:
        out.print(
            f"{summary.files} {label} in {root}: {summary.changed} re-chunked, "
            f"{summary.unchanged} unchanged, {summary.removed} removed; "
            f"{summary.chunks_added} chunks added, {summary.chunks_archived} archived"
            + ("" if summary.embedded or not summary.chunks_added else " (lexical only for now)")
        )
        for line in summary.skipped:
            err.print(f"skipped {line}")


@app.command()
def reembed(
    batch_size: Annotated[int, typer.Option(min=1, max=1024, help="Records per batch.")] = 64,
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Give every current record a vector from the active embedder (resumable)."""

    async def use(memory: MemoryService) -> Any:
        total = await memory.db.count_needing_embedding(memory.embeddings.identity)
        with _progress("re-embedding", total) as report:
            return await memory.reembed(batch_size=batch_size, progress=report)

    summary = _with_memory(cwd, use, needs_vectors=True)
    if as_json:
        _print_json(asdict(summary))
    else:
        out.print(
            f"embedded {summary.embedded} records with {summary.embedder}; "
            f"{summary.remaining} remaining"
        )


# Maintenance --------------------------------------------------------------------------

conflicts_app = typer.Typer(
    help="The operator's inbox: open conflicts, and `conflicts resolve`.",
    invoke_without_command=True,
)
app.add_typer(conflicts_app, name="conflicts")
project_app = typer.Typer(help="Whole-project actions.", no_args_is_help=True)
app.add_typer(project_app, name="project")


class Task(StrEnum):
    secrets = "secrets"
    reembed = "reembed"
    consolidate = "consolidate"
    insights = "insights"
    staleness = "staleness"
    purge = "purge"


@app.command()
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
    from memory_mcp import maintenance

    chosen = [t.value for t in task] if task else list(maintenance.TASKS)

    async def use(memory: MemoryService) -> list[maintenance.TaskReport]:
        with err.console.status("maintenance") as spinner:

            def say(name: str) -> None:
                spinner.update(f"maintenance: {name}")

            if dry_run:
                return await maintenance.dry_run(memory, chosen, progress=say)
            return await maintenance.Maintenance(memory, progress=say).run(chosen)

    reports = _with_memory(cwd, use)
    if as_json:
        _print_json({"dry_run": dry_run, "tasks": [r.to_json() for r in reports]})
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
    from memory_mcp import maintenance

    views = _with_memory(cwd, maintenance.open_conflicts, embeds=False)
    if as_json:
        _print_json([v.to_json() for v in views])
        return
    if not views:
        out.print("no open conflicts")
        return
    now = datetime.now(UTC)
    for view in views:
        c = view.conflict
        where = c.scope_key or "global"
        out.print(f"#{c.id}  {where}  {_ago(c.created_at, now)}  ({c.reason})")
        for label, record, record_id in (
            ("new", view.new, c.record_id),
            ("old", view.old, c.other_id),
        ):
            text = _short(record.content) if record is not None else "(purged)"
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
    from memory_mcp import maintenance

    number = conflict_id.strip().removeprefix("#")
    if not number.isdigit():
        err.print(f"error: {conflict_id!r} is not a conflict number; use one `conflicts` lists")
        raise typer.Exit(2)

    async def use(memory: MemoryService) -> Any:
        return await maintenance.resolve_conflict(memory, int(number), keep.value, text)

    closed, merged = _with_memory(cwd, use, embeds=text is not None)
    if as_json:
        _print_json(
            {"conflict": closed.to_json(), "merged": None if merged is None else merged.to_json()}
        )
    else:
        out.print(f"conflict #{closed.id} resolved: {closed.resolution}")


@app.command()
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
        keys = () if all_scopes else memory.scope_keys("all", cwd)
        return await memory.db.archived(keys, reason=reason, limit=limit)

    records = _with_memory(cwd, use, embeds=False)
    if as_json:
        _print_json([r.to_json() for r in records])
        return
    if not records:
        out.print("no archived records")
        return
    now = datetime.now(UTC)
    for record in records:
        assert record.archived_at is not None
        when = _ago(record.archived_at, now)
        out.print(f"{record.id}  {record.archived_reason}  {when}  {_short(record.content, 80)}")


@app.command()
def restore(
    record_ids: Annotated[list[str], typer.Argument(help="Ids of archived records.")],
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Bring archived records back exactly as they were (until the purge)."""
    from memory_mcp import maintenance

    async def use(memory: MemoryService) -> Any:
        return await maintenance.restore(memory, record_ids)

    records = _with_memory(cwd, use)
    if as_json:
        _print_json([r.to_json() for r in records])
    else:
        for record in records:
            out.print(f"{record.id} restored: {_short(record.content, 80)}")


@project_app.command("done")
def project_done(
    cwd: CwdOption = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only count.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Archive a finished project's records (reason project-done; restorable until purged)."""
    from memory_mcp import maintenance

    async def use(memory: MemoryService) -> int:
        return await maintenance.archive_project(memory, cwd, dry_run=dry_run)

    count = _with_memory(cwd, use, embeds=False)
    root = project_root(cwd)
    if as_json:
        _print_json({"project": str(root), "archived": count, "dry_run": dry_run})
    else:
        verb = "would archive" if dry_run else "archived"
        out.print(f"{verb} {count} records of {root}")


@app.command()
def doctor(
    repair: Annotated[
        bool, typer.Option("--repair", help="Rebuild what disagrees with the records.")
    ] = False,
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Check the database: SQLite's integrity, the full-text and vector indexes, conflicts."""

    async def use(memory: MemoryService) -> Any:
        return await memory.db.doctor(repair=repair)

    found = _with_memory(cwd, use, embeds=False)
    if as_json:
        _print_json(found.to_json())
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


@app.command()
def backup(
    path: Annotated[Path, typer.Argument(help="The copy's file, or a directory for it.")],
    force: Annotated[bool, typer.Option("--force", help="Replace an existing file.")] = False,
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Copy the database while servers keep writing (a consistent, owner-only copy)."""

    async def use(memory: MemoryService) -> Path:
        return await memory.db.backup(path.expanduser(), force=force)

    written = _with_memory(cwd, use, embeds=False)
    size = written.stat().st_size
    if as_json:
        _print_json({"path": str(written), "bytes": size})
    else:
        out.print(f"backed up to {written} ({size / 1e6:.1f} MB)")
        database = _database(cwd)
        out.print(
            f"to restore: stop the servers, delete {database.name}-wal and {database.name}-shm "
            f"beside {database} if they are there, then copy the backup over {database}"
        )


def _database(cwd: Path | None) -> Path:
    return _settings(cwd).settings.database_path()


# Benchmarks ---------------------------------------------------------------------------


@bench_app.command("fold")
def bench_fold(
    pairs: Annotated[Path, typer.Argument(help="Labelled pairs, JSONL (see bench/FORMAT.md).")],
    cv: Annotated[
        int | None,
        typer.Option(
            min=2,
            max=20,
            help="Cross-validate the fold threshold in K folds: each fold's pairs are "
            "decided with the threshold the other folds choose (most duplicates folded at "
            "precision >= 0.95, no contradiction folded).",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Store a then b for each pair in a fresh scope; count what the pipeline did per label."""
    from memory_mcp.bench.fold import (
        ACTIONS,
        LABELS,
        cross_validate,
        pair_evidence,
        read_pairs,
        run_fold_bench,
    )

    async def work() -> Any:
        loaded = _settings(None)
        items = read_pairs(pairs)
        with tempfile.TemporaryDirectory(prefix="memory-mcp-bench-") as tmp:
            async with _open_memory(loaded, Path(tmp) / "bench.db", needs_vectors=True) as memory:
                if cv is not None:
                    evidence = await pair_evidence(memory, items)
                    identity = memory.embeddings.identity or "bm25"
                    return cross_validate(
                        items, evidence, loaded.settings.fold, k=cv, embedder=identity
                    )
                with _progress("pairs", len(items)) as report:
                    return await run_fold_bench(memory, items, progress=report)

    result = _run(work)
    if as_json:
        _print_json(result.to_json())
        return
    report = result.report if cv is not None else result
    out.print(f"{report.pairs} pairs, embedder {report.embedder}")
    if cv is not None:
        chosen = ", ".join(f"{t:.2f}" for t in result.chosen)
        out.print(f"{cv}-fold cross-validation, out-of-fold decisions; thresholds chosen: {chosen}")
    labels = [label for label in LABELS if label in report.counts] + sorted(
        set(report.counts) - set(LABELS)
    )
    for source, by_label in [("all", report.counts), *sorted(report.by_source.items())]:
        if source != "all" and len(report.by_source) < 2:
            continue
        rows = [
            [label, *[str(counts[a]) for a in ACTIONS], str(sum(counts.values()))]
            for label in labels
            if (counts := by_label.get(label))
        ]
        out.table((f"label ({source})", *ACTIONS, "total"), rows)
    precision, recall = report.fold_precision, report.fold_recall
    out.print(
        f"fold precision {precision:.3f}" if precision is not None else "fold precision n/a",
        f"  recall {recall:.3f}" if recall is not None else "",
    )
    for label in ("update", "contradiction"):
        if label in report.counts:
            kept, both = report.old_value_kept(label)
            out.print(f"{label}: old value kept visible {kept}, left as two current facts {both}")


@bench_app.command("retrieval")
def bench_retrieval(
    data: Annotated[Path, typer.Argument(help="Benchmark data (*.jsonl or *.jsonl.gz).")],
    run_out: Annotated[Path, typer.Option("--out", help="Where to write the run file.")],
    cases: Annotated[int | None, typer.Option(help="Only the first N cases.")] = None,
    vector_cache: Annotated[
        Path | None,
        typer.Option(
            help="Keep the passages' vectors in this file and reuse them in later runs "
            "(same model, same texts: only search changes)."
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Run the retrieval benchmark (bench/FORMAT.md): store, search, score."""
    from memory_mcp.bench.retrieval import read_cases, run_retrieval_bench
    from memory_mcp.bench.vector_cache import CachedEmbedder
    from memory_mcp.embedders.runtime import build_candidates

    if not data.is_file():
        err.print(f"error: {data} is not a file")
        raise typer.Exit(66)
    total_cases = sum(1 for _ in read_cases(data)) if cases is None else cases

    async def work() -> Any:
        loaded = _settings(None)
        cached: CachedEmbedder | None = None
        if vector_cache is not None:
            found = build_candidates(loaded.settings.embedder)
            if not found:
                err.print("error: --vector-cache needs a model (the embedder backend is bm25)")
                raise typer.Exit(2)
            cached = CachedEmbedder(found[0], vector_cache)
        with tempfile.TemporaryDirectory(prefix="memory-mcp-bench-") as tmp:
            async with _open_memory(
                loaded, Path(tmp) / "bench.db", needs_vectors=True, embedder=cached
            ) as memory:
                with (
                    _progress("cases", total_cases) as report,
                    run_out.open("w", encoding="utf-8") as fh,
                ):
                    return await run_retrieval_bench(
                        memory, data, fh, max_cases=cases, progress=report
                    )

    report = _run(work)
    if as_json:
        _print_json(report.to_json())
        return
    for warning in report.warnings:
        err.print(f"warning: {warning}")
    out.print(
        f"{report.cases} cases, {report.memories} memories, {report.table.queries} scored "
        f"queries ({report.table.turn_queries} with gold turns, for the turn metrics); "
        f"embedder {report.embedder}, search {report.mode}; run file {run_out}"
    )
    if report.skipped:
        out.print(f"{report.skipped} memories could not be stored (see the warnings)")
    _metric_tables(report.table, report.even, report.odd)


@bench_app.command("launch")
def bench_launch(
    launches: Annotated[int, typer.Option(min=1, max=1000, help="Timed launches.")] = 10,
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Seconds from spawning `memory-mcp serve` (stdio) to tools/list, and to a first search."""
    from memory_mcp.bench.launch import run_launch_bench

    with _engine_errors(), _progress("launches", launches) as report:
        result = run_launch_bench(
            cwd or Path.cwd(), launches=launches, progress=report, search=True
        )
    if as_json:
        _print_json(result.to_json())
        return
    if result.cold is not None:
        out.print(f"first launch (no handshake cache yet): {result.cold:.3f} s")
    out.print(
        f"{len(result.warm)} launches: tools/list median {result.median:.3f} s "
        f"(min {min(result.warm):.3f} s, max {max(result.warm):.3f} s; target 0.6 s)"
    )
    search = result.search_median
    if search is not None:
        out.print(
            f"first memory_search answered: median {search:.3f} s after launch "
            f"(target: hybrid within 1 s); hybrid in {result.hybrid} of {len(result.launches)}"
        )


@bench_app.command("cli")
def bench_cli(
    memories: Annotated[
        int, typer.Option(min=0, max=100_000, help="Memories in the store first.")
    ] = 1000,
    runs: Annotated[int, typer.Option(min=1, max=1000, help="Timed runs per command.")] = 10,
    no_bytecode: Annotated[
        bool,
        typer.Option(
            "--no-bytecode/--skip-no-bytecode",
            help="Also time each command without Python's bytecode cache.",
        ),
    ] = True,
    as_json: JsonOption = False,
) -> None:
    """Whole-process seconds of --version, status, brief, brief --hook, inject, store, search."""
    from memory_mcp.bench.commands import run_commands_bench

    with _engine_errors(), _progress("runs", None) as report:
        result = run_commands_bench(
            memories=memories, runs=runs, uncached=no_bytecode, progress=report
        )
    if as_json:
        _print_json(result.to_json())
        return
    out.print(f"{memories:,} memories; median of {runs} runs each, as whole processes")
    rows = []
    for timing in result.to_json()["commands"]:
        uncached = timing["median_no_bytecode_s"]
        rows.append(
            [
                timing["command"],
                f"{timing['median_s']:.3f} s",
                f"{timing['max_s']:.3f} s",
                "" if uncached is None else f"{uncached:.3f} s",
                f"{timing['target_s']:.1f} s",
                "ok" if timing["median_s"] <= timing["target_s"] else "OVER",
            ]
        )
    out.table(("command", "median", "max", "no bytecode", "target", ""), rows)


@bench_app.command("brief")
def bench_brief(
    facts: Annotated[int, typer.Option(min=0, max=1_000_000, help="Facts in the store.")] = 50_000,
    runs: Annotated[int, typer.Option(min=1, max=1000, help="Timed runs.")] = 10,
    as_json: JsonOption = False,
) -> None:
    """Time building the spawn brief and injecting it, at a number of facts."""
    from memory_mcp.bench.brief import run_brief_bench

    async def work() -> Any:
        with _progress("runs", runs) as report:
            return await run_brief_bench(facts, runs=runs, progress=report)

    result = _run(work)
    if as_json:
        _print_json(result.to_json())
        return
    data = result.to_json()
    out.print(
        f"{facts:,} facts (written in {data['populate_s']} s): brief + inject first "
        f"{data['first_ms']} ms, median {data['median_ms']} ms, max {data['max_ms']} ms "
        f"over {runs} runs; brief {data['brief_tokens']} tokens"
    )


@bench_app.command("perf")
def bench_perf(
    sizes: Annotated[
        str, typer.Option(help="Comma-separated numbers of memories, e.g. 1000,10000,50000,200000.")
    ] = "1000,10000",
    samples: Annotated[int, typer.Option(min=5, max=10000, help="Timed calls per figure.")] = 50,
    launch: Annotated[
        bool, typer.Option("--launch/--no-launch", help="Also time spawn to tools/list.")
    ] = True,
    keep: Annotated[
        Path | None,
        typer.Option(
            help="Keep each size's store in KEEP/<size>; a store kept there by an earlier "
            "run is measured again without refilling it (a fill stopped while embedding "
            "resumes)."
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Store / search latency, import rate, brief time, size and memory at each size."""
    from memory_mcp.bench.launch import run_launch_bench
    from memory_mcp.bench.perf import cpu_description, kept_fill, run_perf

    try:
        counts = [int(part) for part in sizes.split(",") if part.strip()]
    except ValueError:
        err.print(f"error: --sizes takes numbers separated by commas, got {sizes!r}")
        raise typer.Exit(2) from None
    if not counts or min(counts) < 10:
        err.print("error: --sizes needs numbers of at least 10")
        raise typer.Exit(2)
    if keep is not None:
        for n in counts:
            try:
                kept_fill(keep / str(n))
            except ValueError as exc:
                err.print(f"error: {exc}")
                raise typer.Exit(2) from None

    async def work() -> Any:
        loaded = _settings(None)
        with _progress("starting", None) as report:

            def step(phase: str, done: int, total: int) -> None:
                report(done, total, phase)

            return await run_perf(
                counts, loaded.settings, samples=samples, progress=step, keep=keep
            )

    result = _run(work)
    if launch:
        with tempfile.TemporaryDirectory(prefix="memory-mcp-launch-") as tmp:
            result.launch_s = run_launch_bench(Path(tmp), launches=10).median
    if as_json:
        _print_json({"machine": cpu_description(), **result.to_json()})
        return
    out.print(f"machine: {cpu_description()}; embedder: {result.points[0].embedder}")
    header = (
        "memories",
        "import/s",
        "embedded/s",
        "store p50",
        "store p95",
        "search p50",
        "search p95",
        "1st search",
        "brief+inject",
        "bytes/memory",
        "RSS MB",
    )
    rows = [
        [
            f"{point.memories:,}",
            f"{point.import_per_s:,.0f}",
            f"{point.import_embedded_per_s:,.0f}",
            f"{point.store_p50_ms} ms",
            f"{point.store_p95_ms} ms",
            f"{point.search_p50_ms} ms",
            f"{point.search_p95_ms} ms",
            f"{point.first_search_ms} ms",
            f"{point.brief_inject_ms} ms",
            f"{point.bytes_per_memory:,.0f}",
            f"{point.rss_mb:,.0f}",
        ]
        for point in result.points
    ]
    out.table(header, rows)
    if result.launch_s is not None:
        out.print(f"spawn to tools/list over stdio: median {result.launch_s:.3f} s of 10")


@bench_app.command("score")
def bench_score(
    data: Annotated[Path, typer.Argument(help="Benchmark data (*.jsonl or *.jsonl.gz).")],
    run_file: Annotated[
        Path, typer.Argument(help="A run file (bench/FORMAT.md), from any system.")
    ],
    as_json: JsonOption = False,
) -> None:
    """Score a run file against the benchmark data (bench/FORMAT.md), as bench retrieval does."""
    from memory_mcp.bench.retrieval import score_run

    for path in (data, run_file):
        if not path.is_file():
            err.print(f"error: {path} is not a file")
            raise typer.Exit(66)

    with _engine_errors():
        report = score_run(data, run_file)
    if as_json:
        _print_json(report.to_json())
        return
    if report.missing:
        err.print(f"warning: {report.missing} queries have no run line (scored as empty rankings)")
    if report.unknown:
        err.print(f"warning: {report.unknown} run lines name no query of {data}")
    out.print(
        f"{report.table.queries} scored queries ({report.table.turn_queries} with gold turns, "
        "for the turn metrics)"
    )
    _metric_tables(report.table, report.even, report.odd)


def _metric_tables(table: Any, even: Any, odd: Any) -> None:
    """The metric table, then the same table for each half of the queries."""
    _metric_table(table)
    for name, half in (("queries at even positions", even), ("queries at odd positions", odd)):
        out.print(f"\n{name} ({half.queries} scored):")
        _metric_table(half)


def _metric_table(table: Any) -> None:
    from memory_mcp.bench.metrics import HEADLINE

    columns = [*HEADLINE, "sess_any@5", "turn_all@10", "turn_ndcg@10", "turn_recall@50"]
    rows = [("overall", table.queries, table.overall)] + [
        (c, table.queries_by_category[c], m) for c, m in table.by_category.items()
    ]
    width = max(len(name) for name, _, _ in rows)
    out.print(f"{'category':<{width}}  {'n':>4}  " + "  ".join(f"{c:>14}" for c in columns))
    for name, n, metrics in rows:
        cells = [f"{metrics[c]:>14.1f}" if c in metrics else f"{'-':>14}" for c in columns]
        out.print(f"{name:<{width}}  {n:>4}  " + "  ".join(cells))
