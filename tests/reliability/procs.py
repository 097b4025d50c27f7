"""Worker processes for the reliability suite, started ready and released at once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).with_name("worker.py")


def start(*args: object) -> subprocess.Popen[str]:
    """Start a worker (worker.py), wait until it is ready; ``go`` releases it."""
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise AssertionError(f"worker did not start: {line!r} {proc.communicate()[1]}")
    return proc


def go(*procs: subprocess.Popen[str]) -> None:
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
