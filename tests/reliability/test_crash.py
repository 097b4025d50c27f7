"""kill -9 in the middle of writes, and of a migration: nothing acknowledged is lost."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from helpers.processes import Workers, release
from memory_mcp.config import Settings
from memory_mcp.embedders.base import FakeEmbedder
from memory_mcp.service import MemoryService
from memory_mcp.storage.sqlite import SqliteStore
from memory_mcp.storage.sqlite.doctor import diagnose

pytestmark = [pytest.mark.anyio, pytest.mark.sqlite_only]  # the file after kill -9

ROUNDS = 8
WORKER = Path(__file__).with_name("worker.py")


def integrity(database: Path) -> list[str]:
    conn = sqlite3.connect(database)
    try:
        return [row[0] for row in conn.execute("PRAGMA integrity_check")]
    finally:
        conn.close()


def crash_round(workers: Workers, database: Path, project: Path, rng: random.Random) -> list[str]:
    """Let a writer acknowledge a few writes, then kill -9 it mid-write; its acks."""
    proc = workers.start(WORKER, "crash", f"sqlite://{database}", project)
    release(proc)
    acked = [proc.line().strip() for _ in range(rng.randint(3, 30))]
    time.sleep(rng.random() * 0.02)  # land somewhere inside the next write
    os.kill(proc.process.pid, signal.SIGKILL)
    rest, _ = proc.finish(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return acked + [line for line in rest.split() if line.startswith("f_")]


async def test_kill_9_during_writes_loses_no_acknowledged_write(
    tmp_path: Path, project: Path, workers: Workers
) -> None:
    database = tmp_path / "memory.db"
    async with MemoryService.open(Settings(), database=database, embedder=FakeEmbedder()):
        pass  # the schema exists before the first worker starts
    rng = random.Random(7)
    acked: list[str] = []
    for _ in range(ROUNDS):
        acked.extend(crash_round(workers, database, project, rng))
    assert integrity(database) == ["ok"]
    store = await SqliteStore.open(database)
    try:
        found = {r.id async for r in store.iter_records()}
        assert set(acked) <= found, f"lost {len(set(acked) - found)} acknowledged writes"
        print(f"crash: {ROUNDS} kill -9 rounds, {len(acked)} acknowledged writes, all present")
        diagnosis = await diagnose(store)
        assert diagnosis.healthy and all(c.ok for c in diagnosis.checks), diagnosis.to_json()
    finally:
        await store.close()


async def test_a_migration_killed_half_way_leaves_the_schema_it_had(
    tmp_path: Path, workers: Workers
) -> None:
    database = tmp_path / "memory.db"
    async with MemoryService.open(Settings(), database=database, embedder=FakeEmbedder()) as m:
        await m.store("Kept across the crash", cwd=tmp_path)
    proc = workers.start(WORKER, "migrate", database)
    release(proc)
    assert proc.line().strip() == "inside"
    os.kill(proc.process.pid, signal.SIGKILL)
    proc.finish(timeout=30)
    assert integrity(database) == ["ok"]
    conn = sqlite3.connect(database)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        applied = [r[0] for r in conn.execute("SELECT name FROM schema_migrations")]
    finally:
        conn.close()
    assert "half_done" not in tables and "m999_slow" not in applied  # none of it, not half
    async with MemoryService.open(Settings(), database=database, embedder=FakeEmbedder()) as m:
        assert [r.content async for r in m.engine.store.iter_records()] == ["Kept across the crash"]
