"""``bench cli``: the command line's commands as whole processes, median seconds each.

What a user (and every SessionStart hook) waits for. Targets: ``--version``,
``status``, ``brief``, ``brief --hook`` and ``inject`` need no model and should
answer within 0.3 s; ``store`` and ``search`` load the model and should answer
within 1.0 s.

Set-up: a temporary project (a git work tree) and data directory holding
``memories`` generated coding-agent memories, imported and embedded by
``memory-mcp import``. Each command then runs ``runs`` times from the project,
after one untimed run. Two columns: with Python's bytecode cache, as any
installed copy runs (``PYTHONDONTWRITEBYTECODE`` is removed so that the untimed
run writes it), and without one (every module compiled from source each time,
as on a machine that sets ``PYTHONDONTWRITEBYTECODE`` and never kept a cache).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memory_mcp.bench.launch import executable
from memory_mcp.bench.perf import export_lines, generate

# (command line, target seconds)
COMMANDS: tuple[tuple[tuple[str, ...], float], ...] = (
    (("--version",), 0.3),
    (("status",), 0.3),
    (("brief",), 0.3),
    (("brief", "--hook"), 0.3),
    (("inject",), 0.3),
    (("store",), 1.0),
    (("search", "how do we deploy to production"), 1.0),
)


@dataclass
class CommandTiming:
    """One command's runs, in seconds."""

    argv: tuple[str, ...]
    target_s: float
    cached: list[float] = field(default_factory=list)
    uncached: list[float] = field(default_factory=list)

    @property
    def name(self) -> str:
        return " ".join(self.argv[:2] if self.argv[0] == "brief" else self.argv[:1])

    def to_json(self) -> dict[str, Any]:
        return {
            "command": self.name,
            "target_s": self.target_s,
            "median_s": round(statistics.median(self.cached), 3),
            "max_s": round(max(self.cached), 3),
            "median_no_bytecode_s": (
                round(statistics.median(self.uncached), 3) if self.uncached else None
            ),
            "all_s": [round(t, 3) for t in self.cached],
        }


@dataclass
class CommandsReport:
    memories: int
    runs: int
    timings: list[CommandTiming]

    def to_json(self) -> dict[str, Any]:
        return {
            "memories": self.memories,
            "runs": self.runs,
            "commands": [t.to_json() for t in self.timings],
        }


def run_commands_bench(
    *,
    memories: int = 1000,
    runs: int = 10,
    uncached: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> CommandsReport:
    """Time every command of ``COMMANDS`` as a whole process (see the module docstring)."""
    program = executable()
    with tempfile.TemporaryDirectory(prefix="memory-mcp-bench-cli-") as tmp:
        root = Path(tmp)
        project = root / "project"
        (project / ".git").mkdir(parents=True)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["MEMORY_MCP_DATA_DIR"] = str(root / "data")
        # Its own store, whatever storage.url the user's environment or config names.
        env["MEMORY_MCP_STORAGE_URL"] = f"sqlite:///{root / 'data' / 'memory.db'}"
        dump = root / "memories.jsonl"
        dump.write_text("\n".join(export_lines(generate(memories), project)) + "\n", "utf-8")
        _run([program, "import", str(dump)], project, env)
        no_cache = {
            **env,
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONPYCACHEPREFIX": str(root / "empty-pycache"),
        }
        timings = [CommandTiming(argv, target) for argv, target in COMMANDS]
        total = len(timings) * runs * (2 if uncached else 1)
        done = 0
        for timing in timings:
            hook_input = json.dumps({"cwd": str(project), "hook_event_name": "SessionStart"})
            stdin = hook_input if timing.argv == ("brief", "--hook") else ""
            for variant, environment in (("cached", env), ("uncached", no_cache)):
                if variant == "uncached" and not uncached:
                    continue
                times = timing.cached if variant == "cached" else timing.uncached
                for n in range(runs + 1):
                    argv = _argv(timing.argv, n, variant)
                    took = _run([program, *argv], project, environment, stdin)
                    if n:  # the first run is untimed: it writes the bytecode cache
                        times.append(took)
                        done += 1
                        if progress is not None:
                            progress(done, total)
    return CommandsReport(memories, runs, timings)


def _argv(argv: Sequence[str], n: int, variant: str) -> list[str]:
    """The command line of run ``n``; each ``store`` stores a new memory."""
    if argv[0] == "store":
        return [
            "store",
            f"Benchmark run {variant} {n}: the nightly job restarts worker {n} at 0{n % 10}:30",
        ]
    return list(argv)


def _run(argv: Sequence[str], cwd: Path, env: dict[str, str], stdin: str = "") -> float:
    """Run ``argv`` to the end; its wall time in seconds.

    Raises:
        RuntimeError: the command failed (its standard error is in the message).
    """
    started = time.perf_counter()
    done = subprocess.run(
        list(argv), cwd=cwd, env=env, input=stdin, capture_output=True, text=True, timeout=600
    )
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return took
