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

import copy
import json
import os
import re
import shlex
import shutil
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

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
    real = Path(os.path.realpath(path))  # a symlinked dotfile: edit the file it points to
    original = real.with_name(real.name + ".memory-mcp.bak")
    if outcome == "removed" and not original.exists() and after.strip() in ("", "{}"):
        # No backup of an original: install created this file, and it holds nothing else.
        real.unlink()
        if real.parent.name in (".claude", ".codex", ".gemini") and not any(real.parent.iterdir()):
            real.parent.rmdir()  # the folder it created for it, too
        return ConfigChange(path, "removed", "file removed")
    backup = None
    if real.exists():
        # The first backup is the original: it is never overwritten, so a file edited
        # twice (Gemini's settings.json holds the server and the hook) keeps it too.
        backup = original
        if not backup.exists():
            shutil.copy2(real, backup)
    real.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(real, after.encode("utf-8"))
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
    program = str(entry.get("command") or "")
    args = entry.get("args") or []
    return (
        Path(program).name in ("memory-mcp", "memory-mcp.exe")
        and isinstance(args, list)
        and args[:1] == ["serve"]
    )


def _already(existing: Any, name: str, program: str, where: Path) -> bool:
    """Whether ``existing`` is our entry for ``program`` already (the user may have added
    to it: env, timeouts); a different server under ``name`` is refused.

    Raises:
        InvalidInput: ``name`` belongs to another server.
    """
    if existing is None:
        return False
    if not _ours(existing):
        raise InvalidInput(
            f"{where} already registers a different MCP server named {name!r}; remove it or "
            "install under another name (--name)"
        )
    return bool(existing.get("command") == program)


def _set_server(servers: Any, name: str, entry: dict[str, Any], where: Path) -> str:
    existing = servers.get(name)
    if _already(existing, name, entry["command"], where):
        return "unchanged"
    servers[name] = {**(existing or {}), **entry}
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


def _load_text(path: Path) -> dict[str, str]:
    return {"text": path.read_text(encoding="utf-8") if path.exists() else ""}


def _dump_text(holder: dict[str, str]) -> str:
    return holder["text"]


def _parse_toml(text: str, path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInput(
            f"{path} is not valid TOML ({exc}); fix it, then install again"
        ) from None


def _toml_servers(data: dict[str, Any], path: Path) -> dict[str, Any]:
    servers = data.get("mcp_servers", {})
    if not isinstance(servers, dict):
        raise InvalidInput(f"{path}: mcp_servers is not a table; fix it, then install again")
    return servers


def _toml_block(name: str, program: str) -> str:
    # A TOML basic string takes JSON's escapes.
    return f'[mcp_servers.{name}]\ncommand = {json.dumps(program)}\nargs = ["serve"]\n'


def _add_toml_server(name: str, program: str, path: Path) -> ConfigChange:
    """Append ``[mcp_servers.<name>]`` as text: the rest of the file is not touched.

    The result is parsed again and must equal the old configuration plus this one
    server, so a layout where appending a table would change meaning (say, a
    dotted ``mcp_servers`` key) is refused instead of written.
    """

    def change(holder: dict[str, str]) -> str:
        text = holder["text"]
        data = _parse_toml(text, path)
        existing = _toml_servers(data, path).get(name)
        if _already(existing, name, program, path):
            return "unchanged"
        if existing is not None:  # ours, from another path: take it out first
            text = _without_toml_server(text, name, path)
            data = _parse_toml(text, path)
        block = _toml_block(name, program)
        updated = (
            text
            + ("" if not text or text.endswith("\n\n") else "\n" if text.endswith("\n") else "\n\n")
            + block
        )
        expected = json.loads(json.dumps(data))
        expected.setdefault("mcp_servers", {})[name] = {
            **(existing or {}),
            "command": program,
            "args": ["serve"],
        }
        if _parse_toml(updated, path) != expected:
            raise InvalidInput(
                f"{path}: adding [mcp_servers.{name}] at the end would change other settings "
                "(is mcp_servers set with dotted keys?); add it by hand"
            )
        holder["text"] = updated
        return "added"

    return _with_what(_edit(path, _load_text, _dump_text, change), f"[mcp_servers.{name}]")


def _without_toml_server(text: str, name: str, path: Path) -> str:
    """``text`` without the ``[mcp_servers.<name>]`` table install appended."""
    pattern = re.compile(
        rf"\n?\[mcp_servers\.{re.escape(name)}\]\ncommand = [^\n]*\nargs = \[\"serve\"\]\n"
    )
    data = _parse_toml(text, path)
    expected = copy.deepcopy(data)
    servers = expected.get("mcp_servers", {})
    servers.pop(name, None)
    if not servers:
        expected.pop("mcp_servers", None)
    for match in pattern.finditer(text):
        candidate = text[: match.start()] + text[match.end() :]
        if _parse_toml(candidate, path) == expected:
            return candidate
    raise InvalidInput(
        f"{path}: [mcp_servers.{name}] is not as install wrote it; remove it by hand"
    )


def _remove_toml_server(name: str, path: Path) -> ConfigChange:
    def change(holder: dict[str, str]) -> str:
        data = _parse_toml(holder["text"], path)
        if not _ours(_toml_servers(data, path).get(name)):
            return "unchanged"
        holder["text"] = _without_toml_server(holder["text"], name, path)
        return "removed"

    return _with_what(_edit(path, _load_text, _dump_text, change), f"[mcp_servers.{name}]")


# SessionStart hooks ----------------------------------------------------------------------


def _hook_handler(agent: Agent, program: str) -> dict[str, Any]:
    handler: dict[str, Any] = {"type": "command", "command": shlex.join([program, *HOOK_ARGS])}
    if agent == "gemini":
        handler = {"name": "memory-mcp-brief", **handler, "timeout": 10000}  # milliseconds
    else:
        handler["timeout"] = 10  # seconds
    return handler


def _hook_words(handler: Any) -> list[str]:
    if not isinstance(handler, dict):
        return []
    try:
        return shlex.split(str(handler.get("command") or ""))
    except ValueError:
        return []


def _is_our_hook(handler: Any) -> bool:
    words = _hook_words(handler)
    return (
        len(words) >= 3
        and Path(words[0]).name in ("memory-mcp", "memory-mcp.exe")
        and tuple(words[1:3]) == HOOK_ARGS
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
                    words = _hook_words(handler)
                    if words[0] == program:
                        return "unchanged"  # ours, perhaps with the user's own flags
                    handler["command"] = shlex.join([program, *words[1:]])
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
    if agent == "codex":
        changes = [_remove_toml_server(name, target)]
    else:
        changes = [_remove_json_server(name, target)]
    changes.append(_remove_hook(hook_path(agent, scope, root, home)))
    return changes
