"""install / uninstall on realistic configurations of each CLI: merge, idempotence, reversal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.files import backdate
from memory_mcp.agents.install import (
    hook_path,
    inspect,
    install,
    server_path,
    todo,
    uninstall,
)
from memory_mcp.agents.server_entry import server_env
from memory_mcp.errors import InvalidInput

CLAUDE_JSON = {
    "numStartups": 42,
    "theme": "dark",
    "mcpServers": {"github": {"type": "stdio", "command": "gh-mcp", "args": [], "env": {}}},
    "projects": {"/home/me/app": {"allowedTools": ["Bash(make:*)"], "mcpServers": {}}},
}
CLAUDE_SETTINGS = {
    "permissions": {"allow": ["Bash(npm test:*)"]},
    "hooks": {
        "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "audit.sh"}]}],
        "SessionStart": [{"matcher": "startup", "hooks": [{"type": "command", "command": "motd"}]}],
    },
}
CODEX_TOML = """# My Codex setup
model = "o4-mini"  # fast enough
approval_policy = "on-request"

[features]
web_search = true

[mcp_servers.context7]
command = "npx"
args = ["-y", "@upstash/context7-mcp"]

[mcp_servers.context7.env]
TOKEN = "x"  # keep me
"""
CODEX_HOOKS = {
    "hooks": {
        "Stop": [{"hooks": [{"type": "command", "command": "notify-send done"}]}],
    }
}
GEMINI_SETTINGS = {
    "theme": "GitHub",
    "selectedAuthType": "gemini-api-key",
    "mcpServers": {"fs": {"command": "npx", "args": ["fs-mcp"], "trust": False}},
    "hooks": {"AfterTool": [{"matcher": "*", "hooks": [{"type": "command", "command": "log"}]}]},
}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / ".claude").mkdir(parents=True)
    (home / ".codex").mkdir()
    (home / ".gemini").mkdir()
    (home / ".claude.json").write_text(json.dumps(CLAUDE_JSON, indent=2))
    (home / ".claude" / "settings.json").write_text(json.dumps(CLAUDE_SETTINGS, indent=2))
    (home / ".codex" / "config.toml").write_text(CODEX_TOML)
    (home / ".codex" / "hooks.json").write_text(json.dumps(CODEX_HOOKS))
    (home / ".gemini" / "settings.json").write_text(json.dumps(GEMINI_SETTINGS, indent=4))
    return home


def parsed(path: Path) -> object:
    text = path.read_text()
    return text if ".toml" in path.name else json.loads(text)


@pytest.mark.parametrize("agent", ["claude", "codex", "gemini"])
def test_install_then_uninstall_leaves_everything_else_intact(
    agent: str, home: Path, project: Path
) -> None:
    files = {server_path(agent, "user", project, home), hook_path(agent, "user", project, home)}  # type: ignore[arg-type]
    before = {path: path.read_bytes() for path in files}

    changes = install(agent, "user", project, hook=True, home=home, program="memory-mcp", env={})  # type: ignore[arg-type]
    assert {c.outcome for c in changes} == {"added"}
    for change in changes:
        assert change.backup is not None and change.backup.read_bytes() == before[change.path]

    server_file = server_path(agent, "user", project, home)  # type: ignore[arg-type]
    if agent == "codex":
        text = server_file.read_text()
        assert text.startswith(CODEX_TOML), "comments and layout kept"
        assert '[mcp_servers.memory]\ncommand = "memory-mcp"\nargs = ["serve"]' in text
    else:
        servers = json.loads(server_file.read_text())["mcpServers"]
        assert servers["memory"]["command"] == "memory-mcp"
        assert servers["memory"]["args"] == ["serve"]
        assert len(servers) == 2, "the other server stays"
    hooks = json.loads(hook_path(agent, "user", project, home).read_text())["hooks"]  # type: ignore[arg-type]
    commands = [h["command"] for g in hooks["SessionStart"] for h in g["hooks"]]
    assert f"memory-mcp brief --hook --agent {agent}" in commands

    backdate(*files)
    stamps = {path: path.stat().st_mtime_ns for path in files}
    again = install(agent, "user", project, hook=True, home=home, program="memory-mcp", env={})  # type: ignore[arg-type]
    assert {c.outcome for c in again} == {"unchanged"}
    assert {path: path.stat().st_mtime_ns for path in files} == stamps

    removed = uninstall(agent, "user", project, home=home)  # type: ignore[arg-type]
    assert {c.outcome for c in removed} == {"removed"}
    assert {path: path.read_bytes() for path in files} == before, "byte for byte"
    assert not list(home.rglob("*.memory-mcp.bak")), "the backups have served"
    assert {c.outcome for c in uninstall(agent, "user", project, home=home)} == {"unchanged"}  # type: ignore[arg-type]


@pytest.mark.parametrize("agent", ["claude", "codex", "gemini"])
def test_project_scope_creates_and_removes_the_projects_own_files(
    agent: str, home: Path, project: Path
) -> None:
    changes = install(agent, "project", project, home=home, program="memory-mcp")  # type: ignore[arg-type]
    (change,) = changes
    assert change.outcome == "added" and change.backup is None
    assert project in change.path.parents
    expected = {"claude": ".mcp.json", "codex": "config.toml", "gemini": "settings.json"}[agent]
    assert change.path.name == expected
    removed = uninstall(agent, "project", project, home=home)  # type: ignore[arg-type]
    assert removed[0].outcome == "removed"
    assert not change.path.exists(), "install created it; uninstall leaves no empty file"
    assert not (project / ".codex").exists() and not (project / ".gemini").exists()
    assert not list(project.rglob("*.memory-mcp.bak")), "no backup files left in the repository"


def test_a_different_server_with_the_same_name_is_refused(home: Path, project: Path) -> None:
    data = json.loads((home / ".claude.json").read_text())
    data["mcpServers"]["memory"] = {"command": "other-memory-server", "args": []}
    (home / ".claude.json").write_text(json.dumps(data))
    with pytest.raises(InvalidInput, match="different MCP server named 'memory'"):
        install("claude", "user", project, home=home, program="memory-mcp")
    assert json.loads((home / ".claude.json").read_text()) == data
    install("claude", "user", project, home=home, program="memory-mcp", name="project-memory")
    assert "project-memory" in json.loads((home / ".claude.json").read_text())["mcpServers"]


def test_broken_configuration_is_refused_untouched(home: Path, project: Path) -> None:
    (home / ".gemini" / "settings.json").write_text("{ not json")
    with pytest.raises(InvalidInput, match="not valid JSON"):
        install("gemini", "user", project, home=home, program="memory-mcp")
    assert (home / ".gemini" / "settings.json").read_text() == "{ not json"
    (home / ".codex" / "config.toml").write_text("model = \n")
    with pytest.raises(InvalidInput, match="not valid TOML"):
        install("codex", "user", project, home=home, program="memory-mcp")


def test_an_absolute_program_path_is_recognised_as_ours(home: Path, project: Path) -> None:
    program = "/opt/tools/bin/memory-mcp"
    install("gemini", "user", project, hook=True, home=home, program=program, env={})
    install("gemini", "user", project, hook=True, home=home, program="memory-mcp", env={})
    settings = json.loads((home / ".gemini" / "settings.json").read_text())
    assert settings["mcpServers"]["memory"]["command"] == "memory-mcp"
    commands = [h["command"] for g in settings["hooks"]["SessionStart"] for h in g["hooks"]]
    assert commands == ["memory-mcp brief --hook --agent gemini"], "replaced, not duplicated"
    uninstall("gemini", "user", project, home=home)
    assert json.loads((home / ".gemini" / "settings.json").read_text()) == GEMINI_SETTINGS


def test_codex_dotted_server_keys_are_not_corrupted(home: Path, project: Path) -> None:
    config = home / ".codex" / "config.toml"
    dotted = 'mcp_servers.other.command = "x"\nmodel = "o3"\n'
    config.write_text(dotted)
    changes = install("codex", "user", project, home=home, program="memory-mcp", env={})
    import tomllib

    parsed = tomllib.loads(config.read_text())
    if changes[0].outcome == "added":
        assert parsed["model"] == "o3", "no key moved into the new table"
        assert parsed["mcp_servers"]["memory"] == {"command": "memory-mcp", "args": ["serve"]}
        uninstall("codex", "user", project, home=home)
        assert tomllib.loads(config.read_text()) == tomllib.loads(dotted)


@pytest.mark.parametrize(
    "text", ['mcp_servers = { other = { command = "x" } }\n', 'mcp_servers = ["x"]\n']
)
def test_codex_servers_of_another_shape_are_refused_untouched(
    home: Path, project: Path, text: str
) -> None:
    config = home / ".codex" / "config.toml"
    config.write_text(text)
    with pytest.raises(InvalidInput):
        install("codex", "user", project, home=home, program="memory-mcp")
    assert config.read_text() == text


def test_the_first_backup_keeps_the_original(home: Path, project: Path) -> None:
    settings = home / ".gemini" / "settings.json"
    backup = home / ".gemini" / "settings.json.memory-mcp.bak"
    original = settings.read_bytes()
    install("gemini", "user", project, home=home, program="memory-mcp", env={})
    install("gemini", "user", project, hook=True, home=home, program="memory-mcp", env={})
    assert backup.read_bytes() == original
    uninstall("gemini", "user", project, home=home)
    assert settings.read_bytes() == original and not backup.exists()


def test_a_file_changed_since_install_keeps_the_change_and_loses_only_our_entries(
    home: Path, project: Path
) -> None:
    settings = home / ".gemini" / "settings.json"
    install("gemini", "user", project, hook=True, home=home, program="memory-mcp", env={})
    data = json.loads(settings.read_text())
    data["theme"] = "Dracula"  # the user, or Gemini CLI, changed something meanwhile
    settings.write_text(json.dumps(data))
    server, hook = uninstall("gemini", "user", project, home=home)
    assert server.outcome == "removed" and server.backup is not None  # the hook is still there
    assert hook.outcome == "removed" and hook.backup is None  # nothing of ours left
    assert json.loads(settings.read_text()) == {**GEMINI_SETTINGS, "theme": "Dracula"}
    assert not list(home.rglob("*.memory-mcp.bak"))


@pytest.mark.parametrize("agent", ["claude", "codex", "gemini"])
def test_a_file_install_created_is_gone_after_uninstall_with_no_backup(
    agent: str, tmp_path: Path, project: Path
) -> None:
    """Gemini's settings.json holds the server and the hook: two edits of a file install made."""
    home = tmp_path / "empty-home"
    home.mkdir()
    install(agent, "user", project, hook=True, home=home, program="memory-mcp", env={})  # type: ignore[arg-type]
    assert not list(home.rglob("*.memory-mcp.bak")), "a file of ours alone is not a user's file"
    uninstall(agent, "user", project, home=home)  # type: ignore[arg-type]
    assert [p for p in home.rglob("*") if p.is_file()] == []


