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
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from memory_mcp.blocks import Block, PromptText, find_block, lead_for, render_block
from memory_mcp.errors import InvalidInput
from memory_mcp.files import atomic_write

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


def set_block(root: Path, path: Path, content: str) -> FileChange:
    """Put ``content`` in the managed block of ``path`` (empty content: no block)."""
    real = _inside(root, path)
    current = PromptText.read(real)
    if current is None:
        if not content.strip():
            return FileChange(path, "absent")
        text = PromptText("", bom=False, newline="\n")
        text.body = render_block(content, "\n", 0, created=True)
        real.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(real, text.encode())
        return FileChange(path, "created")
    block = find_block(current, path)
    body = current.body
    if not content.strip():
        if block is None:
            return FileChange(path, "absent")
        return _remove(path, real, current, block)
    nl = current.newline
    content = content.replace("\r\n", "\n")
    if block is None:
        new_body = body + render_block(content, nl, lead_for(body, nl), created=False)
    else:
        rendered = render_block(content, nl, block.lead, block.created)
        new_body = body[: block.start] + rendered + body[block.end :]
    if new_body == body:
        return FileChange(path, "unchanged")
    updated = PromptText(new_body, current.bom, nl)
    atomic_write(real, updated.encode())
    return FileChange(path, "updated")


def remove_block(root: Path, path: Path) -> FileChange:
    """Take the managed block out of ``path``, restoring it as it was before ``inject``."""
    real = _inside(root, path)
    current = PromptText.read(real)
    if current is None:
        return FileChange(path, "absent")
    block = find_block(current, path)
    if block is None:
        return FileChange(path, "absent")
    return _remove(path, real, current, block)


def _remove(path: Path, real: Path, current: PromptText, block: Block) -> FileChange:
    before, after = current.body[: block.start], current.body[block.end :]
    if after and before and not before.endswith(("\n", "\r")):
        before += current.newline  # text follows the block: keep the lines apart
    rest = before + after
    if block.created and not rest and not current.bom:
        real.unlink()
        return FileChange(path, "removed", "created by inject")
    atomic_write(real, PromptText(rest, current.bom, current.newline).encode())
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


def injected(root: Path, agent: Agent) -> bool:
    """Whether ``agent``'s prompt file at ``root`` holds a brief ``inject`` (or ``run``) put there.

    The CLI reads that file at start, so a SessionStart hook must not give the
    brief a second time.
    """
    return _has_block(prompt_file(root, agent))


def _has_block(path: Path) -> bool:
    """Whether ``path`` holds a managed block (by the same whole-line rule as ``find_block``)."""
    try:
        text = PromptText.read(path)
    except (OSError, InvalidInput):
        return False
    return text is not None and find_block(text, path, strict=False) is not None
