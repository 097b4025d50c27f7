"""memory-mcp with the real Claude Code, Codex CLI and Gemini CLI, end to end.

One user's machine (a temporary HOME with the three CLIs, pinned, from
``install_clis``) and one scenario across the CLIs, each talking to a fake
model server of its own API (``fake_models``) that plays a script and keeps
every request:

1. the user already uses the three CLIs in a git project (each has run once);
2. ``memory-mcp install <cli> --hook`` for each, then the trust steps a user
   takes (Codex: trust the new hook in /hooks), then ``<cli> mcp list``;
3. Claude Code stores a decision with ``memory_store``; Codex finds it with
   ``memory_search`` and Gemini CLI with ``searchUnifiedMemory``, and each
   writes a journal entry; the SessionStart hook's brief is in each CLI's
   first model request, once (and still once with ``memory-mcp inject``);
4. ``memory-mcp uninstall <cli>`` leaves every configuration file as it was.

Each step runs once (module fixtures, in order) and the tests assert on what
it recorded, so one failing step does not hide the others. Run alone with
``uv run pytest -m e2e -s`` (``-s`` prints each session's wall time).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import install_clis
import pytest
from agent_harness import (
    AGENTS,
    BRIEF_HEADING,
    Home,
    Ran,
    Session,
    Snapshot,
    backup_of,
    config_files,
    differences,
    result_json,
    snapshot,
)
from fake_models import Answer, ToolCall

from helpers.model import model_path

pytestmark = pytest.mark.e2e

SEEDED = "We deploy with GitHub Actions to Fly.io"
DECISION = "We chose SQLite over Postgres for the local store"
CODEX_NOTE = "Codex read the local store decision before changing the schema"
GEMINI_NOTE = "Gemini read the local store decision before writing the migration"
QUESTION = "Which database did we choose for the local store, SQLite or Postgres?"

CLAUDE_STORE = ToolCall("mcp__memory__memory_store", {"content": DECISION, "kind": "decision"})
CODEX_SEARCH = ToolCall("memory_search", {"query": QUESTION}, namespace="mcp__memory")
CODEX_STORE = ToolCall(
    "memory_store", {"content": CODEX_NOTE, "kind": "journal"}, namespace="mcp__memory"
)
GEMINI_SEARCH = ToolCall("mcp_memory_searchUnifiedMemory", {"query": QUESTION})
GEMINI_STORE = ToolCall("mcp_memory_memory_store", {"content": GEMINI_NOTE, "kind": "journal"})

# How each CLI's own listing shows a connected server (Codex's `mcp list` reads
# its configuration and does not connect: "enabled" is all it can say).
LISTED = {
    "claude": r"^memory: \S*memory-mcp serve - ✔ Connected$",
    "codex": r"^memory\s+\S*memory-mcp\s+serve\s.*\benabled\b",
    "gemini": r"^✓ memory: \S*memory-mcp serve \(stdio\) - Connected$",
}


# The scenario, step by step -------------------------------------------------------------


@pytest.fixture(scope="session")
def cli_bin() -> Path:
    """The pinned CLIs; their install failing fails the tests, with npm's reason."""
    try:
        return install_clis.ensure()
    except install_clis.CliInstallError as exc:
        pytest.fail(f"cannot install the agent CLIs for tests/e2e: {exc}", pytrace=False)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, cli_bin: Path) -> Iterator[Home]:
    """A user's machine with the three CLIs configured for a git project."""
    machine = Home(tmp_path_factory.mktemp("e2e"), cli_bin, model_path())
    machine.start_models()
    try:
        machine.set_up_as_a_user()
        yield machine
    finally:
        machine.stop_models()


@pytest.fixture(scope="module")
def first_use(home: Home) -> dict[str, Session]:
    """A session of each CLI before memory-mcp: the user already uses them here."""
    sessions = {}
    for agent in AGENTS:
        sessions[agent] = home.session(agent, "Hello.", [], memory_tools=False)
        assert sessions[agent].ran.returncode == 0, sessions[agent].ran.describe()
    return sessions


@dataclass
class Installed:
    before: Snapshot  # every file install may write, and its backup, before install
    runs: dict[str, Ran]  # memory-mcp install <cli> --hook
    after: Snapshot  # the same files after install and the user's trust steps
    codex_hooks: list[dict[str, Any]]  # Codex's hooks as it listed them before the review
    codex_trust: bytes | None  # what trusting the hook appended to ~/.codex/config.toml
    listings: dict[str, Ran]  # <cli> mcp list


def watched_files(home: Home) -> list[Path]:
    files = [path for paths in config_files(home.home).values() for path in paths]
    return files + [backup_of(path) for path in files]


