"""Whether each CLI will use what install set up: the approvals and trust it keeps."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from memory_mcp.agents.codex_toml import read_toml
from memory_mcp.agents.config_files import mapping, read_json


def claude_approved(root: Path, home: Path, name: str) -> bool:
    projects = mapping(read_json(home / ".claude.json").get("projects"))
    project = mapping(projects.get(str(root)))
    local = read_json(root / ".claude" / "settings.local.json")
    approved = [
        *_strings(project.get("enabledMcpjsonServers")),
        *_strings(local.get("enabledMcpjsonServers")),
    ]
    return name in approved or local.get("enableAllProjectMcpServers") is True


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _codex_config(home: Path) -> dict[str, Any]:
    return read_toml(home / ".codex" / "config.toml")


def codex_trusts(root: Path, home: Path) -> bool:
    project = mapping(mapping(_codex_config(home).get("projects")).get(str(root)))
    return project.get("trust_level") == "trusted"


def codex_hook_trusted(hooks: Path, home: Path) -> bool:
    """Whether Codex holds a trust decision for a SessionStart hook of ``hooks``.

    Codex keys it ``<hooks.json>:session_start:<group>:<hook>`` with the hash of
    the hook it trusted; a changed hook needs another review, which only Codex
    can tell.
    """
    state = mapping(mapping(_codex_config(home).get("hooks")).get("state"))
    prefix = f"{os.path.realpath(hooks)}:session_start:"
    return any(
        str(key).startswith(prefix) and isinstance(v, dict) and v.get("trusted_hash")
        for key, v in state.items()
    )


def gemini_trusts(root: Path, home: Path) -> bool:
    settings = read_json(home / ".gemini" / "settings.json")
    trust = mapping(mapping(settings.get("security")).get("folderTrust"))
    if trust.get("enabled") is False:
        return True
    rules = read_json(home / ".gemini" / "trustedFolders.json")
    where = Path(os.path.realpath(root))
    for folder, rule in rules.items():
        path = Path(os.path.realpath(folder))
        if rule == "TRUST_FOLDER" and (where == path or path in where.parents):
            return True
        if rule == "TRUST_PARENT" and (where == path.parent or path.parent in where.parents):
            return True
    return False
