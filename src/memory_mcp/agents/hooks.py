"""memory-mcp's SessionStart hook in a CLI's JSON hooks file: its command, adding and removing it.

Every hook runs ``memory-mcp brief --hook --agent <cli>``, whose stdout is the
``{"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": ...}}``
all three CLIs accept.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memory_mcp.agents.config_files import JSON, ConfigChange, edit, with_what
from memory_mcp.agents.inject import Agent
from memory_mcp.errors import InvalidInput

HOOK_ARGS = ("brief", "--hook")
_MATCHERS: dict[Agent, str | None] = {
    "claude": "startup|resume|clear|compact",
    "codex": "startup|resume|clear",
    "gemini": None,  # lifecycle matchers are exact strings; no matcher: every start
}


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


def add_hook(
    agent: Agent, program: str, path: Path, remove_ours: Callable[[Any], object]
) -> ConfigChange:
    """Add our SessionStart hook to ``path``, or bring the one there up to date.

    ``remove_ours`` takes every entry of ours out of the parsed file (see ``edit``):
    Gemini CLI's settings.json holds our server entry too.
    """

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

    return with_what(edit(path, JSON, change, remove_ours), "SessionStart hook")


def without_our_hooks(data: dict[str, Any]) -> str:
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


def remove_hook(path: Path, remove_ours: Callable[[Any], object]) -> ConfigChange:
    """Take our SessionStart hooks out of ``path`` (``remove_ours`` as for ``add_hook``)."""
    return with_what(edit(path, JSON, without_our_hooks, remove_ours), "SessionStart hook")
