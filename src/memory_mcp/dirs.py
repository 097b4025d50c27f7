"""The platform's per-user directories for memory-mcp: data, config and cache.

Standard library only: the console entry, the stdio front, the settings and
the embedders all use it, and the front must start in milliseconds.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

# The stdio front's cache of the server's handshake answers, in ``cache_dir()``.
HANDSHAKE_CACHE = "handshake.json"
CACHE_ENV = "MEMORY_MCP_CACHE_DIR"


def data_dir(env: Mapping[str, str] | None = None) -> Path:
    """The platform's per-user data directory for memory-mcp."""
    env = os.environ if env is None else env
    if sys.platform == "win32":
        base = env.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / "memory-mcp"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "memory-mcp"
    xdg = env.get("XDG_DATA_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "share") / "memory-mcp"


def config_dir(env: Mapping[str, str]) -> Path:
    """The platform's per-user config directory for memory-mcp."""
    if sys.platform == "win32":
        base = env.get("APPDATA") or str(Path.home() / "AppData" / "Roaming")
        return Path(base) / "memory-mcp"
    xdg = env.get("XDG_CONFIG_HOME")
    return (Path(xdg) if xdg else Path.home() / ".config") / "memory-mcp"


def cache_dir() -> Path:
    """The user's cache directory for memory-mcp (no settings needed to find it):
    ``$MEMORY_MCP_CACHE_DIR``, else the platform's."""
    if configured := os.environ.get(CACHE_ENV):
        return Path(configured)
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / "memory-mcp" / "cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "memory-mcp"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "memory-mcp"
