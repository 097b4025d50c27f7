"""``install`` / ``uninstall``: register memory-mcp in each agent CLI's own configuration.

Where each CLI reads its MCP servers and SessionStart hooks (their documentation):

========== ============================== ============================== ===========================
CLI        MCP server, user scope         MCP server, project scope      SessionStart hook
========== ============================== ============================== ===========================
claude     ~/.claude.json ``mcpServers``  .mcp.json ``mcpServers``       .claude/settings.json
                                                                         (~/.claude/settings.json)
codex      ~/.codex/config.toml           .codex/config.toml             .codex/hooks.json
           ``[mcp_servers.memory]``       (read in trusted projects)     (~/.codex/hooks.json)
gemini     ~/.gemini/settings.json        .gemini/settings.json          ``hooks`` in the same
           ``mcpServers``                 ``mcpServers``                 settings.json
========== ============================== ============================== ===========================

Every hook runs ``memory-mcp brief --hook``, whose stdout is the
``{"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": ...}}``
all three accept.

Edits merge into what is there: other servers, hooks and settings are kept
(Codex's TOML keeps its comments and layout). Before a file is changed it is
copied to ``<file>.memory-mcp.bak``. Installing twice changes nothing; a
different server already registered under the same name is refused rather than
replaced. ``uninstall`` removes exactly the entries ``install`` adds (and the
containers it had to create, when they are left empty).
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import tomlkit
from tomlkit.exceptions import TOMLKitError

from memory_mcp.errors import InvalidInput
from memory_mcp.inject import Agent, atomic_write

InstallScope = Literal["user", "project"]
SERVER_NAME = "memory"
HOOK_ARGS = ("brief", "--hook")
_MATCHERS: dict[Agent, str | None] = {
    "claude": "startup|resume|clear|compact",
    "codex": "startup|resume|clear",
    "gemini": None,  # lifecycle matchers are exact strings; no matcher: every start
}


# Files backed up during the current install / uninstall call: a file edited twice
# (Gemini's settings.json holds both the server and the hook) keeps the backup of
# its state before the call, not the state between the two edits.
_backed_up: dict[Path, Path] = {}


@dataclass(frozen=True)
class ConfigChange:
    """One configuration file and what ``install`` / ``uninstall`` did to it."""

    path: Path
    outcome: Literal["added", "unchanged", "removed", "absent"]
    what: str
    backup: Path | None = None


def command() -> str:
    """How the CLIs should start memory-mcp: its name on PATH, else its full path."""
    if shutil.which("memory-mcp"):
        return "memory-mcp"
    beside = Path(sys.executable).with_name("memory-mcp")
    return str(beside) if beside.exists() else "memory-mcp"


def server_path(agent: Agent, scope: InstallScope, root: Path, home: Path) -> Path:
    """The file that registers MCP servers for ``agent`` at ``scope``."""
    if agent == "claude":
        return home / ".claude.json" if scope == "user" else root / ".mcp.json"
    if agent == "codex":
        return (home if scope == "user" else root) / ".codex" / "config.toml"
    return (home if scope == "user" else root) / ".gemini" / "settings.json"


def hook_path(agent: Agent, scope: InstallScope, root: Path, home: Path) -> Path:
    """The file that holds ``agent``'s SessionStart hooks at ``scope``."""
    base = home if scope == "user" else root
    if agent == "claude":
        return base / ".claude" / "settings.json"
    if agent == "codex":
        return base / ".codex" / "hooks.json"
    return base / ".gemini" / "settings.json"


# File formats ---------------------------------------------------------------------------


def _load_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput(
            f"{path} is not valid JSON ({exc}); fix it, then install again"
        ) from None
    if not isinstance(data, dict):
        raise InvalidInput(f"{path} does not hold a JSON object; fix it, then install again")
    return data


def _dump_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def _edit(
    path: Path,
    load: Callable[[Path], Any],
    dump: Callable[[Any], str],
    change: Callable[[Any], str],
) -> ConfigChange:
    """Apply ``change`` to the parsed file; write it (after a backup) only if it changed.

    ``change`` returns what it did: "added", "removed" or "unchanged".
    """
    data = load(path)
    before = dump(data) if path.exists() else None
    outcome = change(data)
    after = dump(data)
    if outcome == "unchanged" or after == before:
        return ConfigChange(path, "unchanged" if path.exists() else "absent", "")
    backup = _backed_up.get(path)
    if backup is None and path.exists():
        backup = path.with_name(path.name + ".memory-mcp.bak")
        shutil.copy2(path, backup)
        _backed_up[path] = backup
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, after.encode("utf-8"))
    return ConfigChange(path, "added" if outcome == "added" else "removed", "", backup)


