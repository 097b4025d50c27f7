"""What every command shares: the printers, the common options, opening the
service, and engine errors turned into a message and an exit code."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import anyio
import typer

from memory_mcp.config import LoadedSettings, load_settings, replaced
from memory_mcp.errors import ConfigError, MemoryMcpError
from memory_mcp.records import age
from memory_mcp.scope import project_root
from memory_mcp.service import MemoryService
from memory_mcp.terminal import Printer, Report, progress

if TYPE_CHECKING:
    from memory_mcp.embedders.base import Embedder

T = TypeVar("T")

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


def settings_for(cwd: Path | None) -> LoadedSettings:
    return load_settings(project_root=project_root(cwd))


def serve_settings(cwd: Path | None, command: str, **given: object) -> LoadedSettings:
    """The settings, with the ``serve`` options a command was given (None: not given).

    Raises:
        ConfigError: an option's value is not one ``serve`` accepts.
    """
    loaded = settings_for(cwd)
    changes = {key: value for key, value in given.items() if value is not None}
    try:
        loaded.settings.serve = replaced(loaded.settings.serve, **changes)
    except ConfigError as exc:
        raise ConfigError(f"bad {command} option: {exc}") from None
    return loaded


@contextmanager
def engine_errors() -> Iterator[None]:
    """Engine errors become a message on stderr and their exit code."""
    try:
        yield
    except MemoryMcpError as exc:
        err.print(f"error: {exc}")
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        err.print("interrupted")
        raise typer.Exit(130) from None


def run_engine(work: Callable[[], Awaitable[T]]) -> T:
    """Run async engine work under ``engine_errors``."""
    with engine_errors():
        return anyio.run(work)


def with_memory(
    cwd: Path | None,
    use: Callable[[MemoryService], Awaitable[T]],
    *,
    database: Path | None = None,
    needs_vectors: bool = False,
    embeds: bool = True,
    probe: bool = False,
    storage_url: str | None = None,
) -> T:
    """Run ``use`` with the service open.

    Args:
        storage_url: open the store this ``storage.url`` names instead of the
            settings' one (the team commands' URL).
        needs_vectors: work that is pointless without vectors (re-embedding) waits
            for a model download too.
        embeds: False for work that embeds nothing (the brief, status): the model
            is looked for, not loaded, so the command answers at once.
    """

    async def work() -> T:
        loaded = settings_for(cwd)
        if storage_url:
            settings = loaded.settings
            storage = replaced(settings.storage, url=storage_url)
            loaded = LoadedSettings(replaced(settings, storage=storage), loaded.sources)
        async with open_memory(
            loaded, database, needs_vectors, embeds=embeds, probe=probe
        ) as memory:
            return await use(memory)

    return run_engine(work)


@asynccontextmanager
async def open_memory(
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
            await memory.wait_for_model(_DOWNLOAD_WAIT, err.print)
        yield memory


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, ensure_ascii=False, indent=2, default=str))


def progress_bar(description: str, total: int | None) -> AbstractContextManager[Report]:
    """A progress bar on stderr (``terminal.progress``)."""
    return progress(err, description, total)


def short(text: str, width: int = 100) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def ago(stamp: str, now: datetime) -> str:
    """How long ago: "just now", "5m ago", "3d ago" (``records.age``'s units)."""
    span = age(stamp, now)
    return "just now" if span == "now" else f"{span} ago"
