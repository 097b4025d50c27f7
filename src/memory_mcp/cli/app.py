"""The ``memory-mcp`` Typer app: the root options and every command, in the order
``--help`` lists them."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from memory_mcp import __version__
from memory_mcp.bench.cli import bench_app
from memory_mcp.cli import agents, memories, projects, serve, status, team, transfer, ui, upkeep
from memory_mcp.cli.base import err, out

app = typer.Typer(
    name="memory-mcp",
    help="One project brain shared by Claude Code, Codex CLI and Gemini CLI.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(bench_app, name="bench")


def main() -> None:
    """Console entry point (after ``memory_mcp.__main__``'s fast paths)."""
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


app.command()(memories.store)
app.command()(memories.search)
app.command()(serve.serve)
app.command()(ui.ui)
app.command()(memories.forget)
app.command()(memories.brief)
app.command()(agents.inject)
app.command()(agents.uninject)
app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(agents.run)
app.command()(agents.install)
app.command()(agents.uninstall)
app.command()(status.status)
app.command("export")(transfer.export_cmd)
app.command("import")(transfer.import_cmd)
app.command()(transfer.push)
app.command()(transfer.ingest)
app.command()(upkeep.reembed)
app.add_typer(upkeep.conflicts_app, name="conflicts")
app.add_typer(upkeep.project_app, name="project")
upkeep.project_app.command("show")(projects.show)
upkeep.project_app.command("attach")(projects.attach)
upkeep.project_app.command("detach")(projects.detach)
upkeep.project_app.command("adopt")(projects.adopt)
app.command()(upkeep.maintain)
app.command()(upkeep.archived)
app.command()(upkeep.restore)
app.command()(upkeep.doctor)
app.command()(upkeep.backup)
app.add_typer(team.team_app, name="team")
