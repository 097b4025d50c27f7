"""Calling the MCP tools as an agent CLI does: a client that names its CLI, one call."""

from __future__ import annotations

from typing import Any

from mcp import Client
from mcp_types import Implementation

from memory_mcp.mcp.tools import build_server
from memory_mcp.service import MemoryService


def client(server: Any, name: str = "claude-code", **kwargs: Any) -> Client:
    """A client for ``server`` (a URL, stdio parameters, a transport) that says it is ``name``."""
    return Client(server, client_info=Implementation(name=name, version="1.0"), **kwargs)


def in_process(memory: MemoryService, name: str = "claude-code", **kwargs: Any) -> Client:
    """A client for the MCP server built on ``memory``, in this process."""
    return client(build_server(memory), name, **kwargs)


async def call(c: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """Call ``tool``; it must succeed, and its structured answer is returned."""
    result = await c.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content
