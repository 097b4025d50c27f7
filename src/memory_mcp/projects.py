"""A project's aliases, by hand: attach an earlier key, detach one, look again.

``Engine.project`` attaches a project's earlier keys by itself the first time a
process meets the project (``Engine.adopt``); these are the operator's tools
around it (``memory-mcp project``). Records are never rewritten: an alias only
changes which keys a project's searches, brief, folds and upkeep read, so
detaching one undoes attaching it.
"""

from __future__ import annotations

import os
from pathlib import Path

from memory_mcp.engine import Engine
from memory_mcp.errors import InvalidInput, NotFound
from memory_mcp.records import format_time
from memory_mcp.scope import GLOBAL_KEY, Project


def alias_key(text: str) -> str:
    """The key an operator names: an existing directory as its real path (the form of
    the keys before identities), anything else as given."""
    key = text.strip()
    if not key:
        raise InvalidInput("the key is empty; pass a scope key or the path a project had")
    if os.path.isabs(key) and os.path.isdir(key):
        return os.path.realpath(key)
    return key


async def attach(engine: Engine, alias: str, cwd: str | Path | None) -> Project:
    """Read ``alias``'s records as this project's from now on (again, if detached).

    Raises:
        InvalidInput: the key is empty, global, or the project's own.
    """
    project = await engine.project(cwd)
    key = alias_key(alias)
    if key == GLOBAL_KEY or key == project.key:
        raise InvalidInput(f"{key!r} is this project's own key; name an earlier key")
    moved = [a.alias for a in await engine.store.aliases(key) if a.attached]
    at = format_time(engine.clock())
    async with engine.store.write() as tx:
        for name in [key, *moved]:  # no alias names another alias
            await tx.add_alias(name, project.key, at)
    return await engine.project(cwd)


async def detach(engine: Engine, alias: str, cwd: str | Path | None) -> Project:
    """Stop reading ``alias``'s records as this project's (they keep their key).

    Raises:
        NotFound: ``alias`` is not an attached alias of this project.
    """
    project = await engine.project(cwd)
    key = alias_key(alias)
    if key not in project.scope.aliases:
        listed = ", ".join(project.scope.aliases) or "none"
        raise NotFound(f"{key!r} is not an alias of {project.key} (its aliases: {listed})")
    async with engine.store.write() as tx:
        await tx.remove_alias(key, format_time(engine.clock()))
    return await engine.project(cwd)


async def adopt(engine: Engine, cwd: str | Path | None) -> tuple[Project, list[str]]:
    """Look again for the project's earlier keys holding records; the project, and
    the keys attached now."""
    project = await engine.project(cwd)
    adopted = await engine.adopt(project.identity)
    return (await engine.project(cwd) if adopted else project), adopted
