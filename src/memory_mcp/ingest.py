"""Index the project's own documents into the ``knowledge`` corpus.

``ingest`` finds the project's documents (``README*``, ``docs/**/*.md`` and the
agents' instruction files, or the files and directories given), cuts each into
heading-aware chunks and stores them as ``chunk`` records of the project scope:

    async with MemoryService.open(settings) as memory:
        summary = await memory.ingest(project_root(cwd))

Only what changed is re-chunked. Every chunk carries the sha256 of its file's
text (without any block ``inject`` wrote, which is never ingested) in
``meta["file_hash"]``; a file whose hash matches its chunks is not touched. A
changed file is one write transaction: its old chunks are archived and the new
ones inserted together, so an interrupted run never leaves a file half-indexed
and the next run simply continues. Chunks go through ``write.prepare`` like any
write (cleaned, secrets redacted) but not through the fold decision: a chunk is
a copy of its file, replaced when the file changes.

Documents are cut into chunks by ``chunking``.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import anyio

from memory_mcp.blocks import without_blocks
from memory_mcp.chunking import CHUNK_CHARS, Chunk, chunk_markdown, chunk_text
from memory_mcp.engine import Engine
from memory_mcp.errors import InvalidInput, NotFound
from memory_mcp.records import Record, format_time
from memory_mcp.scope import Scope
from memory_mcp.secret_scan import redact
from memory_mcp.storage.base import Filters, Vector
from memory_mcp.write import Draft, clean_text, prepare

DEFAULT_PATTERNS: tuple[str, ...] = (
    "README*",
    "docs/**/*.md",
    "CLAUDE.md",
    "AGENTS.md",
    "GEMINI.md",
)
MAX_FILE_BYTES = 2 * 1024 * 1024
TEXT_SUFFIXES: frozenset[str] = frozenset({".md", ".markdown", ".rst", ".txt"})
MARKDOWN_SUFFIXES: frozenset[str] = frozenset({".md", ".markdown"})
SKIP_DIRS: frozenset[str] = frozenset({"node_modules", "__pycache__"})
CHANGED_REASON = "re-chunked: file changed"
REMOVED_REASON = "source file removed"
# Stored paths of files from outside the project: the agents' own memory folders.
AGENT_MEMORY_PREFIX = "agent-memory:"
_PAGE = 1_000


@dataclass
class IngestSummary:
    """What an ``ingest`` run did.

    ``embedded`` is True when at least one chunk was added and every chunk
    added got vectors (False on the lexical floor: ``reembed`` adds them later).
    """

    files: int = 0
    changed: int = 0
    unchanged: int = 0
    removed: int = 0
    chunks_added: int = 0
    chunks_archived: int = 0
    embedded: bool = False
    skipped: list[str] = field(default_factory=list)


# Finding files -----------------------------------------------------------------------


@dataclass
class _Found:
    """The files to ingest (relative POSIX path -> real path) and what discovery skipped."""

    root: Path  # the real project root
    files: dict[str, Path] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    directories: list[str] = field(default_factory=list)  # explicit ones, relative ("" = root)


def _hidden(name: str) -> bool:
    return name.startswith(".") or name in SKIP_DIRS


def _inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def _display(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


def _discover(project: Path, paths: Sequence[Path]) -> _Found:
    """Resolve what to ingest under the project root.

    Raises:
        InvalidInput: ``project`` is not a directory, or an explicit path resolves
            outside it or is neither a file nor a directory.
        NotFound: an explicit path does not exist.
    """
    root = Path(os.path.realpath(project))
    if not root.is_dir():
        raise InvalidInput(f"project root {str(project)!r} is not a directory")
    found = _Found(root)
    targets: list[tuple[Path, Path]] = []
    for given in paths:
        candidate = given if given.is_absolute() else root / given
        real = Path(os.path.realpath(candidate))
        if not _inside(real, root):
            raise InvalidInput(
                f"{str(given)!r} resolves to {str(real)!r}, outside the project root "
                f"{str(root)!r}; ingest only reads the project's own files"
            )
        if not real.exists():
            raise NotFound(f"{str(given)!r} does not exist (under {str(root)!r})")
        if not (real.is_dir() or real.is_file()):
            raise InvalidInput(f"{str(given)!r} is neither a file nor a directory")
        targets.append((candidate, real))

    if not paths:
        for pattern in DEFAULT_PATTERNS:
            for match in sorted(root.glob(pattern)):
                relative = match.relative_to(root)
                if any(_hidden(part) for part in relative.parts[:-1]) or not match.is_file():
                    continue
                _add(found, match, root)
        return found

    for candidate, real in targets:
        if real.is_file():
            _add(found, candidate, root)
            continue
        found.directories.append("" if real == root else real.relative_to(root).as_posix())
        for directory, subdirs, names in os.walk(real):
            subdirs[:] = sorted(d for d in subdirs if not _hidden(d))
            for name in sorted(names):
                if not name.startswith(".") and Path(name).suffix.lower() in TEXT_SUFFIXES:
                    _add(found, Path(directory) / name, root)
    return found


def _add(found: _Found, path: Path, root: Path) -> None:
    """Add one discovered file, keyed by its real path relative to ``root``."""
    real = Path(os.path.realpath(path))
    if not _inside(real, root):
        found.skipped.append(f"{_display(path, root)}: resolves outside the project root")
    elif real.is_file():
        found.files.setdefault(real.relative_to(root).as_posix(), real)


def _read(path: Path) -> bytes | str:
    """The file's bytes, or why it is skipped."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            return f"larger than 2 MB ({size:,} bytes)"
        data = path.read_bytes()
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if len(data) > MAX_FILE_BYTES:
        return f"larger than 2 MB ({len(data):,} bytes)"
    return data


