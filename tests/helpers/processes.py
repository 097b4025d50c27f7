"""Processes the tests start: the ``memory-mcp`` command, and worker processes.

Workers are started, held at a "ready" line, released at once, read with a deadline.

A worker script (``tests/concurrency_worker.py``, ``tests/maintenance_worker.py``,
``tests/reliability/worker.py``) opens what it needs, calls ``wait_for_go()`` and
then works. A test starts workers with the ``workers`` fixture (``workers.start``)
and ``release`` waits until every one of them is ready, then lets them all go at
the same moment. Each read of a worker's output has a timeout and fails saying
which worker went quiet.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

TESTS = Path(__file__).resolve().parents[1]
COMMAND = str(Path(sys.executable).with_name("memory-mcp"))  # this environment's console script
READY = "ready"
GO = "go"


def wait_for_go() -> None:
    """In a worker: say it is ready, then wait for the test's go line."""
    print(READY, flush=True)
    sys.stdin.readline()


class Worker:
    """One worker process; its stdout is read line by line, each read bounded."""

    def __init__(self, script: Path, *args: object) -> None:
        self.name = f"{script.name} {' '.join(map(str, args))[:80]}".strip()
        path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
        self.process = subprocess.Popen(
            [sys.executable, str(script), *map(str, args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": path},  # a worker imports helpers as tests do
        )
        assert self.process.stdout is not None and self.process.stderr is not None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        self._readers = [
            threading.Thread(target=self._read_lines, args=(self.process.stdout,), daemon=True),
            threading.Thread(target=self._stderr.extend, args=(self.process.stderr,), daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        self._ready = False

    def _read_lines(self, stream: IO[str]) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put(None)  # end of output

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    @property
    def stderr(self) -> str:
        return "".join(self._stderr)

    def line(self, *, timeout: float = 60) -> str:
        """The next line it prints (without the newline); fails if none comes in time."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            raise AssertionError(f"{self.name} printed nothing for {timeout} s") from None
        if line is None:
            self._lines.put(None)
            self.process.wait(timeout=30)
            raise AssertionError(
                f"{self.name} exited ({self.returncode}) instead of printing: {self.stderr}"
            )
        return line.rstrip("\n")

    def wait_ready(self, *, timeout: float = 60) -> None:
        """Return once it has printed "ready" (at once if it has)."""
        if self._ready:
            return
        line = self.line(timeout=timeout)
        if line != READY:
            self.kill()
            raise AssertionError(f"{self.name} did not start: {line!r} {self.stderr}")
        self._ready = True

    def release(self) -> None:
        self.wait_ready()
        assert self.process.stdin is not None
        self.process.stdin.write(f"{GO}\n")
        self.process.stdin.flush()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def finish(self, *, timeout: float) -> tuple[str, str]:
        """Wait for it to exit; what it printed since the last ``line()``, and its stderr."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"{self.name} was still running after {timeout} s: {self.stderr}"
            ) from None
        for reader in self._readers:
            reader.join(timeout=30)
            assert not reader.is_alive(), f"{self.name} exited, but its output never closed"
        rest = []
        while (line := self._lines.get_nowait()) is not None:
            rest.append(line)
        self._lines.put(None)
        return "".join(rest), self.stderr

    def result(self, *, timeout: float) -> Any:
        """Wait for a clean exit; the JSON on its last line."""
        out, err = self.finish(timeout=timeout)
        assert self.returncode == 0, err
        return json.loads(out.strip().splitlines()[-1])


class Workers:
    """The workers one test starts; whatever is still running at its end is killed."""

    def __init__(self) -> None:
        self.started: list[Worker] = []

    def start(self, script: Path, *args: object) -> Worker:
        """Start ``python script *args``; it waits for ``release``."""
        worker = Worker(script, *args)
        self.started.append(worker)
        return worker

    def kill_all(self) -> None:
        for worker in self.started:
            worker.kill()


def release(*workers: Worker) -> None:
    """Wait until every worker is ready, then send each the go line: they begin at once."""
    for worker in workers:
        worker.wait_ready()
    for worker in workers:
        worker.release()
