"""Safe edits of the agent CLIs' configuration files, and reading their JSON.

Edits merge into what is there. Before a file the user had is changed, it is
copied to ``<file>.memory-mcp.bak`` (once: the backup is the original). Taking
out the last entry of ours deletes a file install created, gives a file that is
otherwise as it was its original bytes back (and the backup goes), and leaves a
file the user changed since with those changes.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from memory_mcp.errors import InvalidInput
from memory_mcp.files import atomic_write


@dataclass(frozen=True)
class ConfigChange:
    """One configuration file and what ``install`` / ``uninstall`` did to it."""

    path: Path
    outcome: Literal["added", "updated", "unchanged", "removed", "absent"]
    what: str
    backup: Path | None = None
    note: str = ""


@dataclass(frozen=True)
class Format:
    """How to read, write and compare one kind of configuration file."""

    load: Callable[[Path], Any]
    dump: Callable[[Any, str], str]  # (data, the file's text so far: its style is kept)
    parsed: Callable[[Any, Path], Any]  # what two versions are compared by


def _load_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput(
            f"{path} is not valid JSON ({exc}); fix it, then install again"
        ) from None
    if not isinstance(data, dict):
        raise InvalidInput(f"{path} does not hold a JSON object; fix it, then install again")
    return data


def _dump_json(data: dict[str, Any], old: str) -> str:
    """``data`` as JSON in the style of ``old``: its indentation and final line break.

    Claude Code and Gemini CLI write their files with two spaces and no final
    newline; a file edited here keeps whichever style it had (new files: two
    spaces and a newline).
    """
    indent = re.match(r"\{\r?\n([ \t]+)\S", old)
    step: int | str = 2
    if indent:
        step = len(indent.group(1)) if "\t" not in indent.group(1) else indent.group(1)
    end = "\n" if not old or old.endswith("\n") else ""
    return json.dumps(data, indent=step, ensure_ascii=False) + end


JSON = Format(_load_json, _dump_json, lambda data, _path: data)


def read_json(path: Path) -> dict[str, Any]:
    try:
        return _load_json(path)
    except InvalidInput:
        return {}


def mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def edit(
    path: Path,
    form: Format,
    change: Callable[[Any], str],
    remove_ours: Callable[[Any], object],
) -> ConfigChange:
    """Apply ``change`` to the parsed file; write it only if it changed.

    ``change`` returns what it did: "added", "updated", "removed" or "unchanged".
    ``remove_ours`` takes every entry of ours out of a parsed copy: a file that
    holds nothing else was made by install, so it is never backed up as if it
    were the user's, and it is deleted when the last of ours goes.
    """
    real = Path(os.path.realpath(path))  # a symlinked dotfile: edit the file it points to
    data = form.load(real)
    existed = real.exists()
    old = real.read_text(encoding="utf-8") if existed else ""
    before = copy.deepcopy(data)
    outcome = change(data)
    after = form.dump(data, old)
    if outcome == "unchanged" or (existed and after == old):
        return ConfigChange(path, "unchanged" if existed else "absent", "")
    backup = real.with_name(real.name + ".memory-mcp.bak")
    if outcome == "removed":
        last = _without_ours(data, form, remove_ours, old) == after  # none of ours is left
        return _remove(path, real, backup, form, data, after, last=last)
    if existed and not backup.exists() and not _only_ours(before, form, remove_ours):
        shutil.copy2(real, backup)  # the original, kept until uninstall gives it back
    real.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(real, after.encode("utf-8"))
    made = outcome if outcome in ("added", "updated") else "added"
    return ConfigChange(path, made, "", backup if backup.exists() else None)  # type: ignore[arg-type]


def _without_ours(data: Any, form: Format, remove_ours: Callable[[Any], object], old: str) -> str:
    """``data`` as text without any entry of ours (``data`` itself is left as it is)."""
    stripped = copy.deepcopy(data)
    remove_ours(stripped)
    return form.dump(stripped, old)


def _only_ours(data: Any, form: Format, remove_ours: Callable[[Any], object]) -> bool:
    """Whether ``data`` holds entries of ours and nothing else (an empty file is the user's)."""
    left = _without_ours(data, form, remove_ours, "")
    return left != form.dump(data, "") and left.strip() in ("", "{}")


def _remove(
    path: Path, real: Path, backup: Path, form: Format, data: Any, after: str, *, last: bool
) -> ConfigChange:
    """Write ``after`` (the file without an entry of ours), as close to the original as can be.

    Once the last entry of ours is out, the backup has served: it goes, unless the
    file's original bytes cannot be given back (something else changed since
    install, which stays), and even then, since every entry of ours is gone.
    """
    if backup.exists():
        original = form.load(backup)
        if form.parsed(original, backup) == form.parsed(data, real):
            atomic_write(real, backup.read_bytes())  # nothing else changed: the original bytes
            backup.unlink()
            return ConfigChange(path, "removed", "", note="restored byte for byte")
        atomic_write(real, after.encode("utf-8"))
        if last:
            backup.unlink()
            return ConfigChange(path, "removed", "", note="other changes made since install stay")
        return ConfigChange(path, "removed", "", backup)
    if after.strip() in ("", "{}"):  # install created it, and it holds nothing else
        real.unlink()
        if real.parent.name in (".claude", ".codex", ".gemini") and not any(real.parent.iterdir()):
            real.parent.rmdir()  # the folder it created for it, too
        return ConfigChange(path, "removed", "", note="file removed")
    atomic_write(real, after.encode("utf-8"))
    return ConfigChange(path, "removed", "")


def with_what(change: ConfigChange, what: str) -> ConfigChange:
    return ConfigChange(change.path, change.outcome, what, change.backup, change.note)
