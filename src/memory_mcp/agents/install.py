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

Every hook runs ``memory-mcp brief --hook --agent <cli>``, whose stdout is the
``{"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": ...}}``
all three accept.

The server entry carries the settings a server needs in its ``env``
(``server_env``): Codex starts MCP servers with a minimal environment, so
``MEMORY_MCP_*`` variables exported in the user's shell would not reach it,
and every CLI's server must find the same store. Values that are secrets
(keys, tokens) are not written into the file: each CLI is told to pass them
on from its own environment by name.

Edits merge into what is there: other servers, hooks and settings are kept
(Codex's TOML keeps its comments and layout). Before a file the user had is
changed, it is copied to ``<file>.memory-mcp.bak`` (once: the backup is the
original). Installing twice changes nothing; a different server already
registered under the same name is refused rather than replaced.
``uninstall`` removes exactly what ``install`` added: a file install created
is deleted, a file that is otherwise as it was gets its original bytes back
(and the backup goes), and one the user changed since keeps those changes.
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from memory_mcp.agents.inject import AGENTS, Agent, atomic_write
from memory_mcp.config import load_settings, user_config_path
from memory_mcp.errors import InvalidInput

InstallScope = Literal["user", "project"]
SCOPES: tuple[InstallScope, ...] = ("user", "project")
SERVER_NAME = "memory"
HOOK_ARGS = ("brief", "--hook")
_MATCHERS: dict[Agent, str | None] = {
    "claude": "startup|resume|clear|compact",
    "codex": "startup|resume|clear",
    "gemini": None,  # lifecycle matchers are exact strings; no matcher: every start
}
# What Codex passes an MCP server of the user's environment (codex-rs, rmcp-client's
# default list); a server must find its settings with nothing more.
MINIMAL_ENV = ("HOME", "LOGNAME", "PATH", "SHELL", "USER", "LANG", "LC_ALL", "TERM", "TMPDIR", "TZ")
_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSWORD")
_PATHS = frozenset(
    {
        "MEMORY_MCP_CONFIG",
        "MEMORY_MCP_DATA_DIR",
        "MEMORY_MCP_EMBEDDER_MODEL_PATH",
        "MEMORY_MCP_EMBEDDER_CACHE_DIR",
    }
)
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True)
class ConfigChange:
    """One configuration file and what ``install`` / ``uninstall`` did to it."""

    path: Path
    outcome: Literal["added", "updated", "unchanged", "removed", "absent"]
    what: str
    backup: Path | None = None
    note: str = ""


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


@dataclass(frozen=True)
class _Format:
    """How to read, write and compare one kind of configuration file."""

    load: Callable[[Path], Any]
    dump: Callable[[Any, str], str]  # (data, the file's text so far: its style is kept)
    parsed: Callable[[Any, Path], Any]  # what two versions are compared by


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


def _dump_json(data: dict[str, Any], old: str) -> str:
    """``data`` as JSON in the style of ``old``: its indentation and final line break.

    Claude Code and Gemini CLI write their files with two spaces and no final
    newline; a file edited here keeps whichever style it had (new files: two
    spaces and a newline).
    """
    indent = re.match(r"\{\r?\n([ \t]+)\S", old)
    step: int | str = 2
    if indent:
        step = len(indent.group(1)) if "\t" not in indent.group(1) else indent.group(1)
    end = "\n" if not old or old.endswith("\n") else ""
    return json.dumps(data, indent=step, ensure_ascii=False) + end


def _load_text(path: Path) -> dict[str, str]:
    return {"text": path.read_text(encoding="utf-8") if path.exists() else ""}


def _dump_text(holder: dict[str, str], old: str) -> str:
    return holder["text"]


_JSON = _Format(_load_json, _dump_json, lambda data, _path: data)
_TOML = _Format(_load_text, _dump_text, lambda holder, path: _parse_toml(holder["text"], path))


