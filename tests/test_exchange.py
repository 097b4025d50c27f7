"""Export and import are lossless: every field, archived records and history included."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from helpers.git import git, repository
from helpers.records import fact
from helpers.storage import open_url, store_place, store_url
from memory_mcp.embedders.base import FakeEmbedder
from memory_mcp.errors import InvalidInput
from memory_mcp.exchange import export_jsonl, import_jsonl, parse_export, push
from memory_mcp.service import MemoryService, StoreRequest

pytestmark = pytest.mark.anyio


async def fill(memory: MemoryService, project: Path) -> None:
    await memory.store("Use uv for installs.", cwd=project, importance=0.9, tags=["tooling"])
    await memory.store("use UV for installs", cwd=project)  # folds
    await memory.store("The pigeon app's minimum iOS version is 15.", cwd=project)
    await memory.store("The pigeon app's minimum iOS version is 16.", cwd=project)  # supersedes
    await memory.store("Run tests with pytest -x", cwd=project)
    await memory.store("Never run tests with -x", cwd=project)  # conflict
    await memory.store("Ship v2 by March", kind="goal", cwd=project)
    await memory.store("Ship v2 by April", kind="goal", cwd=project)  # replaces
    await memory.store(
        "Paired with Dana on the cache bug", kind="journal", cwd=project, agent="codex"
    )
    await memory.store("The user prefers short answers", scope="global", cwd=project)
    forgotten = await memory.store("Temporary note", cwd=project)
    await memory.forget(forgotten.id, reason="done")
    await memory.search("pigeon iOS", cwd=project)  # access counts are exported too


async def dump(memory: MemoryService) -> list[dict[str, object]]:
    out = io.StringIO()
    await export_jsonl(memory.engine, out)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    return [line for line in lines if line["type"] != "header"]


async def test_export_then_import_reproduces_every_field(
    tmp_path: Path, storage_url: str, project: Path
) -> None:
    settings, database = store_place(tmp_path, storage_url, "a")
    async with MemoryService.open(settings, database=database, embedder=FakeEmbedder()) as a:
        await fill(a, project)
        original = await dump(a)
        text = io.StringIO()
        await export_jsonl(a.engine, text)
    kinds = {line["type"] for line in original}
    assert kinds == {"record", "conflict"}
    assert any(line.get("archived_reason") == "done" for line in original)
    assert any(line.get("replaced_by") for line in original)
    assert any(line.get("merged_from") for line in original)

    settings, database = store_place(tmp_path, storage_url, "b")
    async with MemoryService.open(settings, database=database, embedder=FakeEmbedder()) as b:
        written: list[tuple[int, int]] = []
        embedded: list[tuple[int, int]] = []
        summary = await import_jsonl(
            b.engine,
            text.getvalue().splitlines(),
            progress=lambda done, total: written.append((done, total)),
            embed_progress=lambda done, total: embedded.append((done, total)),
        )
        # Both phases report, ending complete: the records, then the current ones' vectors.
        assert written[-1] == (summary.records_added, summary.records_added)
        assert embedded and embedded[-1][0] == embedded[-1][1] == summary.embedded > 0
        assert summary.records_added == sum(1 for line in original if line["type"] == "record")
        assert summary.conflicts_added == 1 and summary.awaiting_embedding == 0
        restored = await dump(b)
        assert restored == original
        again = await import_jsonl(b.engine, text.getvalue().splitlines())  # idempotent
        assert again.records_added == 0 and again.records_skipped == summary.records_added
        assert (await b.search("pigeon minimum iOS", cwd=project)).mode == "hybrid"


def test_a_file_that_is_not_an_export_is_refused_with_the_line_number() -> None:
    with pytest.raises(InvalidInput, match="does not start with a memory-mcp header"):
        parse_export(['{"type": "record"}'])
    header = json.dumps({"type": "header", "format": "memory-mcp-export", "version": 1})
    with pytest.raises(InvalidInput, match="line 2"):
        parse_export([header, "{not json"])
    with pytest.raises(InvalidInput, match="line 2"):
        parse_export([header, json.dumps({"type": "record", "id": "x"})])
    with pytest.raises(InvalidInput, match="newer"):
        parse_export([json.dumps({"type": "header", "format": "memory-mcp-export", "version": 99})])
    with pytest.raises(InvalidInput, match="empty"):
        parse_export([])


def test_imported_timestamps_are_stored_in_one_sortable_form() -> None:
    from memory_mcp.records import Record

    record = Record.from_json(
        {
            "id": "f_1",
            "corpus": "facts",
            "kind": "fact",
            "scope": "global",
            "scope_key": "",
            "content": "x",
            "agent": "cli",
            "created_at": "2026-03-01T10:00:00+01:00",
            "updated_at": "2026-03-01 09:00:00",
            "last_access_at": "",
        }
    )
    assert record.created_at == "2026-03-01T09:00:00.000000Z"
    assert record.updated_at == "2026-03-01T09:00:00.000000Z"
    assert record.last_access_at is None


async def test_push_copies_a_store_into_another_and_a_second_push_adds_nothing(
    memory: MemoryService, tmp_path: Path, storage_url: str, project: Path
) -> None:
    team = store_url(tmp_path, storage_url, "team")
    await fill(memory, project)
    original = await dump(memory)
    copied: list[tuple[int, int]] = []
    summary = await memory.push(team, progress=lambda done, total: copied.append((done, total)))
    records = sum(1 for line in original if line["type"] == "record")
    assert summary.records_added == records and summary.conflicts_added == 1
    assert copied[-1] == (records, records) and summary.awaiting_embedding == 0
    again = await memory.push(team)
    assert (again.records_added, again.records_skipped, again.conflicts_added) == (0, records, 0)
    with pytest.raises(InvalidInput, match="is this store"):
        await memory.push(store_url(tmp_path, storage_url))
    if not storage_url:  # the same file, however it is spelled, and before opening anything
        (tmp_path / "link").symlink_to(tmp_path)
        for spelled in (
            f"sqlite://{tmp_path}/x/../memory.db",
            f"sqlite://{tmp_path}/link/memory.db",
        ):
            with pytest.raises(InvalidInput, match="is this store"):
                await memory.push(spelled)
    async with open_url(team) as theirs:
        assert await dump(theirs) == original  # history, archived records, the conflict
        found = await theirs.search("pigeon minimum iOS", cwd=project)
        assert found.mode == "hybrid" and "16" in found.hits[0].record.content


async def test_an_interrupted_push_completes_when_run_again(
    memory: MemoryService, tmp_path: Path, storage_url: str, project: Path
) -> None:
    team = store_url(tmp_path, storage_url, "team")
    notes = [
        StoreRequest(f"note {n}: port {n} is for service-{n}", cwd=project) for n in range(1200)
    ]
    await memory.store_many(notes)  # three batches of a push
    original = await dump(memory)

    def stop(done: int, total: int) -> None:
        if done >= 500:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        await memory.push(team, progress=stop)
    summary = await memory.push(team)
    assert summary.records_skipped == 500 and summary.records_added == len(original) - 500
    async with open_url(team) as theirs:
        assert await dump(theirs) == original


async def test_push_gives_each_scope_key_its_key_in_the_target(
    memory: MemoryService, tmp_path: Path, storage_url: str, project: Path
) -> None:
    await fill(memory, project)
    key = (await memory.scope_keys("project", project))[0]
    async with memory.engine.beside(store_url(tmp_path, storage_url, "team")) as team:
        await push(memory.engine, team, map_key=lambda k: "github.com/org/app" if k == key else k)
        keys = {record.scope_key async for record in team.store.iter_records()}
        conflicts = await team.store.conflicts()
    assert keys == {"github.com/org/app", ""}
    assert [c.scope_key for c in conflicts] == ["github.com/org/app"]


async def test_project_aliases_travel_with_an_export_detached_ones_detached(
    tmp_path: Path, storage_url: str
) -> None:
    settings, database = store_place(tmp_path, storage_url, "a")
    async with MemoryService.open(settings, database=database, embedder=FakeEmbedder()) as a:
        async with a.engine.store.write() as tx:
            await tx.insert(fact("Old fact one", scope_key="/old/app"), None)
            await tx.insert(fact("Old fact two", scope_key="/old/app-wt"), None)
            await tx.add_alias("/old/app", "github.com/org/app", "2026-01-01T00:00:00.000000Z")
            await tx.add_alias("/old/app-wt", "github.com/org/app", "2026-01-02T00:00:00.000000Z")
            await tx.remove_alias("/old/app-wt", "2026-01-03T00:00:00.000000Z")
        text = io.StringIO()
        summary = await export_jsonl(a.engine, text)
        original = await a.engine.store.aliases("github.com/org/app")
    assert summary.aliases == 2
    settings, database = store_place(tmp_path, storage_url, "b")
    async with MemoryService.open(settings, database=database, embedder=FakeEmbedder()) as b:
        added = await import_jsonl(b.engine, text.getvalue().splitlines())
        assert added.aliases_added == 2
        assert await b.engine.store.aliases("github.com/org/app") == original
        again = await import_jsonl(b.engine, text.getvalue().splitlines())
        assert again.aliases_added == 0


async def test_push_takes_each_project_to_its_portable_key(
    memory: MemoryService, tmp_path: Path, storage_url: str
) -> None:
    repo = repository(tmp_path / "repo", origin="git@github.com:org/app.git")
    gone = str(tmp_path / "deleted-checkout")  # a path key whose folder is gone stays as it is
    async with memory.engine.store.write() as tx:  # as the code before identities wrote them
        await tx.insert(
            fact("The gateway times out after 30 s", scope_key=str(repo.resolve())), None
        )
        await tx.insert(fact("Old notes", scope_key=gone), None)
    await memory.store("Prefer short answers", scope="global", cwd=repo)
    team = store_url(tmp_path, storage_url, "team")
    summary = await memory.push(team)
    assert summary.records_added == 3
    async with open_url(team) as theirs:
        keys = {r.content: r.scope_key async for r in theirs.engine.store.iter_records()}
        assert keys == {
            "The gateway times out after 30 s": "github.com/org/app",
            "Old notes": gone,
            "Prefer short answers": "",
        }
        clone = tmp_path / "teammate"  # another machine's clone finds it under the same key
        git(tmp_path, "clone", "-q", str(repo), str(clone))
        git(clone, "remote", "set-url", "origin", "https://github.com/org/app")
        found = await theirs.search("gateway timeout", cwd=clone)
        assert [h.record.content for h in found.hits] == ["The gateway times out after 30 s"]


async def test_an_import_that_adds_records_ends_by_analyzing_the_store(
    tmp_path: Path, storage_url: str, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The planner's statistics are brought up to date before the first search over what
    was imported (Postgres plans from them; SQLite's call does nothing)."""
    settings, database = store_place(tmp_path, storage_url, "a")
    async with MemoryService.open(settings, database=database, embedder=FakeEmbedder()) as a:
        await a.store("Use uv for installs.", cwd=project)
        text = io.StringIO()
        await export_jsonl(a.engine, text)
    settings, database = store_place(tmp_path, storage_url, "b")
    async with MemoryService.open(settings, database=database, embedder=FakeEmbedder()) as b:
        store = b.engine.store
        analyzed: list[bool] = []
        real = store.analyze

        async def analyze() -> None:
            analyzed.append(True)
            await real()

        monkeypatch.setattr(store, "analyze", analyze)
        await import_jsonl(b.engine, text.getvalue().splitlines())
        assert analyzed == [True]
        await import_jsonl(b.engine, text.getvalue().splitlines())  # nothing added
        assert analyzed == [True]
