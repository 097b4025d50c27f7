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

Edits merge into what is there: other servers, hooks and settings are kept.
Installing twice changes nothing; a different server already registered under
the same name is refused rather than replaced. ``uninstall`` removes exactly
what ``install`` added.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from memory_mcp.agents.codex_toml import add_toml_server, read_toml, remove_toml_server
from memory_mcp.agents.config_files import ConfigChange, read_json
from memory_mcp.agents.hooks import add_hook, remove_hook, without_our_hooks
from memory_mcp.agents.inject import AGENTS, Agent
from memory_mcp.agents.server_entry import (
    ServerEnv,
    add_json_server,
    ours,
    remove_json_server,
    server_env,
    strip_json,
)
from memory_mcp.agents.trust import (
    claude_approved,
    codex_hook_trusted,
    codex_trusts,
    gemini_trusts,
)
from memory_mcp.errors import InvalidInput

InstallScope = Literal["user", "project"]
SCOPES: tuple[InstallScope, ...] = ("user", "project")
SERVER_NAME = "memory"
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


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
        changes = [add_toml_server(name, program, senv, target)]
    else:
        changes = [add_json_server(agent, name, program, senv, target)]
    if hook:
        hooks = hook_path(agent, scope, root, home)
        changes.append(add_hook(agent, program, hooks, strip_json(name)))
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
        changes = [remove_toml_server(name, target)]
    else:
        changes = [remove_json_server(name, target)]
    changes.append(remove_hook(hook_path(agent, scope, root, home), strip_json(name)))
    return changes


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
    if agent == "claude" and scope == "project" and not claude_approved(root, home, name):
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
        if scope == "project" and not codex_trusts(root, home):
            steps.append(
                "Codex reads .codex/config.toml only in a trusted project: start `codex` "
                f"in {root} and trust it."
            )
        if hook and not codex_hook_trusted(hook_path(agent, scope, root, home), home):
            steps.append(
                "Codex runs a new hook only after you trust it: start `codex`, open /hooks "
                "(it says a hook needs review) and choose Trust. Until then `codex exec` "
                "skips it without a word, and sessions start without the brief."
            )
    if agent == "gemini" and not gemini_trusts(root, home):
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


def _has_server(agent: Agent, path: Path, name: str) -> bool:
    if agent == "codex":
        servers = read_toml(path).get("mcp_servers")
    else:
        servers = read_json(path).get("mcpServers")
    return isinstance(servers, dict) and ours(servers.get(name))


def _has_hook(path: Path) -> bool:
    return without_our_hooks(copy.deepcopy(read_json(path))) == "removed"