# MCP server entries ---------------------------------------------------------------------


def _server_entry(agent: Agent, program: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"command": program, "args": ["serve"]}
    if agent == "claude":
        entry = {"type": "stdio", **entry, "env": {}}
    return entry


def _ours(entry: Any) -> bool:
    """Whether a registered server entry is memory-mcp's."""
    if not isinstance(entry, dict):
        return False
    program = str(entry.get("command", ""))
    return Path(program).name in ("memory-mcp", "memory-mcp.exe") and list(entry.get("args", []))[
        :1
    ] == ["serve"]


def _set_server(servers: Any, name: str, entry: dict[str, Any], where: Path) -> str:
    existing = servers.get(name)
    if existing is not None and not _ours(existing):
        raise InvalidInput(
            f"{where} already registers a different MCP server named {name!r}; remove it or "
            "install under another name (--name)"
        )
    if existing is not None and dict(existing) == entry:
        return "unchanged"
    servers[name] = entry
    return "added"


def _add_json_server(agent: Agent, name: str, program: str, path: Path) -> ConfigChange:
    def change(data: dict[str, Any]) -> str:
        servers = data.setdefault("mcpServers", {})
        if not isinstance(servers, dict):
            raise InvalidInput(f"{path}: mcpServers is not an object")
        return _set_server(servers, name, _server_entry(agent, program), path)

    return _with_what(_edit(path, _load_json, _dump_json, change), f"MCP server {name!r}")


def _remove_json_server(name: str, path: Path) -> ConfigChange:
    def change(data: dict[str, Any]) -> str:
        servers = data.get("mcpServers")
        if not isinstance(servers, dict) or not _ours(servers.get(name)):
            return "unchanged"
        del servers[name]
        if not servers:
            del data["mcpServers"]
        return "removed"

    return _with_what(_edit(path, _load_json, _dump_json, change), f"MCP server {name!r}")


def _load_toml(path: Path) -> tomlkit.TOMLDocument:
    if not path.exists():
        return tomlkit.document()
    try:
        return tomlkit.parse(path.read_text(encoding="utf-8"))
    except (TOMLKitError, UnicodeDecodeError) as exc:
        raise InvalidInput(
            f"{path} is not valid TOML ({exc}); fix it, then install again"
        ) from None


def _add_toml_server(name: str, program: str, path: Path) -> ConfigChange:
    def change(doc: tomlkit.TOMLDocument) -> str:
        servers = doc.get("mcp_servers")
        if servers is None:
            servers = tomlkit.table(is_super_table=True)
            doc["mcp_servers"] = servers
        entry = {"command": program, "args": ["serve"]}
        existing = servers.get(name)
        if existing is not None and not _ours(existing):
            return _set_server(servers, name, entry, path)  # raises
        if existing is not None and existing.unwrap() == entry:
            return "unchanged"
        table = tomlkit.table()
        table.update(entry)
        servers[name] = table
        return "added"

    return _with_what(_edit(path, _load_toml, tomlkit.dumps, change), f"[mcp_servers.{name}]")


def _remove_toml_server(name: str, path: Path) -> ConfigChange:
    def change(doc: tomlkit.TOMLDocument) -> str:
        servers = doc.get("mcp_servers")
        if servers is None or not _ours(servers.get(name)):
            return "unchanged"
        del servers[name]
        if not servers:
            del doc["mcp_servers"]
        return "removed"

    def dump(doc: tomlkit.TOMLDocument) -> str:
        # tomlkit leaves the blank line it put before the table it removes.
        text = tomlkit.dumps(doc)
        return text.rstrip("\n") + "\n" if text.strip() else ""

    return _with_what(_edit(path, _load_toml, dump, change), f"[mcp_servers.{name}]")


# SessionStart hooks ----------------------------------------------------------------------