def _edit(
    path: Path,
    form: _Format,
    change: Callable[[Any], str],
    remove_ours: Callable[[Any], object],
) -> ConfigChange:
    """Apply ``change`` to the parsed file; write it only if it changed.

    ``change`` returns what it did: "added", "updated", "removed" or "unchanged".
    ``remove_ours`` takes every entry of ours out of a parsed copy: a file that
    holds nothing else was made by install, so it is never backed up as if it
    were the user's, and it is deleted when the last of ours goes.
    """
    real = Path(os.path.realpath(path))  # a symlinked dotfile: edit the file it points to
    data = form.load(real)
    existed = real.exists()
    old = real.read_text(encoding="utf-8") if existed else ""
    before = copy.deepcopy(data)
    outcome = change(data)
    after = form.dump(data, old)
    if outcome == "unchanged" or (existed and after == old):
        return ConfigChange(path, "unchanged" if existed else "absent", "")
    backup = real.with_name(real.name + ".memory-mcp.bak")
    if outcome == "removed":
        last = _without_ours(data, form, remove_ours, old) == after  # none of ours is left
        return _remove(path, real, backup, form, data, after, last=last)
    if existed and not backup.exists() and not _only_ours(before, form, remove_ours):
        shutil.copy2(real, backup)  # the original, kept until uninstall gives it back
    real.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(real, after.encode("utf-8"))
    made = outcome if outcome in ("added", "updated") else "added"
    return ConfigChange(path, made, "", backup if backup.exists() else None)  # type: ignore[arg-type]


def _without_ours(data: Any, form: _Format, remove_ours: Callable[[Any], object], old: str) -> str:
    """``data`` as text without any entry of ours (``data`` itself is left as it is)."""
    stripped = copy.deepcopy(data)
    remove_ours(stripped)
    return form.dump(stripped, old)


def _only_ours(data: Any, form: _Format, remove_ours: Callable[[Any], object]) -> bool:
    """Whether ``data`` holds entries of ours and nothing else (an empty file is the user's)."""
    left = _without_ours(data, form, remove_ours, "")
    return left != form.dump(data, "") and left.strip() in ("", "{}")


def _remove(
    path: Path, real: Path, backup: Path, form: _Format, data: Any, after: str, *, last: bool
) -> ConfigChange:
    """Write ``after`` (the file without an entry of ours), as close to the original as can be.

    Once the last entry of ours is out, the backup has served: it goes, unless the
    file's original bytes cannot be given back (something else changed since
    install, which stays), and even then, since every entry of ours is gone.
    """
    if backup.exists():
        original = form.load(backup)
        if form.parsed(original, backup) == form.parsed(data, real):
            atomic_write(real, backup.read_bytes())  # nothing else changed: the original bytes
            backup.unlink()
            return ConfigChange(path, "removed", "", note="restored byte for byte")
        atomic_write(real, after.encode("utf-8"))
        if last:
            backup.unlink()
            return ConfigChange(path, "removed", "", note="other changes made since install stay")
        return ConfigChange(path, "removed", "", backup)
    if after.strip() in ("", "{}"):  # install created it, and it holds nothing else
        real.unlink()
        if real.parent.name in (".claude", ".codex", ".gemini") and not any(real.parent.iterdir()):
            real.parent.rmdir()  # the folder it created for it, too
        return ConfigChange(path, "removed", "", note="file removed")
    atomic_write(real, after.encode("utf-8"))
    return ConfigChange(path, "removed", "")


# MCP server entries ---------------------------------------------------------------------


def _server_entry(agent: Agent, program: str, senv: ServerEnv) -> dict[str, Any]:
    env = {**senv.values, **{name: "${" + name + "}" for name in senv.forwarded}}
    entry: dict[str, Any] = {"command": program, "args": ["serve"]}
    if agent == "claude":
        entry = {"type": "stdio", **entry}
    entry["env"] = env
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


def _check_name(existing: Any, name: str, where: Path) -> None:
    """A different server under ``name`` is refused.

    Raises:
        InvalidInput: ``name`` belongs to another server.
    """
    if existing is not None and not _ours(existing):
        raise InvalidInput(
            f"{where} already registers a different MCP server named {name!r}; remove it or "
            "install under another name (--name)"
        )


def _set_server(servers: Any, name: str, entry: dict[str, Any], where: Path) -> str:
    existing = servers.get(name)
    _check_name(existing, name, where)
    # The user's own additions to our entry (timeouts, other variables) stay; every
    # MEMORY_MCP_* variable is install's, so one the shell no longer sets goes.
    env = {**_users(_mapping((existing or {}).get("env"))), **entry["env"]}
    merged = {**(existing or {}), **entry, "env": env}
    if merged == existing:
        return "unchanged"
    servers[name] = merged
    return "added" if existing is None else "updated"


