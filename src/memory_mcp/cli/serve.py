"""``serve``: the MCP server, over stdio behind the front, or over HTTP."""

from __future__ import annotations

from enum import StrEnum
from functools import partial
from typing import Annotated

import anyio
import typer

from memory_mcp.cli.base import (
    CwdOption,
    engine_errors,
    err,
    serve_settings,
)


class TransportChoice(StrEnum):
    stdio = "stdio"
    sse = "sse"
    streamable_http = "streamable-http"


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
    from memory_mcp.mcp import front
    from memory_mcp.mcp.transports import Transport
    from memory_mcp.mcp.transports import serve as run_server

    if transport is TransportChoice.stdio:
        front.run(str(cwd) if cwd else None)
    with engine_errors():
        loaded = serve_settings(cwd, "serve", host=host, port=port, token=token)
        announce = partial(err.print, "memory-mcp:")
        http: Transport = "sse" if transport is TransportChoice.sse else "streamable-http"
        anyio.run(partial(run_server, loaded, http, ready=announce))