def _hook_handler(agent: Agent, program: str) -> dict[str, Any]:
    handler: dict[str, Any] = {"type": "command", "command": f"{program} {' '.join(HOOK_ARGS)}"}
    if agent == "gemini":
        handler = {"name": "memory-mcp-brief", **handler, "timeout": 10000}  # milliseconds
    else:
        handler["timeout"] = 10  # seconds
    return handler


def _is_our_hook(handler: Any) -> bool:
    if not isinstance(handler, dict):
        return False
    words = str(handler.get("command", "")).split()
    return (
        len(words) >= 3 and Path(words[0]).name == "memory-mcp" and tuple(words[1:3]) == HOOK_ARGS
    )


def _add_hook(agent: Agent, program: str, path: Path) -> ConfigChange:
    def change(data: dict[str, Any]) -> str:
        hooks = data.setdefault("hooks", {})
        if not isinstance(hooks, dict):
            raise InvalidInput(f"{path}: hooks is not an object")
        groups = hooks.setdefault("SessionStart", [])
        if not isinstance(groups, list):
            raise InvalidInput(f"{path}: hooks.SessionStart is not a list")
        wanted = _hook_handler(agent, program)
        for group in groups:
            for handler in group.get("hooks", []) if isinstance(group, dict) else []:
                if _is_our_hook(handler):
                    if handler == wanted:
                        return "unchanged"
                    handler.clear()
                    handler.update(wanted)
                    return "added"
        added: dict[str, Any] = {"hooks": [wanted]}
        if _MATCHERS[agent]:
            added = {"matcher": _MATCHERS[agent], **added}
        groups.append(added)
        return "added"

    return _with_what(_edit(path, _load_json, _dump_json, change), "SessionStart hook")


def _remove_hook(path: Path) -> ConfigChange:
    def change(data: dict[str, Any]) -> str:
        hooks = data.get("hooks")
        groups = hooks.get("SessionStart") if isinstance(hooks, dict) else None
        if not isinstance(groups, list):
            return "unchanged"
        removed = False
        for group in list(groups):
            if not isinstance(group, dict) or not isinstance(group.get("hooks"), list):
                continue
            kept = [h for h in group["hooks"] if not _is_our_hook(h)]
            if len(kept) != len(group["hooks"]):
                removed = True
                if kept:
                    group["hooks"] = kept
                else:
                    groups.remove(group)
        if not removed:
            return "unchanged"
        assert isinstance(hooks, dict)
        if not groups:
            del hooks["SessionStart"]
        if not hooks:
            del data["hooks"]
        return "removed"

    return _with_what(_edit(path, _load_json, _dump_json, change), "SessionStart hook")


def _with_what(change: ConfigChange, what: str) -> ConfigChange:
    return ConfigChange(change.path, change.outcome, what, change.backup)


# Entry points ---------------------------------------------------------------------------


def install(
    agent: Agent,
    scope: InstallScope,
    root: Path,
    *,
    hook: bool = False,
    name: str = SERVER_NAME,
    home: Path | None = None,
    program: str | None = None,
) -> list[ConfigChange]:
    """Register the MCP server (and, with ``hook``, the SessionStart hook) for ``agent``.

    Raises:
        InvalidInput: a configuration file cannot be parsed, or another server
            already uses ``name``.
    """
    home = home or Path.home()
    program = program or command()
    target = server_path(agent, scope, root, home)
    _backed_up.clear()
    if agent == "codex":
        changes = [_add_toml_server(name, program, target)]
    else:
        changes = [_add_json_server(agent, name, program, target)]
    if hook:
        changes.append(_add_hook(agent, program, hook_path(agent, scope, root, home)))
    return changes


def uninstall(
    agent: Agent,
    scope: InstallScope,
    root: Path,
    *,
    name: str = SERVER_NAME,
    home: Path | None = None,
) -> list[ConfigChange]:
    """Remove what ``install`` added for ``agent`` at ``scope`` (the server and the hook)."""
    home = home or Path.home()
    target = server_path(agent, scope, root, home)
    _backed_up.clear()
    if agent == "codex":
        changes = [_remove_toml_server(name, target)]
    else:
        changes = [_remove_json_server(name, target)]
    changes.append(_remove_hook(hook_path(agent, scope, root, home)))
    return changes
