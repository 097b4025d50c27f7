"""``ingest``: the project's documents as knowledge chunks, re-chunked only when changed."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.storage import store_place
from memory_mcp.chunking import CHUNK_CHARS, chunk_markdown, chunk_text
from memory_mcp.errors import InvalidInput, NotFound
from memory_mcp.ingest import (
    CHANGED_REASON,
    DEFAULT_PATTERNS,
    MAX_FILE_BYTES,
    REMOVED_REASON,
    ingest,
)
from memory_mcp.records import Record
from memory_mcp.scope import project_root
from memory_mcp.service import MemoryService
from memory_mcp.storage.base import Filters

README = """# Demo

A demo project for the ingest tests.

## Install

Install the toolchain before anything else.

### Linux

Run apt install zebrafish-toolkit on Debian and Ubuntu.

### macOS

Run brew install zebrafish-toolkit.
"""

GUIDE = """# Guide

## Deploy

We deploy the pelican service with GitHub Actions to Fly.io.
"""

CLAUDE = """# Notes for agents

Always run the quokka test suite before committing.
"""


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def root(project: Path) -> Path:
    """The project root as the caller resolves it (a real path)."""
    return project_root(project)


@pytest.fixture
def docs(root: Path) -> Path:
    """README.md, docs/a/b.md and CLAUDE.md, plus files the default patterns must ignore."""
    write(root / "README.md", README)
    write(root / "docs" / "a" / "b.md", GUIDE)
    write(root / "CLAUDE.md", CLAUDE)
    write(root / "src" / "x.md", "# Source notes\n\nThe narwhal module is private.\n")
    write(root / "docs" / "notes.txt", "Plain text in docs is not a default pattern.\n")
    write(root / ".github" / "docs" / "c.md", "# Hidden\n\nNot the project's docs.\n")
    return root


async def current_chunks(memory: MemoryService, root: Path) -> list[Record]:
    filters = Filters(scope_keys=(str(root),), corpora=("knowledge",))
    return await memory.engine.store.current(filters, limit=10_000)


async def all_chunks(memory: MemoryService) -> list[Record]:
    return [r async for r in memory.engine.store.iter_records() if r.corpus == "knowledge"]


def ids_of(records: list[Record], path: str) -> set[str]:
    return {r.id for r in records if r.meta["path"] == path}


# Chunking ----------------------------------------------------------------------------


def test_headings_make_sections_with_their_heading_trail() -> None:
    chunks = chunk_markdown(README)
    assert [c.heading for c in chunks] == [
        "Demo",
        "Demo > Install",
        "Demo > Install > Linux",
        "Demo > Install > macOS",
    ]
    assert chunks[2].text == (
        "### Linux\n\nRun apt install zebrafish-toolkit on Debian and Ubuntu."
    )


def test_text_before_the_first_heading_has_an_empty_trail_and_heading_only_sections_go() -> None:
    chunks = chunk_markdown("Preamble line.\n\n# Top\n\n## Sub\n\nBody.\n\n## Empty\n\n")
    assert [(c.heading, c.text) for c in chunks] == [
        ("", "Preamble line."),
        ("Top > Sub", "## Sub\n\nBody."),
    ]


def test_headings_inside_fenced_code_are_not_split_points() -> None:
    text = (
        "## Build\n\n"
        "```sh\n# install the tools\nmake tools\n\n## not a heading either\n```\n\n"
        "~~~\n# tilde fences too\n~~~\n\n"
        "After the fence.\n\n"
        "## Test\n\nRun make test.\n"
    )
    chunks = chunk_markdown(text)
    assert [c.heading for c in chunks] == ["Build", "Test"]
    assert "# install the tools" in chunks[0].text
    assert "## not a heading either" in chunks[0].text
    assert "# tilde fences too" in chunks[0].text
    assert chunks[0].text.endswith("After the fence.")


def test_a_hashtag_is_not_a_heading_and_closing_hashes_are_dropped() -> None:
    chunks = chunk_markdown("#hashtag line\n\n## Usage ##\n\nText.\n")
    assert [(c.heading, c.text.splitlines()[0]) for c in chunks] == [
        ("", "#hashtag line"),
        ("Usage", "## Usage ##"),
    ]


def test_a_long_section_is_split_at_paragraphs_under_the_size() -> None:
    paragraphs = [f"Paragraph {i}: " + "lorem ipsum dolor " * 25 for i in range(12)]
    text = "# Big\n\n## Section\n\n" + "\n\n".join(paragraphs) + "\n"
    chunks = chunk_markdown(text)
    assert len(chunks) > 2
    assert all(len(c.text) <= CHUNK_CHARS for c in chunks)
    assert all(c.heading == "Big > Section" for c in chunks)
    assert all(c.text.startswith("## Section\n\n") for c in chunks)
    for paragraph in paragraphs:  # every paragraph whole, in exactly one chunk
        assert sum(paragraph.strip() in c.text for c in chunks) == 1


def test_a_fenced_block_with_blank_lines_stays_whole_when_it_fits() -> None:
    fence = "```python\n" + "\n\n".join(f"x{i} = {i}" for i in range(40)) + "\n```"
    text = "## Code\n\n" + "intro " * 200 + "\n\n" + fence + "\n\n" + "outro " * 200
    chunks = chunk_markdown(text)
    assert len(chunks) > 1
    assert sum(fence in c.text for c in chunks) == 1


def test_a_paragraph_longer_than_the_size_is_hard_split() -> None:
    words = " ".join(f"w{i}" for i in range(2000))
    chunks = chunk_markdown("## Wall\n\n" + words)
    assert len(chunks) > 1
    assert all(len(c.text) <= CHUNK_CHARS for c in chunks)
    rebuilt = " ".join(c.text.removeprefix("## Wall\n\n") for c in chunks)
    assert rebuilt.split() == words.split()
    unbroken = "y" * (3 * CHUNK_CHARS)
    pieces = chunk_text(unbroken)
    assert [len(p.text) for p in pieces] == [CHUNK_CHARS] * 3


def test_plain_text_is_cut_into_packed_paragraphs() -> None:
    chunks = chunk_text("one\n\n\ntwo\n\n   \n\nthree", size=9)
    assert [(c.heading, c.text) for c in chunks] == [("", "one\n\ntwo"), ("", "three")]


# Ingest ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_default_patterns_pick_readme_docs_and_agent_files_only(
    memory: MemoryService, docs: Path
) -> None:
    assert "docs/**/*.md" in DEFAULT_PATTERNS
    summary = await ingest(memory.engine, docs)
    assert (summary.files, summary.changed, summary.unchanged, summary.removed) == (3, 3, 0, 0)
    assert summary.skipped == []
    assert summary.embedded
    chunks = await current_chunks(memory, docs)
    assert {r.meta["path"] for r in chunks} == {"README.md", "docs/a/b.md", "CLAUDE.md"}
    assert summary.chunks_added == len(chunks) == 4 + 1 + 1
    assert all(r.kind == "chunk" and r.scope == "project" for r in chunks)
    assert all(r.embedder == memory.engine.embeddings.identity for r in chunks)


@pytest.mark.anyio
async def test_chunks_carry_their_meta_and_are_found_by_search(
    memory: MemoryService, docs: Path, project: Path
) -> None:
    await ingest(memory.engine, docs, agent="test-agent")
    hits = (
        await memory.search("apt install zebrafish toolkit", cwd=project, corpora=("knowledge",))
    ).hits
    assert hits
    top = hits[0].record
    assert top.content.startswith("### Linux")
    assert top.agent == "test-agent"
    assert top.meta["path"] == "README.md"
    assert top.meta["heading"] == "Demo > Install > Linux"
    assert top.meta["chunk"] == 2
    assert len(top.meta["file_hash"]) == 64
    assert (await memory.search("zebrafish toolkit", cwd=project)).hits == []  # facts only


@pytest.mark.anyio
async def test_rerunning_with_nothing_changed_writes_nothing(
    memory: MemoryService, docs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await ingest(memory.engine, docs)
    before = await all_chunks(memory)

    async def no_embedding(texts: object) -> None:
        raise AssertionError("an unchanged file was re-chunked and embedded")

    monkeypatch.setattr(memory.engine, "embed_records", no_embedding)
    summary = await ingest(memory.engine, docs)
    assert (summary.changed, summary.unchanged, summary.removed) == (0, 3, 0)
    assert (summary.chunks_added, summary.chunks_archived) == (0, 0)
    assert not summary.embedded
    after = await all_chunks(memory)
    assert [r.to_json() for r in after] == [r.to_json() for r in before]


@pytest.mark.anyio
async def test_editing_one_file_rechunks_only_that_file(memory: MemoryService, docs: Path) -> None:
    await ingest(memory.engine, docs)
    before = await current_chunks(memory, docs)
    write(docs / "docs" / "a" / "b.md", GUIDE + "\n## Rollback\n\nRoll back with fly deploy.\n")
    summary = await ingest(memory.engine, docs)
    assert (summary.changed, summary.unchanged) == (1, 2)
    assert (summary.chunks_added, summary.chunks_archived) == (2, 1)
    after = await current_chunks(memory, docs)
    for untouched in ("README.md", "CLAUDE.md"):
        assert ids_of(after, untouched) == ids_of(before, untouched)
    old_ids = ids_of(before, "docs/a/b.md")
    assert not old_ids & ids_of(after, "docs/a/b.md")
    for old in await memory.engine.store.get_many(sorted(old_ids)):
        assert old.archived_reason == CHANGED_REASON
    guide = sorted(
        (r for r in after if r.meta["path"] == "docs/a/b.md"), key=lambda r: r.meta["chunk"]
    )
    assert [r.meta["heading"] for r in guide] == ["Guide > Deploy", "Guide > Rollback"]
    assert [r.meta["chunk"] for r in guide] == [0, 1]


@pytest.mark.anyio
async def test_deleting_a_file_archives_its_chunks(
    memory: MemoryService, docs: Path, project: Path
) -> None:
    await ingest(memory.engine, docs)
    before = await current_chunks(memory, docs)
    query = "quokka test suite"
    hits = (await memory.search(query, cwd=project, corpora=("knowledge",))).hits
    assert hits[0].record.meta["path"] == "CLAUDE.md"
    (docs / "CLAUDE.md").unlink()
    summary = await ingest(memory.engine, docs)
    assert (summary.files, summary.removed, summary.chunks_archived) == (2, 1, 1)
    gone = await memory.engine.store.get_many(sorted(ids_of(before, "CLAUDE.md")))
    assert [r.archived_reason for r in gone] == [REMOVED_REASON]
    assert {r.meta["path"] for r in await current_chunks(memory, docs)} == {
        "README.md",
        "docs/a/b.md",
    }
    hits = (await memory.search(query, cwd=project, corpora=("knowledge",))).hits
    assert "CLAUDE.md" not in {h.record.meta["path"] for h in hits}


@pytest.mark.anyio
async def test_explicit_paths_take_files_and_text_under_directories(
    memory: MemoryService, docs: Path
) -> None:
    write(docs / "guide" / "intro.rst", "Intro\n=====\n\nThe walrus service.\n")
    write(docs / "guide" / "deep" / "notes.txt", "The otter cache.\n")
    write(docs / "guide" / "image.png", b"\x89PNG\r\n")
    write(docs / "guide" / ".venv" / "lib.md", "# Vendored\n")
    write(docs / "guide" / "node_modules" / "pkg" / "README.md", "# Vendored\n")
    summary = await ingest(memory.engine, docs, [Path("guide"), docs / "src" / "x.md"])
    paths = {r.meta["path"] for r in await current_chunks(memory, docs)}
    assert paths == {"guide/intro.rst", "guide/deep/notes.txt", "src/x.md"}
    assert summary.files == 3

    # Explicit paths remove only what vanished under the given directories.
    (docs / "guide" / "deep" / "notes.txt").unlink()
    summary = await ingest(memory.engine, docs, [Path("guide")])
    assert (summary.removed, summary.unchanged) == (1, 1)
    paths = {r.meta["path"] for r in await current_chunks(memory, docs)}
    assert paths == {"guide/intro.rst", "src/x.md"}


@pytest.mark.anyio
async def test_a_default_run_archives_what_no_longer_matches(
    memory: MemoryService, docs: Path
) -> None:
    await ingest(memory.engine, docs, [Path("src/x.md")])
    summary = await ingest(memory.engine, docs)
    assert summary.removed == 1
    assert "src/x.md" not in {r.meta["path"] for r in await current_chunks(memory, docs)}


@pytest.mark.anyio
async def test_paths_outside_the_root_are_refused_before_anything_is_written(
    memory: MemoryService, docs: Path, other_project: Path
) -> None:
    outside = write(other_project / "SECRET.md", "# Elsewhere\n\nNot this project.\n")
    with pytest.raises(InvalidInput, match="outside the project root"):
        await ingest(memory.engine, docs, [Path("README.md"), outside])
    with pytest.raises(InvalidInput, match="outside the project root"):
        await ingest(memory.engine, docs, [Path("../other-repo/SECRET.md")])
    (docs / "docs" / "link.md").symlink_to(outside)
    with pytest.raises(InvalidInput, match=r"docs/link\.md"):
        await ingest(memory.engine, docs, [Path("README.md"), Path("docs/link.md")])
    (docs / "linked-dir").symlink_to(other_project, target_is_directory=True)
    with pytest.raises(InvalidInput, match="linked-dir"):
        await ingest(memory.engine, docs, [docs / "linked-dir"])
    with pytest.raises(NotFound, match="missing"):
        await ingest(memory.engine, docs, [Path("README.md"), Path("docs/missing.md")])
    assert await all_chunks(memory) == []


@pytest.mark.anyio
async def test_a_symlink_found_by_the_patterns_that_leaves_the_root_is_skipped(
    memory: MemoryService, docs: Path, other_project: Path
) -> None:
    outside = write(other_project / "private.md", "# Private\n\nThe heron password list.\n")
    (docs / "docs" / "private.md").symlink_to(outside)
    summary = await ingest(memory.engine, docs)
    assert summary.skipped == ["docs/private.md: resolves outside the project root"]
    assert all("heron" not in r.content for r in await all_chunks(memory))


@pytest.mark.anyio
async def test_a_secret_in_a_document_is_redacted(memory: MemoryService, docs: Path) -> None:
    token = "ghp_1a2B3c4D5e6F7g8H9i0JkLmNoPqRsTuVwXyZ12"
    write(
        docs / "docs" / "api.md",
        f"# API\n\nCall the API with token {token} in CI.\n\n## Old token {token}\n\nRevoked.\n",
    )
    await ingest(memory.engine, docs)
    chunks = [r for r in await current_chunks(memory, docs) if r.meta["path"] == "docs/api.md"]
    assert len(chunks) == 2
    for chunk in chunks:
        assert token not in chunk.content and token not in chunk.meta["heading"]
        assert "[REDACTED:github-token]" in chunk.content
    assert {c.meta["heading"] for c in chunks} == {
        "API",
        "API > Old token [REDACTED:github-token]",
    }


@pytest.mark.anyio
async def test_non_utf8_and_oversized_files_are_skipped_with_a_reason(
    memory: MemoryService, docs: Path
) -> None:
    write(docs / "docs" / "latin1.md", "# Caf\xe9\n\nna\xefve\n".encode("latin-1"))
    write(docs / "docs" / "nul.md", b"# Binary\n\x00\x01\x02")
    write(docs / "docs" / "big.md", b"a" * (MAX_FILE_BYTES + 1))
    summary = await ingest(memory.engine, docs)
    assert summary.files == 6
    assert sorted(summary.skipped) == [
        f"docs/big.md: larger than 2 MB ({MAX_FILE_BYTES + 1:,} bytes)",
        "docs/latin1.md: not UTF-8 text",
        "docs/nul.md: not UTF-8 text (binary: NUL bytes)",
    ]
    paths = {r.meta["path"] for r in await current_chunks(memory, docs)}
    assert paths == {"README.md", "docs/a/b.md", "CLAUDE.md"}


@pytest.mark.anyio
async def test_a_file_that_becomes_unreadable_text_loses_its_chunks(
    memory: MemoryService, docs: Path
) -> None:
    await ingest(memory.engine, docs)
    write(docs / "CLAUDE.md", b"\xff\xfe garbage")
    summary = await ingest(memory.engine, docs)
    assert summary.skipped == ["CLAUDE.md: not UTF-8 text"]
    assert (summary.removed, summary.chunks_archived) == (1, 1)
    assert "CLAUDE.md" not in {r.meta["path"] for r in await current_chunks(memory, docs)}


@pytest.mark.anyio
async def test_progress_is_called_once_per_file(memory: MemoryService, docs: Path) -> None:
    calls: list[tuple[int, int]] = []
    await ingest(memory.engine, docs, progress=lambda done, total: calls.append((done, total)))
    assert calls == [(1, 3), (2, 3), (3, 3)]
    calls.clear()
    await ingest(memory.engine, docs, progress=lambda done, total: calls.append((done, total)))
    assert calls == [(1, 3), (2, 3), (3, 3)]


@pytest.mark.anyio
async def test_chunks_stay_under_the_configured_write_limit(
    memory: MemoryService, docs: Path
) -> None:
    memory.settings.write.max_chars = 400
    write(docs / "docs" / "long.md", "## Long\n\n" + "\n\n".join(["tern " * 50] * 10))
    await ingest(memory.engine, docs)
    chunks = [r for r in await current_chunks(memory, docs) if r.meta["path"] == "docs/long.md"]
    assert len(chunks) > 3
    assert all(len(r.content) <= 200 for r in chunks)


@pytest.mark.anyio
async def test_a_symlinked_root_path_is_resolved_for_containment(
    memory: MemoryService, docs: Path, tmp_path: Path
) -> None:
    alias = tmp_path / "alias"
    alias.symlink_to(docs, target_is_directory=True)
    summary = await ingest(memory.engine, docs, [alias / "README.md"])
    assert summary.changed == 1
    assert {r.meta["path"] for r in await current_chunks(memory, docs)} == {"README.md"}


@pytest.mark.anyio
async def test_on_the_lexical_floor_chunks_are_stored_without_vectors(
    tmp_path: Path, storage_url: str, docs: Path, project: Path
) -> None:
    settings, database = store_place(tmp_path, storage_url, "floor")
    settings.embedder.backend = "bm25"
    async with MemoryService.open(settings, database=database) as memory:
        summary = await ingest(memory.engine, docs)
        assert summary.changed == 3 and summary.chunks_added == 6
        assert not summary.embedded
        chunks = await current_chunks(memory, docs)
        assert all(r.embedder is None for r in chunks)
        result = await memory.search("pelican Fly.io", cwd=project, corpora=("knowledge",))
        assert result.mode == "lexical"
        assert result.hits[0].record.meta["path"] == "docs/a/b.md"


@pytest.mark.anyio
async def test_the_injected_brief_is_never_ingested_and_does_not_count_as_a_change(
    memory: MemoryService, project: Path
) -> None:
    from memory_mcp.agents.inject import inject

    (project / "CLAUDE.md").write_text("# Rules\n\nUse tabs for indentation.\n")
    inject(project, "## Brief\n\n~~~text\nSECRET-LOOKING BRIEF LINE\n~~~\n", ("claude",))
    first = await ingest(memory.engine, project)
    assert first.changed == 1
    chunks = await memory.engine.store.current(
        Filters(scope_keys=(str(project_root(project)),), corpora=("knowledge",)), 100
    )
    assert chunks and all("BRIEF LINE" not in c.content for c in chunks)
    inject(project, "## Brief\n\n~~~text\nanother brief\n~~~\n", ("claude",))
    again = await ingest(memory.engine, project)
    assert again.changed == 0 and again.unchanged == 1


@pytest.mark.anyio
async def test_claude_code_memory_files_are_imported_once(
    memory: MemoryService, project: Path, tmp_path: Path
) -> None:
    from memory_mcp.ingest import claude_memory_folder, ingest_agent_memories

    home = tmp_path / "home"
    folder = claude_memory_folder(project_root(project), home)
    # Claude Code's folder name: every character but letters and digits becomes "-".
    assert folder.parent.name == "".join(
        c if c.isascii() and c.isalnum() else "-" for c in str(project_root(project))
    )
    (folder / "topics").mkdir(parents=True)
    (folder / "MEMORY.md").write_text(
        "# Memory index\n\n- Deploys go through the release-bot [deploy](topics/deploy.md)\n"
    )
    (folder / "topics" / "deploy.md").write_text(
        "# Deploying\n\nThe release-bot tags vX.Y.Z and pushes to Fly.io.\n"
    )
    first = await ingest_agent_memories(memory.engine, project_root(project), home=home)
    assert (first.files, first.changed, first.chunks_added) == (2, 2, 2)
    second = await ingest_agent_memories(memory.engine, project_root(project), home=home)
    assert (second.changed, second.unchanged, second.chunks_added) == (0, 2, 0)
    hits = await memory.search("release-bot Fly.io", cwd=project, corpora=("knowledge",))
    paths = {h.record.meta["path"] for h in hits.hits}
    assert paths == {"agent-memory:claude/MEMORY.md", "agent-memory:claude/topics/deploy.md"}

    # Ingesting the project's own documents leaves the imported memory files alone.
    (project / "README.md").write_text("# App\n\nHello.\n")
    await ingest(memory.engine, project)
    third = await ingest_agent_memories(memory.engine, project_root(project), home=home)
    assert third.unchanged == 2 and third.chunks_archived == 0

    (folder / "topics" / "deploy.md").unlink()
    fourth = await ingest_agent_memories(memory.engine, project_root(project), home=home)
    assert fourth.removed == 1 and fourth.chunks_archived == 1