def _users(env: Mapping[str, Any]) -> dict[str, Any]:
    """The variables of a server entry that are the user's, not install's."""
    return {k: v for k, v in env.items() if not str(k).startswith("MEMORY_MCP_")}


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _add_json_server(
    agent: Agent, name: str, program: str, senv: ServerEnv, path: Path
) -> ConfigChange:
    def change(data: dict[str, Any]) -> str:
        servers = data.setdefault("mcpServers", {})
        if not isinstance(servers, dict):
            raise InvalidInput(f"{path}: mcpServers is not an object")
        return _set_server(servers, name, _server_entry(agent, program, senv), path)

    return _with_what(_edit(path, _JSON, change, _strip_json(name)), f"MCP server {name!r}")


def _remove_json_server(name: str, path: Path) -> ConfigChange:
    def change(data: dict[str, Any]) -> str:
        servers = data.get("mcpServers")
        if not isinstance(servers, dict) or not _ours(servers.get(name)):
            return "unchanged"
        del servers[name]
        if not servers:
            del data["mcpServers"]
        return "removed"

    return _with_what(_edit(path, _JSON, change, _strip_json(name)), f"MCP server {name!r}")


def _strip_json(name: str) -> Callable[[Any], object]:
    """Take our server entry and our hooks out of a parsed JSON configuration."""

    def strip(data: dict[str, Any]) -> None:
        servers = data.get("mcpServers")
        if isinstance(servers, dict) and _ours(servers.get(name)):
            del servers[name]
            if not servers:
                del data["mcpServers"]
        _without_our_hooks(data)

    return strip


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


def _toml_lines(entry: dict[str, Any]) -> list[str]:
    """``_toml_entry``'s keys, one line each: strings, lists of strings and the ``env``
    table inline (a TOML basic string takes JSON's escapes)."""
    lines = []
    for key, value in entry.items():
        if isinstance(value, dict):
            pairs = ", ".join(f"{_toml_key(k)} = {json.dumps(v)}" for k, v in value.items())
            lines.append(f"{key} = {{ {pairs} }}\n")
        else:
            lines.append(f"{key} = {json.dumps(value)}\n")
    return lines


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _toml_entry(program: str, senv: ServerEnv) -> dict[str, Any]:
    """Our keys of ``[mcp_servers.<name>]``, as Codex reads them."""
    entry: dict[str, Any] = {"command": program, "args": ["serve"]}
    if senv.values:
        entry["env"] = dict(senv.values)
    if senv.forwarded:  # Codex passes these on from its own environment, by name
        entry["env_vars"] = list(senv.forwarded)
    return entry


_OUR_TOML_KEYS = ("command", "args", "env", "env_vars")
_TABLE = re.compile(r"^\s*\[")
_OUR_LINE = re.compile(rf"^\s*(?:{'|'.join(_OUR_TOML_KEYS)})\s*=")


def _tables(lines: list[str], name: str, *, under: bool) -> list[tuple[int, int]]:
    """Where ``[mcp_servers.<name>]`` (or, with ``under``, its sub-tables) and their
    key lines are: (first line, end) spans, a blank line before each included."""
    own = re.escape(name)
    header = re.compile(
        rf"^\s*\[\s*mcp_servers\.{own}\.[^\]]+\]" if under else rf"^\s*\[\s*mcp_servers\.{own}\s*\]"
    )
    spans = []
    for i, line in enumerate(lines):
        if header.match(line):
            end = i + 1
            while end < len(lines) and not _TABLE.match(lines[end]):
                end += 1
            while end > i + 1 and not lines[end - 1].strip():
                end -= 1  # blank lines before the next table are that table's
            start = i - 1 if i and not lines[i - 1].strip() else i
            spans.append((start, end))
    return spans


def _cut(lines: list[str], spans: list[tuple[int, int]]) -> list[str]:
    gone = {i for start, end in spans for i in range(start, end)}
    return [line for i, line in enumerate(lines) if i not in gone]