# Stored chunks -----------------------------------------------------------------------


class _Reader(Protocol):
    async def current(self, filters: Filters, limit: int) -> list[Record]: ...


async def _stored_chunks(reader: _Reader, scope: Scope) -> dict[str, list[Record]]:
    """The current knowledge chunks of a scope (its aliases too), grouped by file path."""
    filters = Filters(scope_keys=scope.keys, corpora=("knowledge",), kinds=("chunk",))
    limit = _PAGE
    records = await reader.current(filters, limit)
    while len(records) >= limit:
        limit *= 4
        records = await reader.current(filters, limit)
    grouped: dict[str, list[Record]] = {}
    for record in records:
        path = record.meta.get("path")
        if isinstance(path, str):
            grouped.setdefault(path, []).append(record)
    return grouped


def _same_file(chunks: Sequence[Record], digest: str) -> bool:
    return bool(chunks) and all(r.meta.get("file_hash") == digest for r in chunks)


# Ingest ------------------------------------------------------------------------------


async def ingest(
    engine: Engine,
    root: Path,
    paths: Sequence[Path] = (),
    *,
    agent: str = "cli",
    progress: Callable[[int, int], None] | None = None,
) -> IngestSummary:
    """Index the project's documents as ``chunk`` records of the project scope.

    With no ``paths``, the files matching ``DEFAULT_PATTERNS`` under ``root`` are
    ingested, and chunks of files that are gone or no longer match are archived.
    An explicit directory means every ``*.md``, ``*.markdown``, ``*.rst`` and
    ``*.txt`` under it (hidden directories and ``node_modules`` skipped); then
    only chunks of files under the given directories that no longer exist are
    archived. Each file commits on its own: archiving its old chunks and
    inserting its new ones is one transaction.

    Args:
        engine: the open engine.
        root: the project root, already resolved (the scope key is its identity's).
        paths: files or directories, absolute or relative to ``root``.
        agent: recorded as the chunks' author.
        progress: called after each file with (files done, files in all).

    Raises:
        InvalidInput: a path resolves (symlinks included) outside ``root``, or
            ``root`` is not a directory; nothing was written.
        NotFound: an explicit path does not exist; nothing was written.
    """
    scope = (await engine.project(root)).scope
    found = await anyio.to_thread.run_sync(_discover, root, tuple(paths))
    stored = await _stored_chunks(engine.store, scope)
    summary = IngestSummary(files=len(found.files), skipped=list(found.skipped))
    gone = await anyio.to_thread.run_sync(_gone, found, list(stored), bool(paths))
    return await _ingest_files(engine, scope, found.files, stored, gone, summary, agent, progress)


