"""Codex's ``config.toml``: adding and removing ``[mcp_servers.<name>]`` as text,
so the rest of the file keeps its comments and layout."""

from __future__ import annotations

import copy
import json
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memory_mcp.agents.config_files import ConfigChange, Format, edit, mapping, with_what
from memory_mcp.agents.server_entry import ServerEnv, check_name, ours, users
from memory_mcp.errors import InvalidInput


def _load_text(path: Path) -> dict[str, str]:
    return {"text": path.read_text(encoding="utf-8") if path.exists() else ""}


def _dump_text(holder: dict[str, str], old: str) -> str:
    return holder["text"]


_TOML = Format(_load_text, _dump_text, lambda holder, path: _parse_toml(holder["text"], path))


def _parse_toml(text: str, path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInput(
            f"{path} is not valid TOML ({exc}); fix it, then install again"
        ) from None


def read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return {}


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


def add_toml_server(name: str, program: str, senv: ServerEnv, path: Path) -> ConfigChange:
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
        check_name(existing, name, path)
        old = mapping(existing)
        env = {**users(mapping(old.get("env"))), **senv.values}
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
    return with_what(edit(path, _TOML, change, strip), f"[mcp_servers.{name}]")


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
        if ours(_toml_servers(_parse_toml(holder["text"], path), path).get(name)):
            holder["text"] = _without_toml_server(holder["text"], name, path)

    return strip


def remove_toml_server(name: str, path: Path) -> ConfigChange:
    def change(holder: dict[str, str]) -> str:
        data = _parse_toml(holder["text"], path)
        if not ours(_toml_servers(data, path).get(name)):
            return "unchanged"
        holder["text"] = _without_toml_server(holder["text"], name, path)
        return "removed"

    strip = _strip_toml(name, path)
    return with_what(edit(path, _TOML, change, strip), f"[mcp_servers.{name}]")