def _add_toml_server(name: str, program: str, senv: ServerEnv, path: Path) -> ConfigChange:
    """Append ``[mcp_servers.<name>]`` as text: the rest of the file is not touched.

    A new table goes at the end; an existing one of ours gets its own key lines
    replaced where it is, so the user's additions to it (``startup_timeout_sec``,
    their own variables, the ``[mcp_servers.<name>.tools.*]`` tables Codex writes
    when a tool is allowed for good) stay. The result is parsed again and must
    equal the old configuration with just this server changed, so a layout where
    that does not hold (a dotted or inline ``mcp_servers``) is refused, untouched.
    """

    def change(holder: dict[str, str]) -> str:
        text = holder["text"]
        data = _parse_toml(text, path)
        existing = _toml_servers(data, path).get(name)
        _check_name(existing, name, path)
        old = _mapping(existing)
        env = {**_users(_mapping(old.get("env"))), **senv.values}
        kept = [n for n in old.get("env_vars", []) if not str(n).startswith("MEMORY_MCP_")]
        wanted = ServerEnv(env, (*kept, *senv.forwarded))
        entry = _toml_entry(program, wanted)
        if existing is not None and {k: old[k] for k in _OUR_TOML_KEYS if k in old} == entry:
            return "unchanged"
        lines = text.splitlines(keepends=True)
        if existing is None:
            gap = (
                "" if not text or text.endswith("\n\n") else "\n" if text.endswith("\n") else "\n\n"
            )
            updated = text + gap + f"[mcp_servers.{name}]\n" + "".join(_toml_lines(entry))
        else:
            spans = _tables(lines, name, under=False)
            if len(spans) != 1:
                raise InvalidInput(
                    f"{path}: [mcp_servers.{name}] is not a table of its own; edit it by hand"
                )
            start, end = spans[0]
            header = start if _TABLE.match(lines[start]) else start + 1
            body = [line for line in lines[header + 1 : end] if not _OUR_LINE.match(line)]
            updated = "".join([*lines[: header + 1], *_toml_lines(entry), *body, *lines[end:]])
        expected = json.loads(json.dumps(data))
        servers = expected.setdefault("mcp_servers", {})
        servers[name] = {**{k: v for k, v in old.items() if k not in _OUR_TOML_KEYS}, **entry}
        try:
            same = _parse_toml(updated, path) == expected
        except InvalidInput:
            same = False
        if not same:
            raise InvalidInput(
                f"{path}: memory-mcp cannot add [mcp_servers.{name}] without changing other "
                "settings (is mcp_servers written inline, or with dotted keys?); add it by hand"
            )
        holder["text"] = updated
        return "added" if existing is None else "updated"

    strip = _strip_toml(name, path)
    return _with_what(_edit(path, _TOML, change, strip), f"[mcp_servers.{name}]")


def _without_toml_server(text: str, name: str, path: Path) -> str:
    """``text`` without the ``[mcp_servers.<name>]`` table and the tables under it
    (``[mcp_servers.<name>.tools.x]``, written by Codex when the user allowed a tool
    for good: they belong to the server that goes)."""
    lines = text.splitlines(keepends=True)
    spans = _tables(lines, name, under=False) + _tables(lines, name, under=True)
    candidate = "".join(_cut(lines, spans))
    expected = copy.deepcopy(_parse_toml(text, path))
    servers = expected.get("mcp_servers", {})
    servers.pop(name, None)
    if not servers:
        expected.pop("mcp_servers", None)
    try:
        if spans and _parse_toml(candidate, path) == expected:
            return candidate
    except InvalidInput:
        pass
    raise InvalidInput(
        f"{path}: [mcp_servers.{name}] is not laid out as a table memory-mcp can take out; "
        "remove it by hand"
    )


def _strip_toml(name: str, path: Path) -> Callable[[Any], object]:
    def strip(holder: dict[str, str]) -> None:
        if _ours(_toml_servers(_parse_toml(holder["text"], path), path).get(name)):
            holder["text"] = _without_toml_server(holder["text"], name, path)

    return strip


def _remove_toml_server(name: str, path: Path) -> ConfigChange:
    def change(holder: dict[str, str]) -> str:
        data = _parse_toml(holder["text"], path)
        if not _ours(_toml_servers(data, path).get(name)):
            return "unchanged"
        holder["text"] = _without_toml_server(holder["text"], name, path)
        return "removed"

    strip = _strip_toml(name, path)
    return _with_what(_edit(path, _TOML, change, strip), f"[mcp_servers.{name}]")


# SessionStart hooks ----------------------------------------------------------------------


def hook_words(program: str, agent: Agent) -> list[str]:
    """The hook's command line: the brief, for ``agent`` (which then skips it when the
    agent's prompt file already carries an injected brief)."""
    return [program, *HOOK_ARGS, "--agent", agent]


