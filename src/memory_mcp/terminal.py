"""What the command line shows: plain lines, aligned columns, progress bars.

Plain text goes straight to the stream (a memory's ``:rocket:`` or ``[b]`` is
printed as written); ``rich`` is imported only for what needs it, the progress
bars and the spinner of long work, so that short commands start fast.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol, TextIO


class Printer:
    """Lines on standard output or standard error."""

    def __init__(self, *, stderr: bool = False) -> None:
        self._stderr = stderr
        self._console: Any = None

    @property
    def stream(self) -> TextIO:
        return sys.stderr if self._stderr else sys.stdout

    def print(self, *parts: object) -> None:
        """Print ``parts`` separated by spaces, as one line."""
        self.stream.write(" ".join(str(p) for p in parts) + "\n")
        self.stream.flush()

    def table(self, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        """Print ``rows`` under ``header`` in left-aligned columns, two spaces apart."""
        for line in columns(header, rows):
            self.print(line)

    @property
    def console(self) -> Any:
        """A ``rich`` console on this stream (imported on first use)."""
        if self._console is None:
            from rich.console import Console

            self._console = Console(
                stderr=self._stderr, highlight=False, soft_wrap=True, markup=False
            )
        return self._console


def columns(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """``header`` and ``rows`` as lines of left-aligned columns."""
    table = [list(header), *[list(row) for row in rows]]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in table
    ]


class Report(Protocol):
    def __call__(self, done: int, new_total: int | None = None, phase: str | None = None) -> None:
        """Show ``done`` of ``new_total`` (or the first total), in ``phase`` if given."""


@contextmanager
def progress(printer: Printer, description: str, total: int | None) -> Iterator[Report]:
    """A progress bar on ``printer``'s stream; yields ``report(done, total, phase)``.

    ``total`` may be None (unknown); a new ``phase`` names the next step.
    """
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=printer.console,
        transient=True,
    ) as bar:
        task = bar.add_task(description, total=total)

        def report(done: int, new_total: int | None = None, phase: str | None = None) -> None:
            bar.update(task, completed=done, total=new_total or total, description=phase)

        yield report
