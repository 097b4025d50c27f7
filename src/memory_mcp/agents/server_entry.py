"""memory-mcp's MCP server entry: the settings it carries, telling ours from others,
and adding it to or removing it from a JSON configuration (``mcpServers``).

The entry carries the settings a server needs in its ``env`` (``server_env``):
Codex starts MCP servers with a minimal environment, so ``MEMORY_MCP_*``
variables exported in the user's shell would not reach it, and every CLI's
server must find the same store. Values that are secrets (keys, tokens) are not
written into the file: each CLI is told to pass them on from its own
environment by name.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memory_mcp.agents.config_files import JSON, ConfigChange, edit, mapping, with_what
from memory_mcp.agents.hooks import without_our_hooks
from memory_mcp.agents.inject import Agent
from memory_mcp.config import load_settings, user_config_path
from memory_mcp.errors import InvalidInput

MINIMAL_ENV = ("HOME", "LOGNAME", "PATH", "SHELL", "USER", "LANG", "LC_ALL", "TERM", "TMPDIR", "TZ")
_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSWORD")
_PATHS = frozenset(
    {
        "MEMORY_MCP_CONFIG",
        "MEMORY_MCP_CACHE_DIR",
        "MEMORY_MCP_DATA_DIR",
        "MEMORY_MCP_EMBEDDER_MODEL_PATH",
        "MEMORY_MCP_EMBEDDER_CACHE_DIR",
    }
)


@dataclass(frozen=True)
class ServerEnv:
    """What a server entry's environment holds: values, and secrets passed on by name."""

    values: dict[str, str] = field(default_factory=dict)
    forwarded: tuple[str, ...] = ()


def server_env(env: Mapping[str, str]) -> ServerEnv:
    """The settings a server needs from ``env`` (the installing shell's environment).

    Every ``MEMORY_MCP_*`` variable (secrets by name only), plus where the store
    and the user's config file are when the shell finds them through variables
    a CLI may not pass on (``XDG_DATA_HOME``, ``XDG_CONFIG_HOME``).
    """
    values: dict[str, str] = {}
    forwarded: list[str] = []
    for name, value in sorted(env.items()):
        if name.startswith("MEMORY_MCP_") and value.strip():
            if _SECRET.search(name.removeprefix("MEMORY_MCP_")):
                forwarded.append(name)
            elif name in _PATHS:  # servers start in each project: a relative path would move
                values[name] = os.path.abspath(os.path.expanduser(value))
            else:
                values[name] = value
    minimal = {k: env[k] for k in MINIMAL_ENV if k in env}
    config = user_config_path(env)
    if config.is_file() and user_config_path({**minimal, **values}) != config:
        values["MEMORY_MCP_CONFIG"] = str(config)
    if "MEMORY_MCP_DATA_DIR" not in values:
        seen = {k: v for k, v in env.items() if k not in forwarded}
        store = load_settings(env=seen).settings.database_path(seen)
        theirs = {**minimal, **values}
        if load_settings(env=theirs).settings.database_path(theirs) != store:
            values["MEMORY_MCP_DATA_DIR"] = str(store.parent)
    return ServerEnv(dict(sorted(values.items())), tuple(forwarded))


def _server_entry(agent: Agent, program: str, senv: ServerEnv) -> dict[str, Any]:
    env = {**senv.values, **{name: "${" + name + "}" for name in senv.forwarded}}
    entry: dict[str, Any] = {"command": program, "args": ["serve"]}
    if agent == "claude":
        entry = {"type": "stdio", **entry}
    entry["env"] = env
    return entry


def ours(entry: Any) -> bool:
    """Whether a registered server entry is memory-mcp's."""
    if not isinstance(entry, dict):
        return False
    program = str(entry.get("command") or "")
    args = entry.get("args") or []
    return (
        Path(program).name in ("memory-mcp", "memory-mcp.exe")
        and isinstance(args, list)
        and args[:1] == ["serve"]
    )


def check_name(existing: Any, name: str, where: Path) -> None:
    """A different server under ``name`` is refused.

    Raises:
        InvalidInput: ``name`` belongs to another server.
    """
    if existing is not None and not ours(existing):
        raise InvalidInput(
            f"{where} already registers a different MCP server named {name!r}; remove it or "
            "install under another name (--name)"
        )


def _set_server(servers: Any, name: str, entry: dict[str, Any], where: Path) -> str:
    existing = servers.get(name)
    check_name(existing, name, where)
    # The user's own additions to our entry (timeouts, other variables) stay; every
    # MEMORY_MCP_* variable is install's, so one the shell no longer sets goes.
    env = {**users(mapping((existing or {}).get("env"))), **entry["env"]}
    merged = {**(existing or {}), **entry, "env": env}
    if merged == existing:
        return "unchanged"
    servers[name] = merged
    return "added" if existing is None else "updated"


def users(env: Mapping[str, Any]) -> dict[str, Any]:
    """The variables of a server entry that are the user's, not install's."""
    return {k: v for k, v in env.items() if not str(k).startswith("MEMORY_MCP_")}


def add_json_server(
    agent: Agent, name: str, program: str, senv: ServerEnv, path: Path
) -> ConfigChange:
    def change(data: dict[str, Any]) -> str:
        servers = data.setdefault("mcpServers", {})
        if not isinstance(servers, dict):
            raise InvalidInput(f"{path}: mcpServers is not an object")
        return _set_server(servers, name, _server_entry(agent, program, senv), path)

    return with_what(edit(path, JSON, change, strip_json(name)), f"MCP server {name!r}")


def remove_json_server(name: str, path: Path) -> ConfigChange:
    def change(data: dict[str, Any]) -> str:
        servers = data.get("mcpServers")
        if not isinstance(servers, dict) or not ours(servers.get(name)):
            return "unchanged"
        del servers[name]
        if not servers:
            del data["mcpServers"]
        return "removed"

    return with_what(edit(path, JSON, change, strip_json(name)), f"MCP server {name!r}")


def strip_json(name: str) -> Callable[[Any], object]:
    """Take our server entry and our hooks out of a parsed JSON configuration."""

    def strip(data: dict[str, Any]) -> None:
        servers = data.get("mcpServers")
        if isinstance(servers, dict) and ours(servers.get(name)):
            del servers[name]
            if not servers:
                del data["mcpServers"]
        without_our_hooks(data)

    return strip
