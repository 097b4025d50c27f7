"""The managed block: the part of a prompt file (CLAUDE.md, AGENTS.md, GEMINI.md)
that memory-mcp writes between a begin and an end marker line.

The format is shared by the agent integration, which writes the block
(``agents.inject``), and by ingest, which reads prompt files without it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from memory_mcp.errors import InvalidInput

END = "<!-- memory-mcp:end -->"
_BEGIN = re.compile(r"<!-- memory-mcp:begin lead=(\d) created=([01]) [^>]*-->")
_NOTE = "managed by memory-mcp inject; edits inside are replaced"
_BOM = "\ufeff"


@dataclass
class PromptText:
    """A prompt file's text, and how to write it back the same way."""

    body: str  # without BOM, line endings as in the file
    bom: bool
    newline: str

    @classmethod
    def read(cls, path: Path) -> PromptText | None:
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
    def parse(cls, text: str) -> PromptText:
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
class Block:
    start: int  # where the lead line breaks begin
    end: int  # after the end marker and its line break
    lead: int
    created: bool


def find_block(text: PromptText, path: Path, *, strict: bool = True) -> Block | None:
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
            return Block(start - lead * len(nl), end, lead, match.group(2) == "1")
        offset += len(line)
    if begin is not None and strict:
        raise InvalidInput(
            f"{path} has a memory-mcp begin marker without its end marker; fix or remove the "
            "block by hand, then inject again"
        )
    return None


def render_block(content: str, newline: str, lead: int, created: bool) -> str:
    lines = [f"<!-- memory-mcp:begin lead={lead} created={int(created)} {_NOTE} -->"]
    for line in content.rstrip("\n").split("\n"):
        # A line of the content that reads like a marker must not end the block early.
        lines.append(" " + line if line.lstrip().startswith("<!-- memory-mcp:") else line)
    lines.append(END)
    return newline * lead + newline.join(lines) + newline


def lead_for(body: str, newline: str) -> int:
    """Line breaks to put before an appended block: end the user's line, then one blank."""
    if not body:
        return 0
    return 1 if body.endswith(newline) else 2


def without_blocks(text: str) -> str:
    """``text`` with every managed block taken out (what ingest may read of a prompt file).

    A begin marker without its end is left as text: ingest reads any document.
    """
    doc = PromptText.parse(text)
    while (block := find_block(doc, Path("prompt file"), strict=False)) is not None:
        doc.body = doc.body[: block.start] + doc.body[block.end :]
    return doc.body
