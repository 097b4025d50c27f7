"""``bench launch``: from spawning ``memory-mcp serve`` to ``tools/list``, and to a first search.

What an agent CLI waits for at startup (SPEC §12: within 0.6 s), then what its
first tool call waits for (SPEC §12: the first search is hybrid, within 1 s).
Each launch is a fresh process on stdio, timed from ``Popen``: the legacy
handshake the CLIs use (``initialize``, ``notifications/initialized``,
``tools/list``), then at once a ``memory_search`` call, as a session's first
question arrives; its answer says whether it was hybrid (the model had loaded,
or the search waited for it) or lexical. The process is then closed through
stdin, as a CLI does.

The first launch of a version has no handshake cache yet (``mcp/front.py``) and
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

from memory_mcp.dirs import HANDSHAKE_CACHE, cache_dir

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


@dataclass(frozen=True)
class Launch:
    """One launch: seconds to the ``tools/list`` answer and to the first search's."""

    tools_s: float
    search_s: float | None = None
    mode: str | None = None  # the first search's: hybrid or lexical


@dataclass
class LaunchReport:
    command: list[str]
    cold: float | None  # the launch that found no handshake cache, if there was one
    launches: list[Launch] = field(default_factory=list)

    @property
    def warm(self) -> list[float]:
        return [launch.tools_s for launch in self.launches]

    @property
    def median(self) -> float:
        return statistics.median(self.warm)

    @property
    def search_median(self) -> float | None:
        times = [launch.search_s for launch in self.launches if launch.search_s is not None]
        return statistics.median(times) if times else None

    @property
    def hybrid(self) -> int:
        """How many launches' first search was hybrid."""
        return sum(launch.mode == "hybrid" for launch in self.launches)

    def to_json(self) -> dict[str, Any]:
        search = self.search_median
        return {
            "command": self.command,
            "launches": len(self.warm),
            "median_s": round(self.median, 4),
            "min_s": round(min(self.warm), 4),
            "max_s": round(max(self.warm), 4),
            "cold_s": None if self.cold is None else round(self.cold, 4),
            "all_s": [round(t, 4) for t in self.warm],
            "first_search_median_s": None if search is None else round(search, 4),
            "first_search_hybrid": self.hybrid,
            "first_search_all_s": [
                None if launch.search_s is None else round(launch.search_s, 4)
                for launch in self.launches
            ],
        }


_SEARCH = {
    "jsonrpc": "2.0",
    "id": 3,
    "method": "tools/call",
    "params": {"name": "memory_search", "arguments": {"query": "how do we deploy"}},
}


def launch_once(
    command: Sequence[str], cwd: Path, timeout: float = 120.0, *, search: bool = False
) -> Launch:
    """One launch: seconds until the ``tools/list`` answer (and the first search's) arrive."""
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
        answer = _answer(process, 2, started, timeout, cwd)
        tools_s = time.perf_counter() - started
        if not search:
            return Launch(tools_s)
        process.stdin.write(json.dumps(_SEARCH).encode() + b"\n")
        process.stdin.flush()
        answer = _answer(process, 3, started, timeout, cwd)
        result = answer["result"].get("structuredContent") or {}
        return Launch(tools_s, time.perf_counter() - started, str(result.get("mode")))
    finally:
        process.stdin.close()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _answer(
    process: subprocess.Popen[bytes], request: int, started: float, timeout: float, cwd: Path
) -> dict[str, Any]:
    """The server's answer to request ``request``; its ``roots/list`` asks are answered
    with ``cwd``, as a CLI answers them, and other messages are skipped."""
    assert process.stdout is not None and process.stdin is not None
    while True:
        left = timeout - (time.perf_counter() - started)
        ready, _, _ = select.select([process.stdout], [], [], max(0.0, left))
        if not ready:
            raise TimeoutError(f"no answer to request {request} within {timeout:.0f} s")
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"the server exited ({process.wait()}) before answering")
        answer: dict[str, Any] = json.loads(line)
        if answer.get("method") == "roots/list" and "id" in answer:
            roots = {"roots": [{"uri": cwd.resolve().as_uri(), "name": cwd.name}]}
            reply = {"jsonrpc": "2.0", "id": answer["id"], "result": roots}
            process.stdin.write(json.dumps(reply).encode() + b"\n")
            process.stdin.flush()
            continue
        if answer.get("id") == request:
            if "result" not in answer or answer["result"].get("isError"):
                raise RuntimeError(f"request {request} failed: {answer}")
            return answer


def run_launch_bench(
    cwd: Path,
    *,
    launches: int = 10,
    command: Sequence[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    search: bool = False,
) -> LaunchReport:
    """``launches`` timed launches, after one untimed launch if there is no cache yet.

    Args:
        search: also time a ``memory_search`` sent right after ``tools/list``.
    """
    command = list(command or [executable(), "serve"])
    cold = None
    if not (cache_dir() / HANDSHAKE_CACHE).is_file():
        cold = launch_once(command, cwd).tools_s
    report = LaunchReport(command=command, cold=cold)
    for n in range(launches):
        report.launches.append(launch_once(command, cwd, search=search))
        if progress is not None:
            progress(n + 1, launches)
    return report


def executable() -> str:
    beside = Path(sys.executable).with_name("memory-mcp" + (".exe" if os.name == "nt" else ""))
    return str(beside) if beside.is_file() else "memory-mcp"
