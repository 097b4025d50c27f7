"""`doctor` finds indexes that disagree with the records and rebuilds them; `backup` copies."""

from __future__ import annotations

import stat
from pathlib import Path

import anyio
import pytest

from helpers.processes import Workers, release
from memory_mcp.config import Settings
from memory_mcp.embedders.base import FakeEmbedder
from memory_mcp.errors import InvalidInput
from memory_mcp.service import MemoryService
from memory_mcp.storage.sqlite import SqliteStore
from memory_mcp.storage.sqlite.doctor import backup, diagnose
from memory_mcp.storage.sqlite.vectors import rowids_of

pytestmark = [pytest.mark.anyio, pytest.mark.sqlite_only]  # SQLite's doctor and backup

WRITER = Path(__file__).parents[1] / "concurrency_worker.py"  # a second agent's server


def problems(found: object) -> dict[str, list[str]]:
    return {c.name: c.problems for c in found.checks if c.problems}  # type: ignore[attr-defined]


async def test_a_healthy_store_passes(memory: MemoryService, project: Path) -> None:
    await memory.store("The staging database is reset every Sunday", cwd=project)
    found = await diagnose(memory.engine.store)
    assert found.healthy and problems(found) == {}
    assert [c.name for c in found.checks][:2] == ["sqlite integrity", "full-text index"]


async def test_a_full_text_index_that_lost_a_row_is_rebuilt(
    memory: MemoryService, project: Path
) -> None:
    stored = await memory.store("The staging database is reset every Sunday", cwd=project)
    async with memory.engine.store.write() as tx:  # the index forgets the record behind its back
        await tx.execute(
            "INSERT INTO records_fts (records_fts, rowid, content, merged_text, tags) "
            "SELECT 'delete', seq, content, merged_text, tags FROM records WHERE id = ?",
            [stored.id],
        )
    found = await diagnose(memory.engine.store)
    assert not found.healthy and "full-text index" in problems(found)
    repaired = await diagnose(memory.engine.store, repair=True)
    assert repaired.healthy
    assert (await diagnose(memory.engine.store)).healthy and problems(
        await diagnose(memory.engine.store)
    ) == {}
    hits = await memory.engine.store.lexical("staging sunday", _filters(stored.scope_key), 5)
    assert [h.record.id for h in hits] == [stored.id]


async def test_missing_and_orphan_vectors_are_repaired_and_re_embedded(
    memory: MemoryService, project: Path
) -> None:
    kept = await memory.store("The staging database is reset every Sunday", cwd=project)
    broken = await memory.store("Deploys go through GitHub Actions to Fly.io", cwd=project)
    identity = memory.engine.embeddings.identity
    assert identity is not None
    table = (await memory.engine.store.stats()).vector_indexes[0][0]
    async with memory.engine.store.write() as tx:
        seq = (await tx.fetch("SELECT seq FROM records WHERE id = ?", [broken.id]))[0][0]
        await tx.execute(f"DELETE FROM {table} WHERE rowid = ?", [rowids_of(seq, 1)[0]])
        await tx.execute(  # a vector whose record is gone
            f"INSERT INTO {table} (rowid, scope_key, corpus, kind, embedding) "
            "SELECT ?, scope_key, corpus, kind, embedding FROM "
            f"{table} WHERE rowid = ?",
            [rowids_of(9999, 1)[0], rowids_of(seq - 1, 1)[0]],
        )
    found = await diagnose(memory.engine.store)
    [issues] = problems(found).values()
    assert any(broken.id in p for p in issues) and any("belong to no current" in p for p in issues)
    assert (await diagnose(memory.engine.store, repair=True)).healthy
    assert (
        await memory.engine.store.count_needing_embedding(identity) == 1
    )  # waits for re-embedding
    await memory.reembed()
    assert problems(await diagnose(memory.engine.store)) == {}
    for record in (kept, broken):
        hits = await memory.engine.store.nearest(
            (await memory.engine.store.vectors_of(record.id, identity))[0],  # type: ignore[index]
            identity,
            _filters(record.scope_key),
            1,
        )
        assert hits[0].record.id == record.id


async def test_a_backup_taken_while_another_process_writes_is_consistent(
    tmp_path: Path, project: Path, workers: Workers
) -> None:
    database = tmp_path / "m.db"
    async with MemoryService.open(
        Settings(), database=database, embedder=FakeEmbedder(), wait_for_embedder=10
    ) as memory:
        for i in range(20):
            await memory.store(f"Fact {i}: service {i} listens on port {8000 + i}", cwd=project)
        notes = [f"Note {i}: module m{i} is owned by team t{i}" for i in range(40)]
        writer = workers.start(WRITER, f"sqlite://{database}", project, *notes)
        release(writer)
        copy = await backup(memory.engine.store, tmp_path)
        _, err = writer.finish(timeout=120)
        assert writer.returncode == 0, err
        assert stat.S_IMODE(copy.stat().st_mode) == 0o600
        with pytest.raises(InvalidInput, match="exists"):
            await backup(memory.engine.store, copy)
        assert await backup(memory.engine.store, copy, force=True) == copy
    restored = await SqliteStore.open(copy)
    try:
        assert (await diagnose(restored)).healthy
        counted = sum(n for (c, _, st), n in (await restored.stats()).records.items())
        assert 20 <= counted <= 60
    finally:
        await restored.close()
    assert not [p async for p in anyio.Path(tmp_path).iterdir() if ".partial" in p.name]


def _filters(scope_key: str):  # type: ignore[no-untyped-def]
    from memory_mcp.storage.base import Filters

    return Filters(scope_keys=(scope_key,), corpora=("facts",))


async def test_a_backup_does_not_wait_for_an_open_write_nor_copy_it(
    memory: MemoryService, project: Path, tmp_path: Path
) -> None:
    kept = await memory.store("Committed before the backup", cwd=project)
    async with memory.engine.store.write() as tx:  # a writer is in the middle of a transaction
        pending = await memory.engine.store.get(kept.id)
        assert pending is not None
        await tx.execute("UPDATE records SET content = 'uncommitted' WHERE id = ?", [kept.id])
        with anyio.fail_after(30):
            copy = await backup(memory.engine.store, tmp_path / "during.db")
    store = await SqliteStore.open(copy)
    try:
        assert [r.content async for r in store.iter_records()] == ["Committed before the backup"]
    finally:
        await store.close()
    with pytest.raises(InvalidInput, match="live database"):
        await backup(memory.engine.store, memory.engine.store.path, force=True)
