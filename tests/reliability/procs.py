"""Worker processes for the reliability suite, started ready and released at once."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import release, start_ready

WORKER = Path(__file__).with_name("worker.py")


def start(*args: object) -> subprocess.Popen[str]:
    """Start a worker (worker.py), wait until it is ready; ``go`` releases it."""
    return start_ready([str(WORKER), *map(str, args)])


go = release
