"""The agent CLIs: the brief in their prompt files (``inject``, ``uninject``, ``run``)
and the server and hook in their configuration (``install``, ``uninstall``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer

from memory_mcp.cli.base import (
    CwdOption,
    JsonOption,
    engine_errors,
    err,
    out,
    print_json,
    with_memory,
)
from memory_mcp.errors import MemoryMcpError
from memory_mcp.scope import project_root
from memory_mcp.service import MemoryService

if TYPE_CHECKING:
    from memory_mcp.agents.config_files import ConfigChange
    from memory_mcp.agents.inject import Agent, FileChange
    from memory_mcp.agents.install import InstallScope


class CliChoice(StrEnum):
    claude = "claude"
    codex = "codex"
    gemini = "gemini"


class AgentChoice(StrEnum):
    claude = "claude"
    codex = "codex"
    gemini = "gemini"
    all = "all"


def _agents(choice: AgentChoice) -> tuple[Agent, ...]:
    from memory_mcp.agents.inject import AGENTS

    return AGENTS if choice is AgentChoice.all else (cast("Agent", choice.value),)


def _inject(cwd: Path | None, agents: tuple[Agent, ...], imports: bool) -> list[FileChange]:
    from memory_mcp.agents.inject import inject as write_blocks

    root = project_root(cwd)

    async def use(memory: MemoryService) -> list[FileChange]:
        brief = await memory.brief(root, dated=True)
        return write_blocks(root, brief.text, agents, imports=imports)

    return with_memory(cwd, use, embeds=False)


def _report(changes: list[FileChange], as_json: bool, root: Path) -> None:
    if as_json:
        print_json([{"path": str(c.path), "outcome": c.outcome, "note": c.note} for c in changes])
        return
    for change in changes:
        where = change.path.relative_to(root) if change.path.is_relative_to(root) else change.path
        note = f" ({change.note})" if change.note else ""
        out.print(f"{where}: {change.outcome}{note}")


AgentOption = Annotated[
    AgentChoice,
    typer.Option("--agent", "-a", help="Whose prompt file: claude, codex, gemini, all."),
]


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


def uninject(
    agent: AgentOption = AgentChoice.all, cwd: CwdOption = None, as_json: JsonOption = False
) -> None:
    """Remove what inject added, restoring each file byte for byte."""
    from memory_mcp.agents.inject import uninject as remove_blocks

    root = project_root(cwd)
    with engine_errors():
        changes = remove_blocks(root, _agents(agent))
    _report(changes, as_json, root)


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
        with engine_errors():
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
        print_json(
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
    from memory_mcp.agents.install import install as add
    from memory_mcp.agents.install import todo

    which, where = _install_args(agent, scope)
    root = project_root(cwd)
    steps: list[str] = []

    def one(cli: Agent) -> list[ConfigChange]:
        changes = add(cli, where, root, hook=hook, name=name)
        steps.extend(todo(cli, where, root, hook=hook, name=name, env=os.environ))
        return changes

    _each_cli(which, one, as_json, steps)


def uninstall(
    agent: Annotated[AgentChoice, typer.Argument(help="claude, codex, gemini or all.")],
    scope: ScopeOption = "user",
    name: NameOption = "memory",
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Remove what install added to a CLI's configuration (the server and the hook)."""
    from memory_mcp.agents.install import uninstall as remove

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
