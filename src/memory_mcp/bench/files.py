"""Reading the benchmarks' JSON-lines files (plain or gzipped)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO, TypeVar

from memory_mcp.errors import InvalidInput

T = TypeVar("T")


def open_text(path: Path) -> TextIO:
    """A UTF-8 text file, decompressed when its name ends in ``.gz``."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def read_jsonl(path: Path, parse: Callable[[Any], T], what: str) -> Iterator[T]:
    """Each non-blank line of ``path``, decoded and passed through ``parse``.

    Raises:
        InvalidInput: a line is not JSON, or ``parse`` refused it (ValueError,
            KeyError, TypeError or AttributeError); the message names the line
            and says it is not ``what``.
    """
    with open_text(path) as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                item = parse(json.loads(line))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise InvalidInput(f"{path}:{number}: not {what} ({exc})") from None
            yield item