def test_a_symlinked_dotfile_is_edited_in_place(home: Path, project: Path, tmp_path: Path) -> None:
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir()
    target = dotfiles / "claude.json"
    (home / ".claude.json").rename(target)
    (home / ".claude.json").symlink_to(target)
    install("claude", "user", project, home=home, program="memory-mcp")
    assert (home / ".claude.json").is_symlink()
    assert "memory" in json.loads(target.read_text())["mcpServers"]


def test_a_program_path_with_spaces_is_quoted_and_recognised(home: Path, project: Path) -> None:
    program = "/Users/Jane Doe/.local/bin/memory-mcp"
    install("claude", "user", project, hook=True, home=home, program=program, env={})
    install("claude", "user", project, hook=True, home=home, program=program, env={})
    settings = json.loads((home / ".claude" / "settings.json").read_text())
    ours = [
        h["command"]
        for g in settings["hooks"]["SessionStart"]
        for h in g["hooks"]
        if "memory-mcp" in h["command"]
    ]
    assert ours == ["'/Users/Jane Doe/.local/bin/memory-mcp' brief --hook --agent claude"]
    uninstall("claude", "user", project, home=home)
    assert json.loads((home / ".claude" / "settings.json").read_text()) == CLAUDE_SETTINGS


def test_reinstall_keeps_the_users_additions(home: Path, project: Path) -> None:
    env = {"MEMORY_MCP_DATA_DIR": "/data"}
    install("gemini", "user", project, hook=True, home=home, program="memory-mcp", env=env)
    path = home / ".gemini" / "settings.json"
    settings = json.loads(path.read_text())
    settings["mcpServers"]["memory"]["env"]["HTTPS_PROXY"] = "http://proxy:3128"
    settings["mcpServers"]["memory"]["timeout"] = 30000
    for group in settings["hooks"]["SessionStart"]:
        for handler in group["hooks"]:
            if handler["command"] == "memory-mcp brief --hook --agent gemini":
                handler["command"] += " --budget 600"
    path.write_text(json.dumps(settings))
    changes = install(
        "gemini", "user", project, hook=True, home=home, program="memory-mcp", env=env
    )
    assert {c.outcome for c in changes} == {"unchanged"}
    again = json.loads(path.read_text())
    assert again["mcpServers"]["memory"]["env"] == {
        "MEMORY_MCP_DATA_DIR": "/data",
        "HTTPS_PROXY": "http://proxy:3128",
    }
    moved = {"MEMORY_MCP_DATA_DIR": "/elsewhere"}
    changes = install("gemini", "user", project, home=home, program="memory-mcp", env=moved)
    assert changes[0].outcome == "updated"
    entry = json.loads(path.read_text())["mcpServers"]["memory"]
    assert entry["env"]["MEMORY_MCP_DATA_DIR"] == "/elsewhere" and entry["timeout"] == 30000


