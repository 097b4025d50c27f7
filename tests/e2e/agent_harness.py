"""What the end-to-end tests need to drive the real agent CLIs as a user would.

A ``Home`` is one user's machine in a temporary folder: HOME, XDG folders, a
git project, one memory store, the three CLIs (``install_clis``) and
``memory-mcp`` on PATH, and a fake model server per API (``fake_models``) that
each CLI is configured to use the way its users point it at a custom endpoint:

========== ===================================== =====================================
CLI        model endpoint                        key
========== ===================================== =====================================
claude     ``ANTHROPIC_BASE_URL``                ``ANTHROPIC_API_KEY``
codex      ``[model_providers.<id>]`` in         the variable its ``env_key`` names
           ~/.codex/config.toml, ``base_url``,
           ``wire_api = "responses"``
gemini     ``GOOGLE_GEMINI_BASE_URL``            ``GEMINI_API_KEY``, with
                                                 ``security.auth.selectedType =
                                                 "gemini-api-key"`` in settings.json
========== ===================================== =====================================

Every command runs in its own process group with a time limit; whatever it
leaves running (an MCP server, a hook) is ended with it.
"""

from __future__ import annotations

import difflib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fake_models import (
    AnthropicMessages,
    FakeModel,
    GeminiApi,
    OpenAIResponses,
    Request,
    Transcript,
    Turn,
)

from helpers.model import seed_model_cache
from memory_mcp.dirs import CACHE_ENV

BRIEF_HEADING = "## Project memory (memory-mcp)"
COMMAND_TIMEOUT = 60.0  # seconds for install, uninstall, `mcp list`, a store
SESSION_TIMEOUT = 180.0  # seconds for one non-interactive agent session
AGENTS = ("claude", "codex", "gemini")

# The model each session asks for. Codex's is a self-hosted model's name (no
# metadata in Codex, so its plain function tools); Gemini's names one model so
# that Gemini CLI does not first ask a router model to pick one.
CODEX_MODEL = "local-coder"
GEMINI_MODEL = "gemini-2.5-flash"
CODEX_KEY_VARIABLE = "TEAM_GATEWAY_API_KEY"


@dataclass
class Ran:
    """A finished (or stopped) command."""

    argv: list[str]
    returncode: int | None  # None: stopped at its time limit
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def describe(self) -> str:
        """The command and what it said, for an assertion message."""
        code = "timed out" if self.returncode is None else f"exit {self.returncode}"
        return (
            f"$ {' '.join(self.argv)}  ({code}, {self.seconds:.1f} s)\n"
            f"--- stdout\n{self.stdout[-4000:]}\n--- stderr\n{self.stderr[-4000:]}"
        )