@pytest.fixture(scope="module")
def installed(home: Home, first_use: dict[str, Session]) -> Installed:
    """A memory in the store, then memory-mcp installed in each CLI and the hook trusted."""
    seeded = home.memory_mcp("store", "--kind", "decision", SEEDED)
    assert seeded.returncode == 0, seeded.describe()
    files = watched_files(home)
    before = snapshot(files)
    runs = {agent: home.memory_mcp("install", agent, "--hook") for agent in AGENTS}
    codex_config = home.home / ".codex" / "config.toml"
    installed_config = codex_config.read_bytes()
    codex_hooks = home.trust_codex_hooks("memory-mcp")
    trusted_config = codex_config.read_bytes()
    codex_trust = (
        trusted_config[len(installed_config) :]
        if trusted_config.startswith(installed_config)
        else None
    )
    listings = {agent: home.run(agent, "mcp", "list") for agent in AGENTS}
    return Installed(before, runs, snapshot(files), codex_hooks, codex_trust, listings)


@pytest.fixture(scope="module")
def claude(home: Home, installed: Installed) -> Session:
    return home.session(
        "claude", f"Remember this decision: {DECISION}.", [CLAUDE_STORE, Answer("Stored.")]
    )


@pytest.fixture(scope="module")
def codex(home: Home, claude: Session) -> Session:
    return home.session("codex", QUESTION, [CODEX_SEARCH, CODEX_STORE, Answer("SQLite.")])


@pytest.fixture(scope="module")
def gemini(home: Home, codex: Session) -> Session:
    return home.session("gemini", QUESTION, [GEMINI_SEARCH, GEMINI_STORE, Answer("SQLite.")])


@pytest.fixture(scope="module")
def injected(home: Home, gemini: Session) -> dict[str, Session]:
    """A session of each CLI after `memory-mcp inject` also put the brief in its file."""
    done = home.memory_mcp("inject")
    assert done.returncode == 0, done.describe()
    sessions = {agent: home.session(agent, "What should I know here?", []) for agent in AGENTS}
    undone = home.memory_mcp("uninject")
    assert undone.returncode == 0, undone.describe()
    return sessions


@dataclass
class Uninstalled:
    runs: dict[str, Ran]  # memory-mcp uninstall <cli>
    before: Snapshot  # the files right before uninstall, after every session
    after: Snapshot  # the files after uninstall


@pytest.fixture(scope="module")
def uninstalled(home: Home, installed: Installed, injected: dict[str, Session]) -> Uninstalled:
    files = watched_files(home)
    before = snapshot(files)
    runs = {agent: home.memory_mcp("uninstall", agent) for agent in AGENTS}
    return Uninstalled(runs, before, snapshot(files))


def session_of(request: pytest.FixtureRequest, agent: str) -> Session:
    session = request.getfixturevalue(agent)
    assert isinstance(session, Session)
    return session


# Install: each CLI sees the server ---------------------------------------------------------


@pytest.mark.parametrize("agent", AGENTS)
def test_each_cli_lists_the_installed_server_as_connected(agent: str, installed: Installed) -> None:
    install = installed.runs[agent]
    assert install.returncode == 0, install.describe()
    listing = installed.listings[agent]
    assert listing.returncode == 0, listing.describe()
    assert re.search(LISTED[agent], listing.output, re.MULTILINE), listing.describe()


def test_install_codex_hook_tells_the_user_when_codex_will_skip_the_hook(
    installed: Installed,
) -> None:
    """Codex runs a new hook only once its user trusts it (/hooks): install must say so."""
    hooks = [hook for hook in installed.codex_hooks if "memory-mcp" in hook.get("command", "")]
    assert len(hooks) == 1, installed.codex_hooks
    install = installed.runs["codex"]
    if hooks[0]["trustStatus"] != "trusted":
        assert re.search(r"\b(trust|review)", install.output, re.IGNORECASE), (
            f"Codex lists the new hook as {hooks[0]['trustStatus']!r} and `codex exec` skips "
            "it without a word, but install does not tell the user to trust it (/hooks):\n"
            + install.describe()
        )


# Sessions: the brief, and one memory across three agents ----------------------------------


@pytest.mark.parametrize("agent", AGENTS)
def test_the_hook_puts_the_brief_in_the_first_model_request_once(
    agent: str, request: pytest.FixtureRequest, first_use: dict[str, Session]
) -> None:
    assert first_use[agent].first_request.mentions(BRIEF_HEADING) == 0  # none before install
    session = session_of(request, agent)
    assert session.ran.returncode == 0, session.ran.describe()
    first = session.first_request
    assert first.mentions(BRIEF_HEADING) == 1, (
        f"{agent}'s first model request holds the brief {first.mentions(BRIEF_HEADING)} "
        f"times:\n{first.raw[:3000]}"
    )
    assert first.mentions(SEEDED) == 1, first.raw[:3000]


@pytest.mark.parametrize("agent", AGENTS)
def test_the_brief_arrives_once_when_the_project_also_has_it_injected(
    agent: str, injected: dict[str, Session]
) -> None:
    session = injected[agent]
    assert session.ran.returncode == 0, session.ran.describe()
    first = session.first_request
    count = first.mentions(BRIEF_HEADING)
    assert count == 1, (
        f"with `memory-mcp inject` and the hook, {agent}'s first model request holds the "
        f"brief {count} times"
    )