def test_a_server_entry_without_args_is_someone_elses(home: Path, project: Path) -> None:
    data = json.loads((home / ".claude.json").read_text())
    data["mcpServers"]["memory"] = {"command": "memory-mcp", "args": None}
    (home / ".claude.json").write_text(json.dumps(data))
    with pytest.raises(InvalidInput, match="different MCP server named 'memory'"):
        install("claude", "user", project, home=home, program="memory-mcp")


# What the servers are given, and what the user is told -----------------------------------


def test_each_clis_server_entry_carries_the_settings_and_names_the_secrets(
    tmp_path: Path, project: Path
) -> None:
    """Codex gives its servers a minimal environment: the entry itself must carry them."""
    home = tmp_path / "h"
    home.mkdir()
    env = {
        "HOME": str(home),
        "PATH": "/usr/bin",
        "MEMORY_MCP_DATA_DIR": "/team/store",
        "MEMORY_MCP_EMBEDDER_MODEL_PATH": "/models/minilm",
        "MEMORY_MCP_EMBEDDER_OPENAI_API_KEY": "sk-secret-value",
    }
    for agent in ("claude", "codex", "gemini"):
        install(agent, "user", project, home=home, program="memory-mcp", env=env)  # type: ignore[arg-type]
    for path in (home / ".claude.json", home / ".gemini" / "settings.json"):
        entry = json.loads(path.read_text())["mcpServers"]["memory"]
        assert entry["env"] == {
            "MEMORY_MCP_DATA_DIR": "/team/store",
            "MEMORY_MCP_EMBEDDER_MODEL_PATH": "/models/minilm",
            "MEMORY_MCP_EMBEDDER_OPENAI_API_KEY": "${MEMORY_MCP_EMBEDDER_OPENAI_API_KEY}",
        }
    import tomllib

    codex = tomllib.loads((home / ".codex" / "config.toml").read_text())["mcp_servers"]["memory"]
    assert codex["env"] == {
        "MEMORY_MCP_DATA_DIR": "/team/store",
        "MEMORY_MCP_EMBEDDER_MODEL_PATH": "/models/minilm",
    }
    assert codex["env_vars"] == ["MEMORY_MCP_EMBEDDER_OPENAI_API_KEY"]
    written = "".join(p.read_text() for p in home.rglob("*") if p.is_file())
    assert "sk-secret-value" not in written and "MEMORY_MCP_EMBEDDER_OPENAI_API_KEY" in written
    for agent in ("claude", "codex", "gemini"):
        uninstall(agent, "user", project, home=home)  # type: ignore[arg-type]
    assert [p for p in home.rglob("*") if p.is_file()] == []


