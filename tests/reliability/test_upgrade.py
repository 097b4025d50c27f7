"""A store made by the first schema (m001) migrates with every record intact."""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest

from memory_mcp.config import Settings
from memory_mcp.embedders.base import FakeEmbedder
from memory_mcp.service import MemoryService
from memory_mcp.storage.base import Filters
from memory_mcp.storage.sqlite import SqliteStore
from memory_mcp.storage.sqlite.doctor import diagnose
from memory_mcp.storage.sqlite.migrations import MIGRATIONS

pytestmark = [pytest.mark.anyio, pytest.mark.sqlite_only]  # a stored SQLite file migrates

FIXTURES = Path(__file__).with_name("fixtures")
EMBEDDER = FakeEmbedder(dim=32, name="fake:hash-32")  # what made the fixture's vectors


def unpack(tmp_path: Path) -> Path:
    """The fixture's database (made by commit 4653267: see fixtures/make_m001.py)."""
    database = tmp_path / "memory.db"
    with gzip.open(FIXTURES / "m001.db.gz") as packed, database.open("wb") as out:
        shutil.copyfileobj(packed, out)
    return database


def exported() -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Records and conflicts as that code exported them."""
    records: dict[str, dict[str, Any]] = {}
    conflicts: list[dict[str, Any]] = []
    for line in (FIXTURES / "m001.jsonl").read_text().splitlines():
        item = json.loads(line)
        kind = item.pop("type")
        if kind == "record":
            # Fields added since (who wrote it, private) read as an old record has them.
            records[item["id"]] = {"user": "", "private": False, **item}
        elif kind == "conflict":
            conflicts.append(item)
    return records, conflicts


def rows(database: Path, sql: str) -> list[tuple[Any, ...]]:
    """Rows of a database no store has open (the stdlib's sqlite3 is another library)."""
    conn = sqlite3.connect(database)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


async def test_the_first_schema_migrates_with_every_record_and_field(tmp_path: Path) -> None:
    database = unpack(tmp_path)
    before = rows(database, "SELECT * FROM records ORDER BY seq")
    assert rows(database, "SELECT name FROM schema_migrations") == [("m001_records",)]
    old_records, old_conflicts = exported()
    assert len(old_records) == len(before) == 15

    async with MemoryService.open(
        Settings(), database=database, embedder=EMBEDDER, wait_for_embedder=10
    ) as memory:
        applied = [
            name
            for (name,) in await memory.engine.store.reads.fetch(
                "SELECT name FROM schema_migrations"
            )
        ]
        assert applied == [m.name for m in MIGRATIONS]
        now = {r.id: r.to_json() async for r in memory.engine.store.iter_records()}
        assert now == old_records  # every record, every field, archived and history too
        conflicts = [c.to_json() for c in await memory.engine.store.conflicts()]
        assert conflicts == old_conflicts
        assert (await diagnose(memory.engine.store)).healthy
        assert await memory.engine.store.count_needing_embedding(EMBEDDER.name) == 0
        # both indexes answer for the migrated records
        deploy = next(r for r in old_records.values() if "Fly.io" in r["content"])
        where = Filters(scope_keys=(deploy["scope_key"],), corpora=("facts",))
        lexical = await memory.engine.store.lexical("deploy github actions", where, 3)
        query = EMBEDDER.embed(["We deploy with GitHub Actions to Fly.io"])[0]
        dense = await memory.engine.store.nearest(query, EMBEDDER.name, where, 3)
        assert lexical[0].record.id == dense[0].record.id == deploy["id"]

    [backup] = [
        p async for p in anyio.Path(tmp_path).glob("memory.db.backup-*-before-m002_emphasis")
    ]
    backup = Path(backup)
    assert rows(backup, "SELECT name FROM schema_migrations") == [("m001_records",)]
    assert rows(backup, "SELECT * FROM records ORDER BY seq") == before  # restores it exactly
    restored = tmp_path / "restored" / "memory.db"
    restored.parent.mkdir()
    shutil.copy(backup, restored)
    store = await SqliteStore.open(restored)  # and it migrates again as the original did
    try:
        assert (await diagnose(store)).healthy
        assert {r.id async for r in store.iter_records()} == set(old_records)
    finally:
        await store.close()
