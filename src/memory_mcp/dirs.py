"""Where memory-mcp keeps files that are not settings: the cache directory.

Standard library only: the stdio front and the embedders both use it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def cache_dir() -> Path:
    """The user's cache directory for memory-mcp (no settings needed to find it)."""
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / "memory-mcp" / "cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "memory-mcp"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "memory-mcp"