def test_a_store_found_through_xdg_variables_is_written_out(tmp_path: Path) -> None:
    home = tmp_path / "h"
    env = {"HOME": str(home), "XDG_DATA_HOME": str(tmp_path / "xdg-data")}
    assert server_env(env).values == {
        "MEMORY_MCP_DATA_DIR": str(tmp_path / "xdg-data" / "memory-mcp")
    }
    config = tmp_path / "xdg-config" / "memory-mcp" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('data_dir = "/srv/memory"\n')
    env = {"HOME": str(home), "XDG_CONFIG_HOME": str(tmp_path / "xdg-config")}
    assert server_env(env).values == {"MEMORY_MCP_CONFIG": str(config)}
    assert server_env({"HOME": str(home)}).values == {}  # the defaults: nothing to carry


def test_install_says_what_the_user_must_still_do(tmp_path: Path, project: Path) -> None:
    home = tmp_path / "h"
    home.mkdir()
    [codex] = todo("codex", "user", project, hook=True, home=home)
    assert "/hooks" in codex and "Trust" in codex
    assert todo("codex", "user", project, hook=False, home=home) == []
    [gemini] = todo("gemini", "user", project, hook=False, home=home)
    assert "trust" in gemini and str(project) in gemini
    (home / ".gemini").mkdir()
    rules = {str(project): "TRUST_FOLDER"}
    (home / ".gemini" / "trustedFolders.json").write_text(json.dumps(rules))
    assert todo("gemini", "user", project, hook=True, home=home) == []
    [claude] = todo("claude", "project", project, hook=False, home=home)
    assert ".mcp.json" in claude and "approve" in claude
    assert todo("claude", "user", project, hook=True, home=home) == []