def _hook_handler(agent: Agent, program: str) -> dict[str, Any]:
    handler: dict[str, Any] = {"type": "command", "command": shlex.join(hook_words(program, agent))}
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


def _add_hook(agent: Agent, program: str, path: Path, name: str) -> ConfigChange:
    def change(data: dict[str, Any]) -> str:
        hooks = data.setdefault("hooks", {})
        if not isinstance(hooks, dict):
            raise InvalidInput(f"{path}: hooks is not an object")
        groups = hooks.setdefault("SessionStart", [])
        if not isinstance(groups, list):
            raise InvalidInput(f"{path}: hooks.SessionStart is not a list")
        for group in groups:
            for handler in group.get("hooks", []) if isinstance(group, dict) else []:
                if _is_our_hook(handler):
                    words = _hook_words(handler)
                    wanted = [program, *words[1:]]  # the user's own flags stay
                    if "--agent" not in wanted:
                        wanted += ["--agent", agent]
                    if words == wanted:
                        return "unchanged"
                    handler["command"] = shlex.join(wanted)
                    return "updated"
        added: dict[str, Any] = {"hooks": [_hook_handler(agent, program)]}
        if _MATCHERS[agent]:
            added = {"matcher": _MATCHERS[agent], **added}
        groups.append(added)
        return "added"

    return _with_what(_edit(path, _JSON, change, _strip_json(name)), "SessionStart hook")


def _without_our_hooks(data: dict[str, Any]) -> str:
    """Take our SessionStart hooks out of ``data``; "removed" if there were any."""
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


def _remove_hook(path: Path, name: str) -> ConfigChange:
    strip = _strip_json(name)
    return _with_what(_edit(path, _JSON, _without_our_hooks, strip), "SessionStart hook")


def _with_what(change: ConfigChange, what: str) -> ConfigChange:
    return ConfigChange(change.path, change.outcome, what, change.backup, change.note)


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
    env: Mapping[str, str] | None = None,
) -> list[ConfigChange]:
    """Register the MCP server (and, with ``hook``, the SessionStart hook) for ``agent``.

    Args:
        env: the environment whose settings the server entry carries (``server_env``;
            at project scope none: the file is shared, the settings are personal).

    Raises:
        InvalidInput: a configuration file cannot be parsed, another server already
            uses ``name``, or ``name`` is not a plain name.
    """
    if not _NAME.fullmatch(name):
        raise InvalidInput(f"--name {name!r}: use letters, digits, - and _ (at most 64)")
    home = home or Path.home()
    program = program or command()
    senv = server_env(os.environ if env is None else env) if scope == "user" else ServerEnv()
    target = server_path(agent, scope, root, home)
    if agent == "codex":
        changes = [_add_toml_server(name, program, senv, target)]
    else:
        changes = [_add_json_server(agent, name, program, senv, target)]
    if hook:
        changes.append(_add_hook(agent, program, hook_path(agent, scope, root, home), name))
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
    changes.append(_remove_hook(hook_path(agent, scope, root, home), name))
    return changes


# What the user must still do, and what is in place ----------------------------------------


@dataclass(frozen=True)
class AgentSetup:
    """Where memory-mcp is registered for one CLI, and what still stands in its way."""

    agent: Agent
    servers: list[InstallScope]  # scopes that register the server
    hooks: list[InstallScope]  # scopes that hold the hook
    todo: list[str]  # what the user must do before it works

    def to_json(self) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "servers": self.servers,
            "hooks": self.hooks,
            "todo": self.todo,
        }


