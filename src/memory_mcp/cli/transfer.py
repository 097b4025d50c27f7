"""Records in and out: ``export``, ``import``, ``push`` to another store, and ``ingest`` of
the project's documents."""

from __future__ import annotations

import sys
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from memory_mcp.cli.base import (
    CwdOption,
    JsonOption,
    err,
    out,
    print_json,
    progress_bar,
    with_memory,
)
from memory_mcp.scope import project_root
from memory_mcp.service import MemoryService

if TYPE_CHECKING:
    from memory_mcp.exchange import ImportSummary


def export_cmd(
    path: Annotated[
        Path | None, typer.Argument(help="Output file (default: standard output).")
    ] = None,
    cwd: CwdOption = None,
) -> None:
    """Export every record (archived and history too) and conflict as JSONL."""

    async def use(memory: MemoryService) -> Any:
        return await memory.export(sys.stdout if path is None else path)

    summary = with_memory(cwd, use, embeds=False)
    err.print(f"exported {summary.records} records and {summary.conflicts} conflicts")


def import_cmd(
    path: Annotated[Path, typer.Argument(help="A file made by `memory-mcp export` ('-': stdin).")],
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Import an export: records are added exactly (existing ids skipped), then embedded."""
    if str(path) != "-" and not path.is_file():
        err.print(f"error: {path} is not a file")
        raise typer.Exit(66)

    async def use(memory: MemoryService) -> Any:
        with progress_bar("importing", None) as report:

            def embedding(done: int, total: int) -> None:
                report(done, total, "embedding")

            source = nullcontext(sys.stdin) if str(path) == "-" else path.open(encoding="utf-8")
            with source as lines:
                return await memory.import_(lines, progress=report, embed_progress=embedding)

    _report(with_memory(cwd, use), "added", as_json)


def push(
    url: Annotated[
        str,
        typer.Argument(
            help="The store to copy into: a storage.url (postgresql://… for a team store, "
            "sqlite:///path/to/memory.db)."
        ),
    ],
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Copy this store into another: every record (history and archived too) and conflict.

    Idempotent and resumable: records keep their ids, so a second run adds only
    what is missing. The copies are embedded there with the active embedder.
    """

    async def use(memory: MemoryService) -> Any:
        with progress_bar("pushing", None) as report:

            def embedding(done: int, total: int) -> None:
                report(done, total, "embedding")

            return await memory.push(url, progress=report, embed_progress=embedding)

    _report(with_memory(cwd, use), "copied", as_json)


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
    root = project_root(cwd)
    given = [p if p.is_absolute() else Path.cwd() / p for p in paths or []]

    async def use(memory: MemoryService) -> Any:
        with progress_bar("files", None) as report:
            summaries = [("project documents", await memory.ingest(root, given, progress=report))]
            if agent_memories and not given:
                found = await memory.ingest_agent_memories(root, progress=report)
                if found.files or found.removed:
                    summaries.append(("Claude Code memory files", found))
            return summaries

    results = with_memory(cwd, use)
    if as_json:
        print_json({label: asdict(summary) for label, summary in results})
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


def _report(summary: ImportSummary, verb: str, as_json: bool) -> None:
    if as_json:
        print_json(asdict(summary))
        return
    out.print(
        f"{verb} {summary.records_added} records ({summary.records_skipped} already there), "
        f"{summary.conflicts_added} conflicts, {summary.aliases_added} project aliases; "
        f"embedded {summary.embedded}, {summary.awaiting_embedding} awaiting an embedder"
    )
