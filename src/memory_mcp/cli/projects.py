"""``project show``, ``project attach``, ``project detach``, ``project adopt``: which
project this is, and the earlier keys read as its own."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from memory_mcp import views
from memory_mcp.cli.base import CwdOption, JsonOption, out, print_json, with_memory
from memory_mcp.service import MemoryService

HOW = {
    "project": "project.id in",
    "remote": "origin remote",
    "git": "common git directory",
    "path": "directory (not in a git repository)",
}

KeyArgument = Annotated[
    str, typer.Argument(help="A scope key, or the path a project had (its old key).")
]


def show_project(data: dict[str, Any], adopted: list[str] | None = None) -> None:
    """Print a project's identity as ``views.project`` gives it."""
    out.print(f"project key     {data['key']}")
    out.print(f"found from      {HOW[data['how']]} {data['source']}")
    out.print(f"root            {data['root']}")
    attached = [a for a in data["aliases"] if a["detached_at"] is None]
    detached = [a for a in data["aliases"] if a["detached_at"] is not None]
    if not attached:
        out.print("aliases         none")
    for n, alias in enumerate(attached):
        out.print(
            f"{'aliases' if n == 0 else '':<16}{alias['alias']}  (since {alias['attached_at']})"
        )
    for alias in detached:
        out.print(f"detached        {alias['alias']}  (since {alias['detached_at']})")
    if adopted:
        out.print(f"attached now    {', '.join(adopted)}")


def show(cwd: CwdOption = None, as_json: JsonOption = False) -> None:
    """Show the project's key, how it was found, and the earlier keys read as its own."""

    async def use(memory: MemoryService) -> dict[str, Any]:
        return views.project(await memory.project(cwd))

    data = with_memory(cwd, use, embeds=False)
    print_json(data) if as_json else show_project(data)


def adopt(cwd: CwdOption = None, as_json: JsonOption = False) -> None:
    """Attach the project's earlier keys that hold records (its worktrees' and clone's
    paths, the keys of the rules below the one in use) as its aliases."""

    async def use(memory: MemoryService) -> tuple[dict[str, Any], list[str]]:
        project, adopted = await memory.adopt(cwd)
        return views.project(project), adopted

    data, adopted = with_memory(cwd, use, embeds=False)
    if as_json:
        print_json({**data, "adopted": adopted})
    else:
        show_project(data, adopted or ["nothing new"])


def attach(alias: KeyArgument, cwd: CwdOption = None, as_json: JsonOption = False) -> None:
    """Read another key's records as this project's (e.g. a clone's old path key)."""

    async def use(memory: MemoryService) -> dict[str, Any]:
        return views.project(await memory.attach_alias(alias, cwd))

    data = with_memory(cwd, use, embeds=False)
    print_json(data) if as_json else show_project(data)


def detach(alias: KeyArgument, cwd: CwdOption = None, as_json: JsonOption = False) -> None:
    """Stop reading an alias's records as this project's (undoes attach; records stay)."""

    async def use(memory: MemoryService) -> dict[str, Any]:
        return views.project(await memory.detach_alias(alias, cwd))

    data = with_memory(cwd, use, embeds=False)
    print_json(data) if as_json else show_project(data)