def todo(
    agent: Agent,
    scope: InstallScope,
    root: Path,
    *,
    hook: bool,
    home: Path | None = None,
    name: str = SERVER_NAME,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """What the user must do after ``install`` before ``agent`` uses it, if anything.

    Args:
        env: the installing shell's environment; at project scope, settings it holds
            that Codex's server would miss are named.
    """
    home = home or Path.home()
    steps: list[str] = []
    if agent == "claude" and scope == "project" and not _claude_approved(root, home, name):
        steps.append(
            "Claude Code asks once to approve the servers of a project's .mcp.json: start "
            "`claude` here and approve 'memory' (or list it in enabledMcpjsonServers in "
            ".claude/settings.local.json)."
        )
    if agent == "codex":
        personal = server_env(env).values if env is not None and scope == "project" else {}
        if personal:
            steps.append(
                "A project's .codex/config.toml is shared, so it carries none of your "
                f"settings ({', '.join(personal)}); Codex starts servers with a minimal "
                "environment, so put them in ~/.config/memory-mcp/config.toml "
                "(e.g. data_dir) or install with --scope user."
            )
        if scope == "project" and not _codex_trusts(root, home):
            steps.append(
                "Codex reads .codex/config.toml only in a trusted project: start `codex` "
                f"in {root} and trust it."
            )
        if hook and not _codex_hook_trusted(hook_path(agent, scope, root, home), home):
            steps.append(
                "Codex runs a new hook only after you trust it: start `codex`, open /hooks "
                "(it says a hook needs review) and choose Trust. Until then `codex exec` "
                "skips it without a word, and sessions start without the brief."
            )
    if agent == "gemini" and not _gemini_trusts(root, home):
        steps.append(
            "Gemini CLI turns MCP servers and hooks off in folders you have not trusted: "
            f"start `gemini` in {root} and trust the folder (it asks), or add it to "
            "~/.gemini/trustedFolders.json as TRUST_FOLDER."
        )
    return steps


def inspect(root: Path, *, home: Path | None = None, name: str = SERVER_NAME) -> list[AgentSetup]:
    """Where memory-mcp's server and hook are registered for each CLI, for ``status``."""
    home = home or Path.home()
    found = []
    for agent in AGENTS:
        servers = [s for s in SCOPES if _has_server(agent, server_path(agent, s, root, home), name)]
        hooks = [s for s in SCOPES if _has_hook(hook_path(agent, s, root, home))]
        steps: list[str] = []
        for scope in dict.fromkeys([*servers, *hooks]):
            for step in todo(agent, scope, root, hook=scope in hooks, home=home, name=name):
                if step not in steps:
                    steps.append(step)
        found.append(AgentSetup(agent, servers, hooks, steps))
    return found


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return _load_json(path)
    except InvalidInput:
        return {}


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return {}


def _has_server(agent: Agent, path: Path, name: str) -> bool:
    if agent == "codex":
        servers = _read_toml(path).get("mcp_servers")
    else:
        servers = _read_json(path).get("mcpServers")
    return isinstance(servers, dict) and _ours(servers.get(name))


def _has_hook(path: Path) -> bool:
    return _without_our_hooks(copy.deepcopy(_read_json(path))) == "removed"


def _claude_approved(root: Path, home: Path, name: str) -> bool:
    projects = _mapping(_read_json(home / ".claude.json").get("projects"))
    project = _mapping(projects.get(str(root)))
    local = _read_json(root / ".claude" / "settings.local.json")
    approved = [
        *_strings(project.get("enabledMcpjsonServers")),
        *_strings(local.get("enabledMcpjsonServers")),
    ]
    return name in approved or local.get("enableAllProjectMcpServers") is True


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _codex_config(home: Path) -> dict[str, Any]:
    return _read_toml(home / ".codex" / "config.toml")


def _codex_trusts(root: Path, home: Path) -> bool:
    project = _mapping(_mapping(_codex_config(home).get("projects")).get(str(root)))
    return project.get("trust_level") == "trusted"


def _codex_hook_trusted(hooks: Path, home: Path) -> bool:
    """Whether Codex holds a trust decision for a SessionStart hook of ``hooks``.

    Codex keys it ``<hooks.json>:session_start:<group>:<hook>`` with the hash of
    the hook it trusted; a changed hook needs another review, which only Codex
    can tell.
    """
    state = _mapping(_mapping(_codex_config(home).get("hooks")).get("state"))
    prefix = f"{os.path.realpath(hooks)}:session_start:"
    return any(
        str(key).startswith(prefix) and isinstance(v, dict) and v.get("trusted_hash")
        for key, v in state.items()
    )


def _gemini_trusts(root: Path, home: Path) -> bool:
    settings = _read_json(home / ".gemini" / "settings.json")
    trust = _mapping(_mapping(settings.get("security")).get("folderTrust"))
    if trust.get("enabled") is False:
        return True
    rules = _read_json(home / ".gemini" / "trustedFolders.json")
    where = Path(os.path.realpath(root))
    for folder, rule in rules.items():
        path = Path(os.path.realpath(folder))
        if rule == "TRUST_FOLDER" and (where == path or path in where.parents):
            return True
        if rule == "TRUST_PARENT" and (where == path.parent or path.parent in where.parents):
            return True
    return False
