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

import contextlib
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
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


_FIRST_QUESTION = {"query": "how do we deploy"}  # a session's first memory_search


def launch_once(
    command: Sequence[str], cwd: Path, timeout: float = 120.0, *, search: bool = False
) -> Launch:
    """One launch: seconds until the ``tools/list`` answer (and the first search's) arrive."""
    with Served(command, cwd, timeout=timeout) as served:
        if not search:
            return Launch(served.ready_s)
        result = served.call("memory_search", _FIRST_QUESTION)
        return Launch(served.ready_s, served.since_launch(), str(result.get("mode")))


class Served:
    """A ``memory-mcp serve`` process on stdio, from ``Popen`` past the handshake
    (``ready_s`` after it), whose tools are then called one at a time; closed
    through stdin, as a CLI closes it.

    ``env``: variables set for the process on top of this one's; its ``roots/list``
    asks are answered with ``cwd``. A server that fails (exits, does not answer, answers
    with an error) raises RuntimeError or TimeoutError with the end of what it wrote
    to stderr.
    """

    def __init__(
        self,
        command: Sequence[str],
        cwd: Path,
        *,
        env: dict[str, str] | None = None,
        timeout: float = 120.0,
    ) -> None:
        self.command, self.cwd, self.timeout = list(command), cwd, timeout
        self.env = None if env is None else {**os.environ, **env}
        self.ready_s = 0.0
        self._ids = 2

    def __enter__(self) -> Served:
        self._stderr = tempfile.TemporaryFile()  # closed by __exit__
        self.started = time.perf_counter()
        try:
            self.process = subprocess.Popen(
                self.command,
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
            )
        except BaseException:
            self._stderr.close()
            raise
        try:
            self._send(
                _INITIALIZE,
                {"jsonrpc": "2.0", "method": "notifications/initialized"},
                {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
            )
            self._answer(2, self.started)
        except BaseException:
            self.__exit__()
            raise
        self.ready_s = self.since_launch()
        return self

    def __exit__(self, *_: object) -> None:
        assert self.process.stdin is not None
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._stderr.close()

    def since_launch(self) -> float:
        """Seconds since ``Popen``."""
        return time.perf_counter() - self.started

    def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """The structured result of one tool call (its error raised as RuntimeError)."""
        self._ids += 1
        request = {"name": tool, "arguments": arguments}
        self._send({"jsonrpc": "2.0", "id": self._ids, "method": "tools/call", "params": request})
        answer = self._answer(self._ids, time.perf_counter())
        return dict(answer["result"].get("structuredContent") or {})

    def _answer(self, request: int, started: float) -> dict[str, Any]:
        try:
            return _answer(self.process, request, started, self.timeout, self.cwd)
        except (RuntimeError, TimeoutError) as exc:
            said = self._said()
            raise type(exc)(f"{exc}; it said: {said}" if said else str(exc)) from None

    def _said(self, most: int = 800) -> str:
        """The end of what the process wrote to stderr so far."""
        self._stderr.flush()
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - most))
        return self._stderr.read().decode(errors="replace").strip()

    def resident_mb(self) -> float | None:
        """The process's resident memory now, in MB (None where it cannot be read)."""
        return process_resident_mb(self.process.pid)

    def peak_mb(self) -> float | None:
        """The process's highest resident memory so far, in MB (Linux; else None)."""
        return _status_mb(self.process.pid, "VmHWM")

    def settle(self, quiet_s: float = 1.0, timeout: float = 600.0) -> bool:
        """Wait until the process works less than a tenth of a core over ``quiet_s``
        (what it does in the background after an answer: a vector index built, the
        embedding a store deferred); False if it had not after ``timeout`` seconds,
        or where its CPU time cannot be read (not Linux)."""
        ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        deadline = time.monotonic() + timeout
        before = _cpu_s(self.process.pid, ticks)
        while before is not None and time.monotonic() < deadline:
            time.sleep(quiet_s)
            now = _cpu_s(self.process.pid, ticks)
            if now is None:
                return False
            if now - before < 0.1 * quiet_s:
                return True
            before = now
        return False

    def _send(self, *messages: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        for message in messages:
            self.process.stdin.write(json.dumps(message).encode() + b"\n")
        self.process.stdin.flush()


def process_resident_mb(pid: int | str = "self") -> float | None:
    """A process's resident memory now, in MB: ``/proc`` (Linux), else ``ps``."""
    now = _status_mb(pid, "VmRSS")
    if now is not None:
        return now
    if pid == "self":
        pid = os.getpid()
    with contextlib.suppress(OSError, ValueError, subprocess.SubprocessError):
        shown = subprocess.run(
            ["ps", "-o", "rss=", "-p", str(pid)], capture_output=True, text=True, timeout=10
        )
        return int(shown.stdout.strip()) / 1024
    return None


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


def _status_mb(pid: int | str, field: str) -> float | None:
    """A ``/proc/<pid>/status`` figure (kB there), in MB; None where it cannot be read."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    return None


def _cpu_s(pid: int, ticks: int) -> float | None:
    """The CPU seconds a process has used (``/proc/<pid>/stat``: user + system)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / ticks
    return None
