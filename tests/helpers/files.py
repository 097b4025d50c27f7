"""Files as a test sets them up."""

from __future__ import annotations

import os
import time
from pathlib import Path

AN_HOUR = 3600


def backdate(*paths: Path) -> None:
    """Move each file's mtime an hour back, so that a rewrite, however quick, shows.

    Without it, "no mtime changed" cannot fail: a file rewritten within the
    clock's granularity keeps the mtime it had.
    """
    then = time.time() - AN_HOUR
    for path in paths:
        os.utime(path, (then, then))
