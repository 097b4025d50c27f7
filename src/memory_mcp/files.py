"""Writing a file so that a reader sees the old text or the new, never half of either."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Atomically replace ``path`` with ``data``: a temporary file beside it (created
    exclusively, under a random name), flushed to disk, then renamed over it.

    Args:
        mode: the file's permissions; by default those it had, else 0644.
    """
    if mode is None:
        mode = path.stat().st_mode & 0o7777 if path.exists() else 0o644
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