async def _ingest_files(
    engine: Engine,
    scope: Scope,
    files: dict[str, Path],
    stored: dict[str, list[Record]],
    gone: list[str],
    summary: IngestSummary,
    agent: str,
    progress: Callable[[int, int], None] | None,
) -> IngestSummary:
    """Ingest ``files`` (stored path -> file), then archive the chunks of ``gone`` paths."""
    size = min(CHUNK_CHARS, max(100, engine.settings.write.max_chars // 2))
    all_embedded = True
    for done, (rel, real) in enumerate(files.items(), start=1):
        outcome = await _ingest_file(engine, scope, rel, real, stored.get(rel, []), size, agent)
        summary.chunks_archived += outcome.archived
        summary.chunks_added += outcome.added
        if outcome.skipped is not None:
            summary.skipped.append(f"{rel}: {outcome.skipped}")
            summary.removed += outcome.archived > 0
        elif outcome.written:
            summary.changed += 1
            all_embedded = all_embedded and outcome.embedded
        else:
            summary.unchanged += 1
        if progress is not None:
            progress(done, summary.files)
    if gone:
        removed_files, archived = await _archive_paths(engine, scope, gone, REMOVED_REASON)
        summary.removed += removed_files
        summary.chunks_archived += archived
    summary.embedded = summary.chunks_added > 0 and all_embedded
    return summary


def claude_memory_folder(root: Path, home: Path | None = None) -> Path:
    """Claude Code's own memory folder for a project: ~/.claude/projects/<path>/memory.

    Claude Code names the folder after the project's path with every character
    that is not a letter or digit replaced by ``-``.
    """
    name = re.sub(r"[^A-Za-z0-9]", "-", str(root))
    return (home or Path.home()) / ".claude" / "projects" / name / "memory"


async def ingest_agent_memories(
    engine: Engine,
    root: Path,
    *,
    folder: Path | None = None,
    home: Path | None = None,
    agent: str = "claude",
    progress: Callable[[int, int], None] | None = None,
) -> IngestSummary:
    """Import Claude Code's own memory files for this project as knowledge chunks.

    The ``*.md`` files of ``folder`` (default ``claude_memory_folder``) are
    chunked like any document and stored under ``agent-memory:claude/<name>``,
    so they are searched with the project's knowledge and appear once however
    often this runs (a file is re-chunked only when its content changes; chunks
    of files gone from the folder are archived). The user-written parts of
    CLAUDE.md / AGENTS.md / GEMINI.md come in through ``ingest`` itself, without
    the block ``inject`` writes.
    """
    scope = (await engine.project(root)).scope
    folder = folder or claude_memory_folder(root, home)
    prefix = f"{AGENT_MEMORY_PREFIX}claude/"
    files: dict[str, Path] = {}
    if folder.is_dir():
        for path in sorted(folder.rglob("*.md")):
            if path.is_file() and not any(_hidden(part) for part in path.relative_to(folder).parts):
                files[prefix + path.relative_to(folder).as_posix()] = path
    stored = await _stored_chunks(engine.store, scope)
    gone = [rel for rel in stored if rel.startswith(prefix) and rel not in files]
    summary = IngestSummary(files=len(files))
    return await _ingest_files(engine, scope, files, stored, gone, summary, agent, progress)


def _gone(found: _Found, stored: Sequence[str], explicit: bool) -> list[str]:
    """Stored paths whose chunks are archived as removed.

    With the default patterns, every stored path not found now; with explicit
    paths, those under the given directories whose file no longer exists.
    """
    return [
        rel
        for rel in stored
        if rel not in found.files
        and not rel.startswith(AGENT_MEMORY_PREFIX)
        and (
            not explicit
            or (
                any(not d or rel.startswith(f"{d}/") for d in found.directories)
                and not (found.root / rel).is_file()
            )
        )
    ]


@dataclass
class _Outcome:
    written: bool = False
    added: int = 0
    archived: int = 0
    embedded: bool = False
    skipped: str | None = None


async def _ingest_file(
    engine: Engine,
    scope: Scope,
    rel: str,
    path: Path,
    old: Sequence[Record],
    size: int,
    agent: str,
) -> _Outcome:
    """Re-chunk one file if its content changed; one transaction for all its writes."""
    data = await anyio.to_thread.run_sync(_read, path)
    if isinstance(data, str):
        return await _skip(engine, scope, rel, old, data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return await _skip(engine, scope, rel, old, "not UTF-8 text")
    if "\x00" in text:
        return await _skip(engine, scope, rel, old, "not UTF-8 text (binary: NUL bytes)")
    # The brief inject writes into prompt files is not knowledge: it is left out, and
    # its changes do not count as changes to the file.
    text = without_blocks(text)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if _same_file(old, digest):
        return _Outcome()
    is_markdown = path.suffix.lower() in MARKDOWN_SUFFIXES
    chunks = chunk_markdown(text, size) if is_markdown else chunk_text(text, size)
    try:
        drafts = _drafts(engine, scope, rel, digest, chunks, agent)
    except InvalidInput as exc:
        return await _skip(engine, scope, rel, old, str(exc))
    if not old and not drafts:
        return _Outcome()  # nothing indexable, nothing indexed before

    vectors = await engine.embed_records([d.record.content for d in drafts])
    identity = engine.embeddings.identity if vectors is not None else None
    stamp = format_time(engine.clock())
    outcome = _Outcome(written=True, embedded=vectors is not None or not drafts)
    async with engine.store.write() as tx:
        # Read again under the write lock: another process may have ingested meanwhile.
        live = (await _stored_chunks(tx, scope)).get(rel, [])
        if _same_file(live, digest):
            return _Outcome()
        for record in live:
            outcome.archived += await tx.archive(record.id, CHANGED_REASON, stamp)
        for index, draft in enumerate(drafts):
            vector: Vector | None = vectors[index] if vectors is not None else None
            if vector is not None and identity is not None:
                draft.record.embedder = identity
            await tx.insert(draft.record, vector)
            outcome.added += 1
    return outcome


def _drafts(
    engine: Engine,
    scope: Scope,
    rel: str,
    digest: str,
    chunks: Sequence[Chunk],
    agent: str,
) -> list[Draft]:
    """Prepared chunk records (cleaned, secrets handled) with their ``meta``.

    Raises:
        InvalidInput: a chunk is unusable, or holds a secret under ``write.secrets = reject``.
    """
    settings = engine.settings.write
    now = engine.clock()
    drafts: list[Draft] = []
    for chunk in chunks:
        if not clean_text(chunk.text):
            continue
        draft = prepare(
            chunk.text,
            kind="chunk",
            kinds=("chunk",),
            scope=scope,
            importance=None,
            tags=(),
            agent=agent,
            at=now,
            settings=settings,
            user=engine.user,
        )
        heading = clean_text(chunk.heading).replace("\n", " ")
        if settings.secrets != "off":
            heading = redact(heading).text
        draft.record.meta = {
            "path": rel,
            "heading": heading,
            "file_hash": digest,
            "chunk": len(drafts),
        }
        drafts.append(draft)
    return drafts


async def _skip(
    engine: Engine, scope: Scope, rel: str, old: Sequence[Record], reason: str
) -> _Outcome:
    """A file that cannot be indexed any more: its old chunks, if any, are archived."""
    archived = 0
    if old:
        _, archived = await _archive_paths(engine, scope, [rel], f"source file skipped: {reason}")
    return _Outcome(archived=archived, skipped=reason)


async def _archive_paths(
    engine: Engine, scope: Scope, paths: Sequence[str], reason: str
) -> tuple[int, int]:
    """Archive the current chunks of ``paths``: (files that had chunks, chunks archived)."""
    stamp = format_time(engine.clock())
    files = archived = 0
    async with engine.store.write() as tx:
        live = await _stored_chunks(tx, scope)
        for path in paths:
            count = 0
            for record in live.get(path, []):
                count += await tx.archive(record.id, reason, stamp)
            files += count > 0
            archived += count
    return files, archived
