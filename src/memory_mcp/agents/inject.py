"""Injection: the spawn brief in each CLI's prompt file, in a managed block.

Claude Code reads ``CLAUDE.md``, Codex ``AGENTS.md`` and Gemini CLI ``GEMINI.md``
at the project root when a session starts. ``inject`` writes the brief there
between two marker comments; everything outside the block is the user's and is
never changed:

- the file's encoding (UTF-8, with or without BOM), line endings (LF or CRLF)
  and trailing newline are kept; a file that is not UTF-8 is refused;
- the block is appended after the user's text; the begin marker records how
  many line breaks were added before it (``lead``) and whether ``inject``
  created the file, so ``uninject`` restores the file byte for byte (and
  deletes a file it created, unless someone has written in it since);
- nothing is written when the result would be the same (no mtime change, no
  git churn): the injected brief shows dates, not "3d ago", so it only changes
  when the memory does;
- writes are atomic (a temporary file in the same directory, then rename) and
  never leave the project root: a prompt file that is a symlink to somewhere
  outside is refused;
- an empty brief adds no block (and removes an old one).

With ``imports=True`` the brief goes to ``.memory-mcp/brief.md`` (ignored by
git through its own ``.gitignore``) and the block holds only an import of it,
for the CLIs whose prompt files support imports: Claude Code (``@path``) and
Gemini CLI (``@./path``). Codex's AGENTS.md has no import syntax, so Codex
always gets the brief itself. Codex reads ``~/.codex/AGENTS.md`` as well as the
repository's; only the repository's file is written, so the brief appears once.
When the repository has an ``AGENTS.override.md`` at its root, Codex reads that
instead of ``AGENTS.md``, and so does ``inject``.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from memory_mcp.errors import InvalidInput

Agent = Literal["claude", "codex", "gemini"]
AGENTS: tuple[Agent, ...] = ("claude", "codex", "gemini")
PROMPT_FILES: dict[Agent, str] = {
    "claude": "CLAUDE.md",
    "codex": "AGENTS.md",
    "gemini": "GEMINI.md",
}
IMPORT_LINES: dict[Agent, str | None] = {
    "claude": "@.memory-mcp/brief.md",
    "codex": None,  # AGENTS.md has no imports
    "gemini": "@./.memory-mcp/brief.md",
}
BRIEF_DIR = ".memory-mcp"
BRIEF_FILE = "brief.md"
END = "<!-- memory-mcp:end -->"
_BEGIN = re.compile(r"<!-- memory-mcp:begin lead=(\d) created=([01]) [^>]*-->")
_NOTE = "managed by memory-mcp inject; edits inside are replaced"
_BOM = "\ufeff"
CODEX_DOC_LIMIT = 32 * 1024  # Codex's project_doc_max_bytes default

Outcome = Literal["created", "updated", "unchanged", "removed", "absent"]


@dataclass(frozen=True)
class FileChange:
    """What happened to one file."""

    path: Path
    outcome: Outcome
    note: str = ""


def prompt_file(root: Path, agent: Agent) -> Path:
    """The prompt file ``agent`` reads at the project root."""
    if agent == "codex" and (root / "AGENTS.override.md").exists():
        return root / "AGENTS.override.md"
    return root / PROMPT_FILES[agent]


def _inside(root: Path, path: Path) -> Path:
    """The real path of ``path``, which must stay inside ``root`` (symlinks resolved)."""
    real_root = Path(os.path.realpath(root))
    real = Path(os.path.realpath(path))
    if real != real_root and real_root not in real.parents:
        raise InvalidInput(
            f"{path} resolves to {real}, outside the project root {real_root}; memory-mcp never "
            "writes outside the project (remove the symlink or inject elsewhere)"
        )
    return real


@dataclass
class _Text:
    """A prompt file's text, and how to write it back the same way."""

    body: str  # without BOM, line endings as in the file
    bom: bool
    newline: str

    @classmethod
    def read(cls, path: Path) -> _Text | None:
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput(
                f"{path} is not UTF-8 text; memory-mcp edits UTF-8 prompt files only"
            ) from None
        return cls.parse(text)

    @classmethod
    def parse(cls, text: str) -> _Text:
        """A decoded file's text: its BOM set aside, its line ending noted."""
        bom = text.startswith(_BOM)
        body = text[1:] if bom else text
        return cls(body, bom, _newline_of(body))

    def encode(self) -> bytes:
        return ((_BOM if self.bom else "") + self.body).encode("utf-8")


def _newline_of(text: str) -> str:
    """The file's line ending: CRLF if it has any, else CR if it only has those, else LF."""
    if "\r\n" in text:
        return "\r\n"
    if "\r" in text and "\n" not in text:
        return "\r"
    return "\n"


