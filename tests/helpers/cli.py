"""The command line as a test drives it: typer's CliRunner, in a chosen directory."""

from __future__ import annotations

import os
from pathlib import Path

from typer.testing import CliRunner

from memory_mcp.cli.app import app

runner = CliRunner()


def run(*args: str, cwd: Path | None = None, stdin: str | None = None) -> tuple[int, str, str]:
    """``memory-mcp ARGS`` run in ``cwd`` (reading ``stdin``): (exit code, stdout, stderr)."""
    old = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        result = runner.invoke(app, list(args), input=stdin)
    finally:
        os.chdir(old)
    return result.exit_code, result.stdout, result.stderr