def test_inspect_finds_what_is_installed_where(tmp_path: Path, project: Path) -> None:
    home = tmp_path / "h"
    home.mkdir()
    install("claude", "user", project, hook=True, home=home, program="memory-mcp", env={})
    install("codex", "project", project, home=home, program="memory-mcp", env={})
    found = {setup.agent: setup for setup in inspect(project, home=home)}
    assert (found["claude"].servers, found["claude"].hooks) == (["user"], ["user"])
    assert (found["codex"].servers, found["codex"].hooks) == (["project"], [])
    assert any("trusted project" in step for step in found["codex"].todo)
    assert (found["gemini"].servers, found["gemini"].hooks) == ([], [])


@pytest.mark.parametrize("where", ["after", "end"])
def test_codex_tool_approvals_under_our_server_go_with_it(
    home: Path, project: Path, where: str
) -> None:
    """'Allow and don't ask me again' makes Codex write [mcp_servers.memory.tools.<tool>]."""
    config = home / ".codex" / "config.toml"
    original = config.read_bytes()
    env = {"MEMORY_MCP_DATA_DIR": "/store"}
    install("codex", "user", project, home=home, program="memory-mcp", env=env)
    approval = '\n[mcp_servers.memory.tools.memory_search]\napproval_mode = "approve"\n'
    text = config.read_text()
    if where == "after":
        line = 'env = { MEMORY_MCP_DATA_DIR = "/store" }\n'
        block_end = text.index(line) + len(line)
        text = text[:block_end] + approval + text[block_end:]
    else:
        text += approval + '\n[projects."/elsewhere"]\ntrust_level = "trusted"\n'
    config.write_text(text)
    import tomllib

    moved = {"MEMORY_MCP_DATA_DIR": "/moved"}
    [changed] = install("codex", "user", project, home=home, program="memory-mcp", env=moved)
    assert changed.outcome == "updated"
    server = tomllib.loads(config.read_text())["mcp_servers"]["memory"]
    assert server["env"] == moved and server["tools"]["memory_search"]["approval_mode"] == "approve"
    [removed, _hook] = uninstall("codex", "user", project, home=home)
    assert removed.outcome == "removed"
    if where == "after":
        assert config.read_bytes() == original
    else:
        assert tomllib.loads(config.read_text()) == {
            **tomllib.loads(original.decode()),
            "projects": {"/elsewhere": {"trust_level": "trusted"}},
        }


def test_a_json_file_keeps_its_style_when_the_cli_rewrote_it_meanwhile(
    tmp_path: Path, project: Path
) -> None:
    """Claude Code writes ~/.claude.json itself: two spaces, no final newline."""
    home = tmp_path / "h"
    home.mkdir()
    claude = home / ".claude.json"
    claude.write_text(json.dumps({"numStartups": 1, "theme": "dark"}, indent=2))
    install("claude", "user", project, home=home, program="memory-mcp", env={})
    data = json.loads(claude.read_text())
    data["numStartups"] = 2  # Claude Code ran in between
    claude.write_text(json.dumps(data, indent=2))
    uninstall("claude", "user", project, home=home)
    assert claude.read_text() == json.dumps({"numStartups": 2, "theme": "dark"}, indent=2)
    assert not list(home.rglob("*.memory-mcp.bak"))