@dataclass(frozen=True)
class _Block:
    start: int  # where the lead line breaks begin
    end: int  # after the end marker and its line break
    lead: int
    created: bool


def _find(text: _Text, path: Path, *, strict: bool = True) -> _Block | None:
    """The managed block: a begin marker line, then the first end marker line after it.

    Markers count only as whole lines, so a memory or a user's sentence that
    quotes one is never taken for the block's edge.

    Raises:
        InvalidInput: a begin marker line without an end marker line (``strict``).
    """
    body, nl = text.body, text.newline
    offset = 0
    begin: tuple[int, re.Match[str]] | None = None
    for line in body.splitlines(keepends=True):
        bare = line.rstrip("\r\n")
        if begin is None:
            match = _BEGIN.fullmatch(bare)
            if match is not None:
                begin = (offset, match)
        elif bare == END:
            start, match = begin
            end = offset + len(line)
            lead = int(match.group(1))
            if start - lead * len(nl) < 0 or body[start - lead * len(nl) : start] != nl * lead:
                lead = 0  # the user removed the line breaks inject put there
            return _Block(start - lead * len(nl), end, lead, match.group(2) == "1")
        offset += len(line)
    if begin is not None and strict:
        raise InvalidInput(
            f"{path} has a memory-mcp begin marker without its end marker; fix or remove the "
            "block by hand, then inject again"
        )
    return None


def _render(content: str, newline: str, lead: int, created: bool) -> str:
    lines = [f"<!-- memory-mcp:begin lead={lead} created={int(created)} {_NOTE} -->"]
    for line in content.rstrip("\n").split("\n"):
        # A line of the content that reads like a marker must not end the block early.
        lines.append(" " + line if line.lstrip().startswith("<!-- memory-mcp:") else line)
    lines.append(END)
    return newline * lead + newline.join(lines) + newline


def _lead_for(body: str, newline: str) -> int:
    """Line breaks to put before an appended block: end the user's line, then one blank."""
    if not body:
        return 0
    return 1 if body.endswith(newline) else 2


def atomic_write(path: Path, data: bytes) -> None:
    """Atomically replace ``path`` with ``data`` (keeping its permissions)."""
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


def set_block(root: Path, path: Path, content: str) -> FileChange:
    """Put ``content`` in the managed block of ``path`` (empty content: no block)."""
    real = _inside(root, path)
    current = _Text.read(real)
    if current is None:
        if not content.strip():
            return FileChange(path, "absent")
        text = _Text("", bom=False, newline="\n")
        text.body = _render(content, "\n", 0, created=True)
        real.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(real, text.encode())
        return FileChange(path, "created")
    block = _find(current, path)
    body = current.body
    if not content.strip():
        if block is None:
            return FileChange(path, "absent")
        return _remove(path, real, current, block)
    nl = current.newline
    content = content.replace("\r\n", "\n")
    if block is None:
        new_body = body + _render(content, nl, _lead_for(body, nl), created=False)
    else:
        rendered = _render(content, nl, block.lead, block.created)
        new_body = body[: block.start] + rendered + body[block.end :]
    if new_body == body:
        return FileChange(path, "unchanged")
    updated = _Text(new_body, current.bom, nl)
    atomic_write(real, updated.encode())
    return FileChange(path, "updated")


def remove_block(root: Path, path: Path) -> FileChange:
    """Take the managed block out of ``path``, restoring it as it was before ``inject``."""
    real = _inside(root, path)
    current = _Text.read(real)
    if current is None:
        return FileChange(path, "absent")
    block = _find(current, path)
    if block is None:
        return FileChange(path, "absent")
    return _remove(path, real, current, block)


def _remove(path: Path, real: Path, current: _Text, block: _Block) -> FileChange:
    before, after = current.body[: block.start], current.body[block.end :]
    if after and before and not before.endswith(("\n", "\r")):
        before += current.newline  # text follows the block: keep the lines apart
    rest = before + after
    if block.created and not rest and not current.bom:
        real.unlink()
        return FileChange(path, "removed", "created by inject")
    atomic_write(real, _Text(rest, current.bom, current.newline).encode())
    return FileChange(path, "updated", "block removed")


def write_brief_file(root: Path, text: str) -> FileChange:
    """The git-ignored ``.memory-mcp/brief.md`` that prompt files import."""
    folder = root / BRIEF_DIR
    _own_brief_paths(root)
    ignore = folder / ".gitignore"
    target = folder / BRIEF_FILE
    if not text.strip():
        return remove_brief_file(root)
    folder.mkdir(exist_ok=True)
    if not ignore.exists():
        atomic_write(_inside(root, ignore), b"# Written by memory-mcp inject; not for git.\n*\n")
    real = _inside(root, target)
    data = text.encode("utf-8")
    if real.exists() and real.read_bytes() == data:
        return FileChange(target, "unchanged")
    existed = real.exists()
    atomic_write(real, data)
    return FileChange(target, "updated" if existed else "created")


