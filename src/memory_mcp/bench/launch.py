"""``bench launch``: seconds from spawning ``memory-mcp serve`` to its ``tools/list`` answer.

What an agent CLI waits for at startup (SPEC §12: within 0.6 s). Each launch is a
fresh process on stdio, timed from ``Popen`` to the ``tools/list`` response, with
the legacy handshake the CLIs use (``initialize``, ``notifications/initialized``,
``tools/list``); the process is then closed through stdin, as a CLI does.

The first launch of a version has no handshake cache yet (``front.py``) and
pays for importing the MCP SDK; it is reported apart from the rest.
"""

from __future__ import annotations

import json
import os
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memory_mcp.front import CACHE_FILE, cache_dir

_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {"roots": {"listChanged": True}},
        "clientInfo": {"name": "memory-mcp-bench", "version": "1"},
    },
}


@dataclass
class LaunchReport:
    command: list[str]
    cold: float | None  # the launch that found no handshake cache, if there was one
    warm: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.warm)

    def to_json(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "launches": len(self.warm),
            "median_s": round(self.median, 4),
            "min_s": round(min(self.warm), 4),
            "max_s": round(max(self.warm), 4),
            "cold_s": None if self.cold is None else round(self.cold, 4),
            "all_s": [round(t, 4) for t in self.warm],
        }


def launch_once(command: Sequence[str], cwd: Path, timeout: float = 120.0) -> float:
    """One launch: seconds until the ``tools/list`` answer arrives."""
    started = time.perf_counter()
    process = subprocess.Popen(
        list(command),
        cwd=cwd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        for message in (
            _INITIALIZE,
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        ):
            process.stdin.write(json.dumps(message).encode() + b"\n")
        process.stdin.flush()
        while True:
            left = timeout - (time.perf_counter() - started)
            ready, _, _ = select.select([process.stdout], [], [], max(0.0, left))
            if not ready:
                raise TimeoutError(f"no tools/list answer within {timeout:.0f} s")
            line = process.stdout.readline()
            if not line:
                raise RuntimeError(f"the server exited ({process.wait()}) before answering")
            answer = json.loads(line)
            if answer.get("id") == 2:
                if "result" not in answer:
                    raise RuntimeError(f"tools/list failed: {answer.get('error')}")
                return time.perf_counter() - started
    finally:
        process.stdin.close()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_launch_bench(
    cwd: Path,
    *,
    launches: int = 10,
    command: Sequence[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> LaunchReport:
    """``launches`` timed launches, after one untimed launch if there is no cache yet."""
    command = list(command or [_executable(), "serve"])
    cold = None
    if not (cache_dir() / CACHE_FILE).is_file():
        cold = launch_once(command, cwd)
    report = LaunchReport(command=command, cold=cold)
    for n in range(launches):
        report.warm.append(launch_once(command, cwd))
        if progress is not None:
            progress(n + 1, launches)
    return report


def _executable() -> str:
    beside = Path(sys.executable).with_name("memory-mcp" + (".exe" if os.name == "nt" else ""))
    return str(beside) if beside.is_file() else "memory-mcp"