def test_a_setting_dropped_from_the_shell_leaves_every_entry_on_reinstall(
    tmp_path: Path, project: Path
) -> None:
    """Otherwise Claude and Gemini would keep the old store while Codex moved on."""
    import tomllib

    home = tmp_path / "h"
    home.mkdir()
    old = {"HOME": str(home), "MEMORY_MCP_DATA_DIR": "/old/store"}
    for agent in ("claude", "codex", "gemini"):
        install(agent, "user", project, home=home, program="memory-mcp", env=old)  # type: ignore[arg-type]
    claude = home / ".claude.json"
    data = json.loads(claude.read_text())
    data["mcpServers"]["memory"]["env"]["HTTPS_PROXY"] = "http://proxy:3128"  # the user's
    claude.write_text(json.dumps(data, indent=2))
    codex = home / ".codex" / "config.toml"
    codex.write_text(
        codex.read_text().replace("env = { ", 'env = { RUST_LOG = "debug", ')
        + "startup_timeout_sec = 30\n"
    )
    for agent in ("claude", "codex", "gemini"):
        install(agent, "user", project, home=home, program="memory-mcp", env={"HOME": str(home)})  # type: ignore[arg-type]
    assert json.loads(claude.read_text())["mcpServers"]["memory"]["env"] == {
        "HTTPS_PROXY": "http://proxy:3128"
    }
    gemini = json.loads((home / ".gemini" / "settings.json").read_text())
    assert gemini["mcpServers"]["memory"]["env"] == {}
    server = tomllib.loads(codex.read_text())["mcp_servers"]["memory"]
    assert server["env"] == {"RUST_LOG": "debug"} and server["startup_timeout_sec"] == 30
    for agent in ("claude", "codex", "gemini"):
        uninstall(agent, "user", project, home=home)  # type: ignore[arg-type]
    assert not codex.exists(), "install made it; the user's lines were inside our table"


def test_a_codex_table_the_user_added_to_is_updated_and_removed_whole(
    home: Path, project: Path
) -> None:
    config = home / ".codex" / "config.toml"
    original = config.read_bytes()
    install("codex", "user", project, home=home, program="memory-mcp", env={})
    config.write_text(config.read_text() + "startup_timeout_sec = 30\n")
    env = {"MEMORY_MCP_DATA_DIR": "/store"}
    [changed] = install("codex", "user", project, home=home, program="memory-mcp", env=env)
    assert changed.outcome == "updated"
    assert "startup_timeout_sec = 30\n" in config.read_text()
    uninstall("codex", "user", project, home=home)
    assert config.read_bytes() == original and not list(home.rglob("*.memory-mcp.bak"))


def test_relative_paths_are_written_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Servers start in each project's folder: a relative path would mean a store per project."""
    monkeypatch.chdir(tmp_path)
    values = server_env(
        {
            "HOME": str(tmp_path),
            "MEMORY_MCP_DATA_DIR": "store",
            "MEMORY_MCP_EMBEDDER_MODEL_PATH": "./models/minilm",
        }
    ).values
    assert values == {
        "MEMORY_MCP_DATA_DIR": str(tmp_path / "store"),
        "MEMORY_MCP_EMBEDDER_MODEL_PATH": str(tmp_path / "models" / "minilm"),
    }


def test_an_empty_file_the_user_had_stays_after_uninstall(tmp_path: Path, project: Path) -> None:
    home = tmp_path / "h"
    (home / ".claude").mkdir(parents=True)
    (home / ".claude" / "settings.json").write_text("{}")
    install("claude", "user", project, hook=True, home=home, program="memory-mcp", env={})
    uninstall("claude", "user", project, home=home)
    assert (home / ".claude" / "settings.json").read_text() == "{}"


def test_an_inline_codex_server_table_and_a_bad_name_are_refused_plainly(
    home: Path, project: Path
) -> None:
    config = home / ".codex" / "config.toml"
    inline = 'mcp_servers = { other = { command = "x", args = [] } }\n'
    config.write_text(inline)
    with pytest.raises(InvalidInput, match="add it by hand") as refused:
        install("codex", "user", project, home=home, program="memory-mcp", env={})
    assert "not valid TOML" not in str(refused.value) and config.read_text() == inline
    with pytest.raises(InvalidInput, match="letters, digits"):
        install("claude", "user", project, home=home, program="memory-mcp", name="my mem")


def test_a_shared_project_file_carries_no_personal_settings(tmp_path: Path, project: Path) -> None:
    home = tmp_path / "h"
    home.mkdir()
    env = {"HOME": str(home), "MEMORY_MCP_DATA_DIR": "/home/alice/store"}
    install("claude", "project", project, home=home, program="memory-mcp", env=env)
    assert json.loads((project / ".mcp.json").read_text())["mcpServers"]["memory"]["env"] == {}
    steps = todo("codex", "project", project, hook=False, home=home, env=env)
    assert any("MEMORY_MCP_DATA_DIR" in step and "config.toml" in step for step in steps)