def _own_brief_paths(root: Path) -> None:
    """The brief folder and file must be memory-mcp's own, not links to the user's files."""
    for path in (root / BRIEF_DIR, root / BRIEF_DIR / BRIEF_FILE, root / BRIEF_DIR / ".gitignore"):
        if path.is_symlink():
            raise InvalidInput(
                f"{path} is a symlink; memory-mcp only writes its own brief file there "
                "(remove the link, or inject without --import)"
            )


def remove_brief_file(root: Path) -> FileChange:
    _own_brief_paths(root)
    folder = root / BRIEF_DIR
    target = folder / BRIEF_FILE
    if not target.exists():
        return FileChange(target, "absent")
    _inside(root, target).unlink()
    ignore = folder / ".gitignore"
    if ignore.exists() and sorted(p.name for p in folder.iterdir()) == [".gitignore"]:
        ignore.unlink()
        folder.rmdir()
    return FileChange(target, "removed")


def inject(
    root: Path, brief_text: str, agents: tuple[Agent, ...] = AGENTS, *, imports: bool = False
) -> list[FileChange]:
    """Write ``brief_text`` where each agent reads it at start; returns what changed.

    Prompt files that are one file (symlinks to each other) are written once; if
    any of their readers cannot import (Codex), that file gets the brief itself.

    Raises:
        InvalidInput: a prompt file outside the root (symlink), not UTF-8, or with a
            broken block.
    """
    readers: dict[Path, list[Agent]] = {}
    for agent in agents:  # check every target before writing any
        readers.setdefault(_inside(root, prompt_file(root, agent)), []).append(agent)
    changes: list[FileChange] = []
    lines = {real: {IMPORT_LINES[a] for a in group} for real, group in readers.items()}
    importing = {
        real for real, found in lines.items() if imports and len(found) == 1 and None not in found
    }
    if importing:  # an empty brief removes the file
        gone_or_written = write_brief_file(root, brief_text)
        if gone_or_written.outcome != "absent":
            changes.append(gone_or_written)
    for real, group in readers.items():
        content = brief_text
        if real in importing and brief_text.strip():
            content = next(iter(lines[real])) or brief_text
        change = set_block(root, prompt_file(root, group[0]), content)
        if "codex" in group and change.outcome in ("created", "updated"):
            size = real.stat().st_size
            if size > CODEX_DOC_LIMIT:
                change = FileChange(
                    change.path,
                    change.outcome,
                    f"{size:,} bytes: Codex reads only the first 32 KiB of AGENTS.md files",
                )
        changes.append(change)
        changes.extend(
            FileChange(prompt_file(root, other), change.outcome, f"same file as {change.path.name}")
            for other in group[1:]
        )
    return changes


def uninject(root: Path, agents: tuple[Agent, ...] = AGENTS) -> list[FileChange]:
    """Remove every managed block (and the brief file) ``inject`` wrote."""
    paths = [prompt_file(root, agent) for agent in agents]
    if "codex" in agents:  # the block may be in either, if the override came later
        paths += [p for p in (root / "AGENTS.md", root / "AGENTS.override.md") if p not in paths]
    changes = [
        change
        for path in paths
        if (change := remove_block(root, path)).outcome != "absent" or path in paths[: len(agents)]
    ]
    if not any(_has_block(prompt_file(root, a)) for a in AGENTS if IMPORT_LINES[a]):
        gone = remove_brief_file(root)  # nothing imports it any more
        if gone.outcome != "absent":
            changes.append(gone)
    return changes


def without_blocks(text: str) -> str:
    """``text`` with every managed block taken out (what ingest may read of a prompt file).

    A begin marker without its end is left as text: ingest reads any document.
    """
    doc = _Text.parse(text)
    while (block := _find(doc, Path("prompt file"), strict=False)) is not None:
        doc.body = doc.body[: block.start] + doc.body[block.end :]
    return doc.body


def injected(root: Path, agent: Agent) -> bool:
    """Whether ``agent``'s prompt file at ``root`` holds a brief ``inject`` (or ``run``) put there.

    The CLI reads that file at start, so a SessionStart hook must not give the
    brief a second time.
    """
    return _has_block(prompt_file(root, agent))


def _has_block(path: Path) -> bool:
    """Whether ``path`` holds a managed block (by the same whole-line rule as ``_find``)."""
    try:
        text = _Text.read(path)
    except (OSError, InvalidInput):
        return False
    return text is not None and _find(text, path, strict=False) is not None