def test_claude_stores_a_decision_with_memory_store(claude: Session) -> None:
    assert claude.ran.returncode == 0, claude.ran.describe()
    assert CLAUDE_STORE.name in claude.model.tool_names(claude.first_request)
    stored = result_json(claude.result_of(CLAUDE_STORE))
    assert stored["action"] == "inserted", stored
    assert stored["id"], stored


def stores(home: Home) -> list[str]:
    """Memory stores under HOME: a server that missed MEMORY_MCP_DATA_DIR made one there."""
    return sorted(str(path) for path in home.home.rglob("memory.db"))


def test_codex_finds_claudes_decision_with_memory_search(home: Home, codex: Session) -> None:
    assert codex.ran.returncode == 0, codex.ran.describe()
    offered = codex.model.tool_names(codex.first_request)
    assert CODEX_SEARCH.qualified in offered, f"{offered}\n{codex.ran.describe()}"
    found = result_json(codex.result_of(CODEX_SEARCH))
    contents = [hit["content"] for hit in found["results"]]
    assert DECISION in contents, f"{found}\nstores under HOME: {stores(home)}"


def test_codex_first_search_ranks_with_the_model(codex: Session) -> None:
    """The first search of a session is hybrid: it waits for the model, not the BM25 floor."""
    found = result_json(codex.result_of(CODEX_SEARCH))
    assert found["mode"] == "hybrid", found


def test_gemini_finds_claudes_decision_with_search_unified_memory(gemini: Session) -> None:
    assert gemini.ran.returncode == 0, gemini.ran.describe()
    assert GEMINI_SEARCH.name in gemini.model.tool_names(gemini.first_request)
    found = result_json(gemini.result_of(GEMINI_SEARCH))
    contents = [hit["content"] for hit in found["results"]]
    assert DECISION in contents, found


def test_the_store_records_which_agent_wrote_each_memory(
    home: Home, claude: Session, codex: Session, gemini: Session
) -> None:
    exported = home.memory_mcp("export")
    assert exported.returncode == 0, exported.describe()
    records = [json.loads(line) for line in exported.stdout.splitlines() if line.strip()]
    writers = {r["content"]: r["agent"] for r in records if r.get("type") == "record"}
    expected = {SEEDED: "cli", DECISION: "claude", CODEX_NOTE: "codex", GEMINI_NOTE: "gemini"}
    assert {content: writers.get(content) for content in expected} == expected, (
        f"{writers}\nstores under HOME: {stores(home)}"
    )


# Uninstall: every configuration as it was --------------------------------------------------


@pytest.mark.parametrize("agent", AGENTS)
def test_uninstall_leaves_each_config_file_as_it_was(
    agent: str, home: Home, installed: Installed, uninstalled: Uninstalled
) -> None:
    """Byte for byte where a file existed, absent where it did not, no backups left.

    "As it was" is as before install, but for what the user changed in between:
    trusting memory-mcp's hook in Codex appended a ``hooks.state`` entry to
    ~/.codex/config.toml, and that entry is the user's to keep.
    """
    uninstall = uninstalled.runs[agent]
    assert uninstall.returncode == 0, uninstall.describe()
    files = config_files(home.home)[agent]
    expected = {path: installed.before[path] for path in files}
    expected |= {backup_of(path): installed.before[backup_of(path)] for path in files}
    if agent == "codex":
        config = home.home / ".codex" / "config.toml"
        assert installed.codex_trust is not None, "trusting the Codex hook rewrote config.toml"
        expected[config] = (installed.before[config] or b"") + installed.codex_trust
    actual = {path: uninstalled.after[path] for path in expected}
    problems = differences(expected, actual)
    meanwhile = differences(
        {path: installed.after[path] for path in expected},
        {path: uninstalled.before[path] for path in expected},
    )
    context = (
        ["Changed by the CLIs between install and uninstall:", *meanwhile] if meanwhile else []
    )
    assert not problems, "\n\n".join([uninstall.describe(), *problems, *context])


def test_uninstall_gemini_removes_the_settings_file_install_created(
    tmp_path: Path, cli_bin: Path
) -> None:
    machine = Home(tmp_path, cli_bin, model_path())
    settings = machine.home / ".gemini" / "settings.json"
    install = machine.memory_mcp("install", "gemini", "--hook")
    assert install.returncode == 0, install.describe()
    listing = machine.run("gemini", "mcp", "list")
    assert re.search(r"\bmemory: \S*memory-mcp serve\b", listing.output), listing.describe()
    uninstall = machine.memory_mcp("uninstall", "gemini")
    assert uninstall.returncode == 0, uninstall.describe()
    left = {
        path: path.read_text(encoding="utf-8")
        for path in (settings, backup_of(settings))
        if path.exists()
    }
    assert not left, f"uninstall left what install created:\n{uninstall.describe()}\n{left}"
