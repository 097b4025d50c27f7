"""Cutting a document into chunks for the ``knowledge`` corpus (``ingest``).

Markdown splits at ATX headings (``#`` to ``######``, never inside a
fenced code block); a section longer than ``CHUNK_CHARS`` is split at blank
lines (a fenced block stays whole when it fits), and a paragraph still too long
at line ends, then at spaces. Other text files split into paragraphs the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CHUNK_CHARS = 1_500
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")


@dataclass(frozen=True)
class Chunk:
    """One piece of a document: its heading trail and its text."""

    heading: str
    text: str


def chunk_markdown(text: str, size: int = CHUNK_CHARS) -> list[Chunk]:
    """Cut Markdown into sections at ATX headings, then into pieces of at most ``size``.

    Each section keeps its heading line; its heading trail is the titles of the
    enclosing headings joined by `` > `` ("" before the first heading). Lines
    inside fenced code blocks are never headings. A section with nothing but
    its heading is dropped. A section longer than ``size`` is split at blank
    lines, each piece starting with the section's heading line again.

    Args:
        text: the document.
        size: the most characters a chunk may hold.
    """
    chunks: list[Chunk] = []
    for trail, heading_line, lines in _sections(_lines(text)):
        body = lines[1:] if heading_line else lines
        if not any(line.strip() for line in body):
            continue
        whole = "\n".join(lines).strip()
        if len(whole) <= size:
            chunks.append(Chunk(trail, whole))
            continue
        prefix = heading_line.strip() if len(heading_line.strip()) <= size // 4 else ""
        budget = size - len(prefix) - 2 if prefix else size
        for piece in _pack(_blocks(body, fences=True), budget):
            chunks.append(Chunk(trail, f"{prefix}\n\n{piece}" if prefix else piece))
    return chunks


def chunk_text(text: str, size: int = CHUNK_CHARS) -> list[Chunk]:
    """Cut plain text into paragraphs packed into pieces of at most ``size`` characters.

    Args:
        text: the document.
        size: the most characters a chunk may hold.
    """
    return [Chunk("", piece) for piece in _pack(_blocks(_lines(text), fences=False), size)]


def _lines(text: str) -> list[str]:
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _fence_open(line: str) -> tuple[str, int] | None:
    """The fence character and length when ``line`` opens a fenced code block."""
    match = _FENCE.match(line)
    if match is None:
        return None
    marker, info = match.group(1), match.group(2)
    if marker[0] == "`" and "`" in info:
        return None  # inline code spans, not a fence
    return marker[0], len(marker)


def _fence_closes(line: str, fence: tuple[str, int]) -> bool:
    match = _FENCE.match(line)
    if match is None:
        return False
    marker, rest = match.group(1), match.group(2)
    return marker[0] == fence[0] and len(marker) >= fence[1] and not rest.strip()


def _sections(lines: list[str]) -> list[tuple[str, str, list[str]]]:
    """(heading trail, heading line or "", lines including the heading line) per section."""
    sections: list[tuple[str, str, list[str]]] = []
    stack: list[tuple[int, str]] = []
    trail, heading_line = "", ""
    current: list[str] = []
    fence: tuple[str, int] | None = None
    for line in lines:
        if fence is not None:
            if _fence_closes(line, fence):
                fence = None
        elif (opened := _fence_open(line)) is not None:
            fence = opened
        elif (heading := _ATX.match(line)) is not None:
            sections.append((trail, heading_line, current))
            level, title = len(heading.group(1)), (heading.group(2) or "").strip()
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, title))
            trail = " > ".join(t for _, t in stack if t)
            heading_line, current = line, [line]
            continue
        current.append(line)
    sections.append((trail, heading_line, current))
    return sections


def _blocks(lines: list[str], *, fences: bool) -> list[str]:
    """Paragraphs: runs of lines between blank lines (blank lines inside a fence do not count)."""
    blocks: list[str] = []
    current: list[str] = []
    fence: tuple[str, int] | None = None
    for line in lines:
        if fence is not None:
            current.append(line)
            if _fence_closes(line, fence):
                fence = None
            continue
        if fences and (opened := _fence_open(line)) is not None:
            fence = opened
        if not line.strip() and fence is None:
            if current:
                blocks.append("\n".join(current).strip("\n"))
            current = []
            continue
        current.append(line)
    if current:
        blocks.append("\n".join(current).strip("\n"))
    return [b for b in blocks if b.strip()]


def _pack(blocks: list[str], size: int) -> list[str]:
    """Join blocks with blank lines into pieces of at most ``size``; hard-split longer blocks."""
    parts = [p for b in blocks for p in ([b] if len(b) <= size else _hard_split(b, size))]
    return [p.strip() for p in _greedy(parts, size, "\n\n") if p.strip()]


def _hard_split(block: str, size: int) -> list[str]:
    """Split a block at line ends, and a line longer than ``size`` at spaces (else anywhere)."""
    segments = [s for line in block.split("\n") for s in _split_line(line, size)]
    return _greedy(segments, size, "\n")


def _greedy(parts: list[str], size: int, separator: str) -> list[str]:
    """Join consecutive parts with ``separator`` while the joined piece fits in ``size``."""
    pieces: list[str] = []
    current = ""
    for part in parts:
        joined = f"{current}{separator}{part}" if current else part
        if len(joined) <= size:
            current = joined
            continue
        if current:
            pieces.append(current)
        current = part
    if current:
        pieces.append(current)
    return pieces


def _split_line(line: str, size: int) -> list[str]:
    segments: list[str] = []
    while len(line) > size:
        cut = line.rfind(" ", 0, size + 1)
        if cut <= size // 2:
            cut = size
        segments.append(line[:cut].rstrip())
        line = line[cut:].lstrip()
    segments.append(line)
    return segments
