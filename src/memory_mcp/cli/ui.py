"""``ui``: the viewer, a local web app to see and curate the memory (``viewer``)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Annotated

import anyio
import typer

from memory_mcp.cli.base import CwdOption, engine_errors, err, serve_settings
from memory_mcp.config import LoadedSettings

UI_PORT = 8766


def ui(
    host: Annotated[
        str | None, typer.Option(help="Address to serve on (default serve.host, 127.0.0.1).")
    ] = None,
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free one).")] = UI_PORT,
    token: Annotated[
        str | None,
        typer.Option(
            help="Token a browser signs in with; required off loopback. Prefer "
            "MEMORY_MCP_SERVE_TOKEN: a flag shows in the process list.",
        ),
    ] = None,
    cwd: CwdOption = None,
) -> None:
    """Serve the memory viewer in the browser: projects, search, records, conflicts, briefs."""
    with engine_errors():
        loaded = serve_settings(cwd, "ui", host=host, token=token)
        announce = partial(err.print, "memory-mcp:")
        anyio.run(partial(serve_viewer, loaded, port, cwd, announce))


async def serve_viewer(
    loaded: LoadedSettings, port: int, cwd: Path | None, ready: Callable[[str], None]
) -> None:
    """The viewer alone, until SIGINT / SIGTERM."""
    from memory_mcp.mcp.tokens import Tokens
    from memory_mcp.mcp.transports import (
        base_url,
        bind,
        check_exposure,
        serve_asgi,
        tokens_path,
        transport_security,
    )
    from memory_mcp.scope import project_root
    from memory_mcp.service import MemoryService
    from memory_mcp.viewer.app import build_app

    settings = loaded.settings.serve
    check_exposure(settings)
    listener = bind(settings.host, port, setting=None)
    try:
        async with MemoryService.open(loaded) as memory:
            tokens = Tokens(settings.token, tokens_path(settings) if settings.tokens_file else None)
            app = build_app(
                memory,
                tokens=tokens,
                security=transport_security(settings),
                root=project_root(cwd),
            )
            where = f"{base_url(settings, listener.getsockname()[1])}/"
            line = f"the viewer is at {where} ({memory.location})"
            await serve_asgi(app, settings, listener, line, ready)
    finally:
        listener.close()
