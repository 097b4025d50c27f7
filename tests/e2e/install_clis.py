"""Install the three agent CLIs the end-to-end tests drive, at pinned versions, once.

    python tests/e2e/install_clis.py     # prints the folder that holds claude, codex, gemini

The CLIs come from the npm registry (``npm install``) into
``~/.cache/memory-mcp-e2e/<hash of the pins>`` (the root can be moved with
``$MEMORY_MCP_E2E_CLI_CACHE``). A folder is used only once it is complete: the
install goes to a temporary folder beside it, each CLI must print its pinned
version, and only then is the folder renamed into place. So a later run finds
it in milliseconds, and an interrupted install is simply done again.

When node or npm is missing, or the install fails, this raises (or, run as a
script, prints) one message saying what to do; the suite never skips.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

PINS = {
    "@anthropic-ai/claude-code": "2.1.197",
    "@openai/codex": "0.169.0",
    "@google/gemini-cli": "0.61.0",
}
# Each command, and the pinned package whose version its --version prints.
COMMANDS = {
    "claude": "@anthropic-ai/claude-code",
    "codex": "@openai/codex",
    "gemini": "@google/gemini-cli",
}
CACHE_ENV = "MEMORY_MCP_E2E_CLI_CACHE"
MIN_NODE = 20  # Gemini CLI's engines field
COMPLETE = "complete.json"
INSTALL_TIMEOUT = 900.0  # seconds for npm: three packages, ~750 MB unpacked
VERSION_TIMEOUT = 60.0


class CliInstallError(Exception):
    """The CLIs cannot be installed here; the message says why and what to do."""


def cache_folder() -> Path:
    """Where these pins are (or will be) installed."""
    root = os.environ.get(CACHE_ENV) or str(Path.home() / ".cache" / "memory-mcp-e2e")
    digest = hashlib.sha256(json.dumps(PINS, sort_keys=True).encode("utf-8")).hexdigest()
    return Path(root) / digest[:16]


def bin_folder(folder: Path) -> Path:
    return folder / "node_modules" / ".bin"


def is_complete(folder: Path) -> bool:
    marker = folder / COMPLETE
    if not marker.is_file():
        return False
    try:
        recorded = json.loads(marker.read_text(encoding="utf-8"))
    except ValueError:
        return False
    return recorded == PINS and all((bin_folder(folder) / c).exists() for c in COMMANDS)


def ensure() -> Path:
    """The folder holding ``claude``, ``codex`` and ``gemini`` at the pinned versions.

    Raises:
        CliInstallError: node or npm is missing or too old, or the install failed.
    """
    _check_node()  # Gemini CLI runs on it, cached or not
    folder = cache_folder()
    if is_complete(folder):
        return bin_folder(folder)
    partial = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        _npm_install(partial)
        _check_versions(bin_folder(partial))
        (partial / COMPLETE).write_text(json.dumps(PINS, indent=2) + "\n", encoding="utf-8")
        if folder.exists() and not is_complete(folder):
            shutil.rmtree(folder)  # an older, broken attempt
        if not folder.exists():
            partial.rename(folder)
    finally:
        shutil.rmtree(partial, ignore_errors=True)  # gone already, or another run won the race
    return bin_folder(folder)


def _check_node() -> None:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        missing = [name for name, path in (("node", node), ("npm", npm)) if not path]
        verb = "is" if len(missing) == 1 else "are"
        raise CliInstallError(
            "the end-to-end tests (tests/e2e) install the agent CLIs with npm, but "
            f"{' and '.join(missing)} {verb} not on PATH: install Node.js {MIN_NODE} or newer "
            "with npm (e.g. apt-get install nodejs npm), then run again"
        )
    try:
        version = subprocess.run(
            [node, "--version"], capture_output=True, text=True, timeout=VERSION_TIMEOUT
        ).stdout.strip()
        major = int(version.lstrip("v").split(".")[0])
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        raise CliInstallError(f"cannot tell which Node.js {node} is ({exc})") from None
    if major < MIN_NODE:
        raise CliInstallError(
            f"the agent CLIs need Node.js {MIN_NODE} or newer; {node} is {version}: "
            "upgrade it, then run again"
        )


def _npm_install(prefix: Path) -> None:
    packages = [f"{name}@{version}" for name, version in PINS.items()]
    command = [
        "npm",
        "install",
        "--prefix",
        str(prefix),
        "--save-exact",
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
        *packages,
    ]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired:
        raise CliInstallError(
            f"npm install {' '.join(packages)} did not finish in {INSTALL_TIMEOUT:.0f} s "
            "(is the npm registry reachable?)"
        ) from None
    if done.returncode != 0:
        raise CliInstallError(
            f"npm install {' '.join(packages)} failed (exit {done.returncode}):\n"
            f"{done.stderr.strip()[-3000:]}"
        )


def _check_versions(bin_dir: Path) -> None:
    for command, package in COMMANDS.items():
        program = bin_dir / command
        try:
            done = subprocess.run(
                [str(program), "--version"],
                capture_output=True,
                text=True,
                timeout=VERSION_TIMEOUT,
                stdin=subprocess.DEVNULL,
            )
            said = (done.stdout + done.stderr).strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            said = str(exc)
        if PINS[package] not in said:
            raise CliInstallError(
                f"{package}@{PINS[package]} installed, but `{program} --version` says "
                f"{said[-500:]!r} (did npm skip its install script?)"
            )


def main() -> int:
    try:
        print(ensure())
    except CliInstallError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
