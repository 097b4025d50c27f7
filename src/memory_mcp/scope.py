"""Scopes: which project a record belongs to.

A ``project`` scope is keyed by the project root: the real path of the git
top-level of the working directory, else the real path of the directory itself.
The ``global`` scope has the key ``""`` and is only ever written when a caller
asks for it by name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from memory_mcp.errors import InvalidInput
from memory_mcp.records import without_surrogates

ScopeName = Literal["project", "global"]
GLOBAL_KEY = ""


@dataclass(frozen=True)
class Scope:
    """A scope and its key."""

    name: ScopeName
    key: str

    @classmethod
    def project(cls, root: str | Path) -> Scope:
        return cls("project", str(root))

    @classmethod
    def global_(cls) -> Scope:
        return cls("global", GLOBAL_KEY)


def resolve_cwd(cwd: str | Path | None) -> Path:
    """Validate a working directory given by a caller (absolute, existing, a directory)."""
    if cwd is None or cwd == "":
        return Path(os.getcwd())
    path = Path(cwd)
    if "\x00" in str(cwd) or without_surrogates(str(cwd)) != str(cwd):
        raise InvalidInput(
            "cwd contains a NUL or an invalid (surrogate) character; pass an absolute "
            "directory path"
        )
    shown = str(cwd) if len(str(cwd)) <= 200 else str(cwd)[:200] + "…"
    if not path.is_absolute():
        raise InvalidInput(f"cwd must be an absolute path, got {shown!r}")
    try:
        exists = path.is_dir()
    except OSError as exc:  # a name too long, a loop of links, no permission
        raise InvalidInput(f"cwd {shown!r} cannot be used: {exc.strerror or exc}") from exc
    if not exists:
        raise InvalidInput(f"cwd {shown!r} is not an existing directory")
    return path


def project_root(cwd: str | Path | None = None) -> Path:
    """The project root of ``cwd``: its git top-level, else the directory itself.

    Both are real paths (symlinks resolved), so one project has one key however
    it is reached. Walking up for ``.git`` (a directory, or a file in worktrees
    and submodules) gives git's own answer without spawning git.
    """
    start = Path(os.path.realpath(resolve_cwd(cwd)))
    for candidate in (start, *start.parents):
        if (candidate / ".git").exists():
            return candidate
    return start


def project_scope(cwd: str | Path | None = None) -> Scope:
    """The project scope of ``cwd``."""
    return Scope.project(project_root(cwd))