def run(
    argv: list[str], *, env: dict[str, str], cwd: Path, timeout: float = COMMAND_TIMEOUT
) -> Ran:
    """Run ``argv`` to the end or to ``timeout``; its process group goes with it."""
    start = time.monotonic()
    proc = subprocess.Popen(
        argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        _end_group(proc.pid)
        stdout, stderr = proc.communicate(timeout=COMMAND_TIMEOUT)
        code = None
    finally:
        _end_group(proc.pid)
    return Ran(argv, code, stdout, stderr, time.monotonic() - start)


def _end_group(pgid: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


# Configuration files ---------------------------------------------------------------------


def config_files(home: Path) -> dict[str, list[Path]]:
    """Each CLI's user configuration files that ``install`` may write."""
    return {
        "claude": [home / ".claude.json", home / ".claude" / "settings.json"],
        "codex": [home / ".codex" / "config.toml", home / ".codex" / "hooks.json"],
        "gemini": [home / ".gemini" / "settings.json"],
    }


def backup_of(path: Path) -> Path:
    """Where ``install`` backs a file up (README: ``<file>.memory-mcp.bak``)."""
    return path.with_name(path.name + ".memory-mcp.bak")


Snapshot = dict[Path, bytes | None]


def snapshot(paths: list[Path]) -> Snapshot:
    """Each file's bytes, or None where there is no file."""
    return {path: path.read_bytes() if path.is_file() else None for path in paths}


def differences(expected: Snapshot, actual: Snapshot) -> list[str]:
    """How ``actual`` differs from ``expected``, file by file, as readable diffs."""
    found = []
    for path, want in expected.items():
        got = actual.get(path)
        if want == got:
            continue
        if want is None:
            found.append(f"{path} exists but did not before:\n{_text(got)}")
        elif got is None:
            found.append(f"{path} is gone but existed before:\n{_text(want)}")
        else:
            diff = difflib.unified_diff(
                _text(want).splitlines(keepends=True),
                _text(got).splitlines(keepends=True),
                f"{path} (expected)",
                f"{path} (now)",
            )
            text = "".join(diff) or "(same lines)"
            endings = f"expected ends {want[-1:]!r}, now ends {got[-1:]!r}"
            found.append(f"{path} differs ({endings}):\n{text}")
    return found


def _text(data: bytes | None) -> str:
    return "" if data is None else data.decode("utf-8", "replace")


# The machine ----------------------------------------------------------------------------


@dataclass
class Session:
    """One non-interactive agent session and what its model saw."""

    agent: str
    ran: Ran
    transcript: Transcript
    model: FakeModel

    @property
    def first_request(self) -> Request:
        """The first request of the agent loop (the first to offer the model tools)."""
        requests = self.transcript.agent_requests
        assert requests, f"{self.agent} sent its model no request:\n{self.ran.describe()}"
        return requests[0]

    def result_of(self, turn: Turn) -> str:
        """The tool result of ``turn`` (a tool call), as the next request carried it back."""
        requests = self.transcript.agent_requests
        for number, request in enumerate(requests):
            if request.turn == turn:
                assert number + 1 < len(requests), (
                    f"{self.agent} never sent its model the result of {turn}:\n"
                    + self.ran.describe()
                )
                before = self.model.tool_results(request)
                after = self.model.tool_results(requests[number + 1])
                assert len(after) > len(before), (
                    f"{self.agent}'s request after {turn} carries no new tool result: {after}"
                )
                return after[-1]
        raise AssertionError(f"{self.agent} never played {turn}:\n{self.ran.describe()}")


def result_json(text: str) -> Any:
    """The JSON object in a tool result's text (CLIs wrap it in their own words)."""
    start, end = text.find("{"), text.rfind("}")
    assert start >= 0 and end > start, f"no JSON object in the tool result: {text!r}"
    return json.loads(text[start : end + 1])


@dataclass
class Home:
    """One user's machine: folders, environment, fake models, and the commands to run."""

    root: Path
    cli_bin: Path
    embedding_model: Path
    models: dict[str, FakeModel] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.home = self.root / "home"
        self.project = self.root / "project"
        self.data = self.root / "store"
        self.gemini_policy = self.root / "gemini-policy.toml"
        for folder in (self.home, self.project, self.data, self.root / "tmp"):
            folder.mkdir(parents=True, exist_ok=True)
        seed_model_cache(self.root / "xdg-cache" / "memory-mcp", self.embedding_model)
        venv_bin = Path(sys.executable).parent  # where `uv run` put memory-mcp
        assert (venv_bin / "memory-mcp").exists(), f"no memory-mcp console script in {venv_bin}"
        self.env = {
            "PATH": os.pathsep.join([str(self.cli_bin), str(venv_bin), os.environ["PATH"]]),
            "HOME": str(self.home),
            "USER": os.environ.get("USER", "e2e"),
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "TMPDIR": str(self.root / "tmp"),
            "XDG_CONFIG_HOME": str(self.root / "xdg-config"),
            "XDG_DATA_HOME": str(self.root / "xdg-data"),
            "XDG_CACHE_HOME": str(self.root / "xdg-cache"),
            "MEMORY_MCP_DATA_DIR": str(self.data),
            CACHE_ENV: str(self.root / "xdg-cache" / "memory-mcp"),
            "MEMORY_MCP_EMBEDDER_MODEL_PATH": str(self.embedding_model),
            "GIT_CONFIG_NOSYSTEM": "1",
            # No update checks, telemetry or error reports: nothing but the fake models.
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
        }

    def start_models(self) -> None:
        self.models = {
            "claude": AnthropicMessages().__enter__(),
            "codex": OpenAIResponses().__enter__(),
            "gemini": GeminiApi().__enter__(),
        }
        self.env |= {
            "ANTHROPIC_BASE_URL": self.models["claude"].url,
            "ANTHROPIC_API_KEY": "sk-ant-e2e-test",
            CODEX_KEY_VARIABLE: "sk-e2e-test",
            "GOOGLE_GEMINI_BASE_URL": self.models["gemini"].url,
            "GEMINI_API_KEY": "e2e-test-key",
        }

    def stop_models(self) -> None:
        for model in self.models.values():
            model.__exit__(None, None, None)

    def run(self, *argv: str, timeout: float = COMMAND_TIMEOUT) -> Ran:
        return run(list(argv), env=self.env, cwd=self.project, timeout=timeout)

    def memory_mcp(self, *args: str) -> Ran:
        """The project's own console script, as a user runs it."""
        return self.run("memory-mcp", *args)

    # A user's setup before memory-mcp: each CLI configured, the project trusted --------

    def set_up_as_a_user(self) -> None:
        """A git project, and each CLI configured and trusted in it as its user would.

        Codex: a model provider in ~/.codex/config.toml, and the project trusted
        (what its TUI writes when the user trusts the folder on the first start
        there). Gemini CLI: the API-key sign-in in settings.json, as its auth
        dialog writes it (2-space JSON, no final newline), and the folder in
        trustedFolders.json, as its trust dialog writes it (in an untrusted folder
        ``gemini -p`` exits 55, and MCP servers and hooks are off). Claude Code:
        nothing; it writes ~/.claude.json itself on first use.
        """
        git = self.run("git", "init", "--quiet", str(self.project))
        assert git.returncode == 0, git.describe()
        codex = self.home / ".codex"
        codex.mkdir()
        (codex / "config.toml").write_text(
            "# Codex talks to the team's OpenAI-compatible gateway.\n"
            f'model = "{CODEX_MODEL}"\n'
            'model_provider = "gateway"\n'
            "\n"
            "[model_providers.gateway]\n"
            'name = "Team gateway"\n'
            f'base_url = "{self.models["codex"].url}/v1"\n'
            f'env_key = "{CODEX_KEY_VARIABLE}"\n'
            'wire_api = "responses"\n'
            "\n"
            f'[projects."{self.project}"]\n'
            'trust_level = "trusted"\n',
            encoding="utf-8",
        )
        gemini = self.home / ".gemini"
        gemini.mkdir()
        signed_in = {"security": {"auth": {"selectedType": "gemini-api-key"}}}
        (gemini / "settings.json").write_text(json.dumps(signed_in, indent=2), encoding="utf-8")
        trusted = {str(self.project): "TRUST_FOLDER"}
        (gemini / "trustedFolders.json").write_text(json.dumps(trusted, indent=2), encoding="utf-8")
        self.gemini_policy.write_text(
            "".join(
                f'[[rule]]\nmcpName = "memory"\ntoolName = "{tool}"\n'
                'decision = "allow"\npriority = 200\n\n'
                for tool in ("searchUnifiedMemory", "memory_store")
            ),
            encoding="utf-8",
        )

    # Sessions ----------------------------------------------------------------------------

    def session(
        self, agent: str, prompt: str, script: list[Turn], *, memory_tools: bool = True
    ) -> Session:
        """One non-interactive session of ``agent``; its model plays ``script``.

        Args:
            memory_tools: grant the session memory-mcp's tools (once it is installed).
        """
        transcript = self.models[agent].expect(script)
        argv = SESSION_ARGV[agent](self, prompt, memory_tools)
        ran = self.run(*argv, timeout=SESSION_TIMEOUT)
        print(f"\ne2e: {agent} session: {ran.seconds:.1f} s", flush=True)
        return Session(agent, ran, transcript, self.models[agent])

    # Codex's hook review -----------------------------------------------------------------

    def trust_codex_hooks(self, command_word: str) -> list[dict[str, Any]]:
        """Trust the Codex hooks whose command holds ``command_word``, as /hooks in Codex does.

        Codex (0.169) runs a new or changed hook only after the user reviews and
        trusts it: its TUI says "1 hook needs review before it can run." and /hooks
        offers Trust, which writes ``[hooks.state."<hooks.json>:session_start:0:0"]
        trusted_hash = "sha256:..."`` into ~/.codex/config.toml. ``codex exec``
        skips an untrusted hook without a word. This asks Codex's own app server
        what the TUI asks (``hooks/list``: each hook's key and current hash) and
        writes what the TUI writes (``config/batchWrite`` to ``hooks.state``).

        Returns:
            The hooks as ``hooks/list`` listed them before.
        """
        with _AppServer(self) as server:
            listed = server.call("hooks/list", {"cwds": [str(self.project)]})
            hooks = [hook for entry in listed["data"] for hook in entry["hooks"]]
            review = {
                hook["key"]: {"trusted_hash": hook["currentHash"]}
                for hook in hooks
                if command_word in (hook.get("command") or "") and hook["trustStatus"] != "trusted"
            }
            if review:
                server.call(
                    "config/batchWrite",
                    {
                        "edits": [
                            {"keyPath": "hooks.state", "value": review, "mergeStrategy": "upsert"}
                        ],
                        "filePath": None,
                        "expectedVersion": None,
                        "reloadUserConfig": True,
                    },
                )
        return hooks


# How a user grants a non-interactive session memory-mcp's tools, per CLI: Claude
# Code's --allowedTools; Gemini CLI's policy rules (--policy). Codex needs no grant:
# memory-mcp's tools say what they do (readOnlyHint on the searches; memory_store
# neither destructive nor open-world), and Codex runs such tools without asking.


def _claude_argv(home: Home, prompt: str, memory_tools: bool) -> list[str]:
    grant = ["--allowedTools", "mcp__memory__memory_store"] if memory_tools else []
    return ["claude", "-p", prompt, *grant]


def _codex_argv(home: Home, prompt: str, memory_tools: bool) -> list[str]:
    """``codex exec`` does not wait for MCP servers that are not ``required``: under load
    its first request went out before the memory server's handshake, with no memory
    tools (Codex 0.169). Requiring the server, where it is installed, makes the session
    wait for it; ``install`` does not write it (a failed server would stop Codex)."""
    del memory_tools  # no grant: the tools' annotations suffice (see above)
    config = home.home / ".codex" / "config.toml"
    installed = config.is_file() and "[mcp_servers.memory]" in config.read_text()
    wait = ["-c", "mcp_servers.memory.required=true"] if installed else []
    return ["codex", "exec", *wait, "--color", "never", prompt]


def _gemini_argv(home: Home, prompt: str, memory_tools: bool) -> list[str]:
    grant = ["--policy", str(home.gemini_policy)] if memory_tools else []
    return ["gemini", "--model", GEMINI_MODEL, *grant, "-p", prompt]


SESSION_ARGV: dict[str, Callable[[Home, str, bool], list[str]]] = {
    "claude": _claude_argv,
    "codex": _codex_argv,
    "gemini": _gemini_argv,
}


class _AppServer:
    """``codex app-server`` on stdio: JSON-RPC, one message a line, every wait bounded."""

    def __init__(self, home: Home) -> None:
        self._home = home
        self._lines: queue.Queue[str] = queue.Queue()
        self._next_id = 0

    def __enter__(self) -> _AppServer:
        self._proc = subprocess.Popen(
            ["codex", "app-server"],
            env=self._home.env,
            cwd=self._home.project,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        assert self._proc.stdout is not None
        threading.Thread(target=self._read, args=(self._proc.stdout,), daemon=True).start()
        self.call("initialize", {"clientInfo": {"name": "memory-mcp-e2e", "version": "1"}})
        self._send({"jsonrpc": "2.0", "method": "initialized"})
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=COMMAND_TIMEOUT)
        finally:
            _end_group(self._proc.pid)

    def _read(self, stream: Any) -> None:
        for line in stream:
            self._lines.put(line)

    def _send(self, message: dict[str, Any]) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(message) + "\n")
        self._proc.stdin.flush()

    def call(self, method: str, params: dict[str, Any]) -> Any:
        self._next_id += 1
        self._send({"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params})
        deadline = time.monotonic() + COMMAND_TIMEOUT
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"codex app-server did not answer {method}") from None
            message = json.loads(line)
            if message.get("id") == self._next_id:
                assert "error" not in message, f"codex app-server: {method}: {message}"
                return message["result"]
