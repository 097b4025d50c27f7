"""Scopes: which project a record belongs to.

A ``project`` scope is keyed by the project's identity (``identity.identify``:
its ``project.id``, else its ``origin`` remote, else its common git directory,
else the real path of the directory). Its *root*, where spawn files and ingest
act, is the git top-level of the working directory, else the directory itself.
The ``global`` scope has the key ``""`` and is only ever written when a caller
asks for it by name; it is personal: each user reads only their own global
records (``Record.visible_to``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from memory_mcp.errors import InvalidInput
from memory_mcp.identity import ProjectIdentity, find_root, identify
from memory_mcp.records import without_surrogates

if TYPE_CHECKING:
    from memory_mcp.storage.base import ScopeAlias

ScopeName = Literal["project", "global"]
GLOBAL_KEY = ""


def project_label(key: str) -> str:
    """A scope key as people name the project: ``app`` for ``/home/me/app/.git`` and
    ``/home/me/app`` (a repository or directory by its path), ``global`` for the
    global scope; a remote (``github.com/org/app``) or a chosen id as it is."""
    if key == GLOBAL_KEY:
        return "global"
    parts = [p for p in key.replace("\\", "/").split("/") if p]
    by_path = key.startswith(("/", "\\")) or (len(key) > 2 and key[1] == ":")
    if by_path and parts and parts[-1] == ".git":
        parts.pop()
    return parts[-1] if by_path and parts else key


@dataclass(frozen=True)
class Scope:
    """A scope, its key, and the aliases read as that key (earlier keys of a project)."""

    name: ScopeName
    key: str
    aliases: tuple[str, ...] = ()

    @property
    def keys(self) -> tuple[str, ...]:
        """Every key whose records belong to this scope: its own, then its aliases."""
        return (self.key, *self.aliases)

    @classmethod
    def project(cls, key: str | Path, aliases: Sequence[str] = ()) -> Scope:
        return cls("project", str(key), tuple(aliases))

    @classmethod
    def global_(cls) -> Scope:
        return cls("global", GLOBAL_KEY)


@dataclass(frozen=True)
class Project:
    """A project as the store knows it: its identity and its aliases."""

    identity: ProjectIdentity
    aliases: tuple[ScopeAlias, ...] = ()  # attached and detached, oldest first

    @property
    def key(self) -> str:
        return self.identity.key

    @property
    def scope(self) -> Scope:
        """Its scope: the key new records go under, and the attached aliases read with it."""
        return Scope.project(self.key, [a.alias for a in self.aliases if a.attached])

    @property
    def keys(self) -> tuple[str, ...]:
        return self.scope.keys


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
    return find_root(Path(os.path.realpath(resolve_cwd(cwd))))[0]


def project_identity(cwd: str | Path | None = None) -> ProjectIdentity:
    """Which project ``cwd`` belongs to: its key, how it was found, its root.

    Raises:
        InvalidInput: ``cwd`` is not an absolute, existing directory.
        ConfigError: the project's ``.memory-mcp.toml`` is unreadable or its
            ``project.id`` unusable.
    """
    return identify(Path(os.path.realpath(resolve_cwd(cwd))))


def project_scope(cwd: str | Path | None = None) -> Scope:
    """The project scope of ``cwd`` (keyed by its identity, not its path)."""
    return Scope.project(project_identity(cwd).key)
