"""A full disk, a read-only store, a broken model: a clear error or the lexical floor."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.git import repository
from helpers.records import fact
from helpers.storage import store_place
from memory_mcp.errors import StorageError
from memory_mcp.service import MemoryService, StoreRequest
from memory_mcp.storage.sqlite.doctor import diagnose

pytestmark = pytest.mark.anyio


async def limit_pages(memory: MemoryService, extra: int) -> None:
    """The database may grow by ``extra`` pages only: a disk that fills up."""
    for conn in (memory.engine.store._writer, memory.engine.store._reader):
        pages = (await conn.execute_fetchall("PRAGMA page_count"))[0][0]
        await conn.execute(f"PRAGMA max_page_count = {int(pages) + extra}")


@pytest.mark.sqlite_only  # SQLite's page limit plays the full disk
async def test_a_full_disk_gives_a_clear_error_and_loses_nothing(
    memory: MemoryService, project: Path
) -> None:
    kept = [await memory.store(f"Kept fact {i} about module m{i}", cwd=project) for i in range(5)]
    await limit_pages(memory, 2)
    big = [StoreRequest("Bulk note " + " ".join(f"w{i}x{j}" for j in range(400)), cwd=project)
           for i in range(40)]  # fmt: skip
    with pytest.raises(StorageError, match="full") as caught:
        await memory.store_many(big)
    assert "Traceback" not in str(caught.value)
    await limit_pages(memory, 100_000)
    assert (await diagnose(memory.engine.store)).healthy
    for stored in kept:
        assert (await memory.get(stored.id)).current
    after = await memory.store("Written once there is room again", cwd=project)
    assert after.action == "inserted"


@pytest.mark.sqlite_only  # SQLite's query_only plays the read-only file
async def test_a_read_only_store_refuses_writes_clearly_and_still_answers(
    memory: MemoryService, project: Path
) -> None:
    await memory.store("The staging database is called pigeon_stage", cwd=project)
    await memory.engine.store._writer.execute("PRAGMA query_only = 1")  # as a read-only file would
    with pytest.raises(StorageError, match="read-only"):
        await memory.store("Another fact about the deploy job", cwd=project)
    hits = (await memory.search("staging database", cwd=project)).hits  # uncounted, not lost
    assert [h.record.content for h in hits] == ["The staging database is called pigeon_stage"]


@pytest.mark.sqlite_only  # SQLite's query_only plays the read-only file
async def test_a_read_only_store_still_answers_a_project_whose_old_keys_it_cannot_attach(
    memory: MemoryService, tmp_path: Path
) -> None:
    repo = repository(tmp_path / "git-repo")
    old = fact("The staging database is called pigeon_stage", scope_key=str(repo.resolve()))
    async with memory.engine.store.write() as tx:
        await tx.insert(old, None)
    await memory.engine.store._writer.execute("PRAGMA query_only = 1")  # as a read-only file would
    assert (await memory.project(repo)).scope.aliases == ()  # not attached, and no error
    assert (await memory.brief(repo)).ids == []  # the brief answers (without the old keys)


@pytest.mark.parametrize("state", ["broken", "missing"])
async def test_a_broken_or_missing_model_folder_falls_back_to_the_lexical_floor(
    tmp_path: Path, storage_url: str, project: Path, state: str
) -> None:
    broken = tmp_path / "model"
    if state == "broken":
        broken.mkdir()
        (broken / "model.onnx").write_bytes(b"this is not an ONNX file")
        (broken / "tokenizer.json").write_text("{")
    settings, database = store_place(tmp_path, storage_url, "m")
    settings.embedder.model_path = str(broken)
    settings.embedder.download = False
    async with MemoryService.open(settings, database=database, wait_for_embedder=30) as memory:
        stored = await memory.store("Deploys go through GitHub Actions", cwd=project)
        assert stored.action == "inserted" and not stored.embedded
        result = await memory.search("deploys github", cwd=project)
        assert [h.record.id for h in result.hits] == [stored.id]
        assert result.mode == "lexical" and result.warnings
        assert memory.engine.embeddings.status().degraded
