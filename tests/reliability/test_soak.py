"""Eight processes storing and searching one store at once for a bounded time."""

from __future__ import annotations

import json
import statistics
import uuid
from pathlib import Path

import pytest
from worker import SHARED

from helpers import postgres
from helpers.git import bare_with_clones
from helpers.postgres import as_role, drop_roles
from helpers.processes import Workers, release
from helpers.storage import store_place, store_url
from memory_mcp.config import Settings
from memory_mcp.embedders.base import FakeEmbedder
from memory_mcp.service import MemoryService

pytestmark = pytest.mark.anyio

PROCESSES = 8
SECONDS = 8
WORKER = Path(__file__).with_name("worker.py")


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) > 1 else 0.0


async def test_eight_processes_lose_nothing_and_fold_shared_facts_once(
    tmp_path: Path, storage_url: str, project: Path, workers: Workers
) -> None:
    settings, database = store_place(tmp_path, storage_url)
    async with MemoryService.open(settings, database=database, embedder=FakeEmbedder()):
        pass
    url = store_url(tmp_path, storage_url)
    procs = [
        workers.start(WORKER, "soak", url, project, SECONDS, f"agent{i}") for i in range(PROCESSES)
    ]
    release(*procs)
    results = []
    for proc in procs:
        out, err = proc.finish(timeout=SECONDS + 120)
        assert proc.returncode == 0, err
        assert "not counted" not in err, err  # a search's access count lost to the lock
        results.append(json.loads(out.strip().splitlines()[-1]))

    errors = [e for r in results for e in r["errors"]]
    assert errors == [], errors[0]  # no "database is locked" (or anything) reached a caller
    acked = [i for r in results for i in r["acked"]]
    store_ms = [t for r in results for t in r["store_ms"]]
    search_ms = [t for r in results for t in r["search_ms"]]
    print(
        f"soak: {PROCESSES} processes, {SECONDS} s, {len(store_ms)} stores "
        f"(p95 {p95(store_ms):.1f} ms, max {max(store_ms):.1f}), {len(search_ms)} searches "
        f"(p95 {p95(search_ms):.1f} ms), 0 errors"
    )
    assert len(store_ms) > PROCESSES * 5 and search_ms
    assert max(store_ms) < Settings().storage.busy_timeout_ms  # nobody waited out the lock

    async with MemoryService.open(
        settings, database=database, embedder=FakeEmbedder(), wait_for_embedder=10
    ) as memory:
        records = {r.id: r async for r in memory.engine.store.iter_records()}
        assert set(acked) <= set(records), "an acknowledged write is missing"
        current = [r for r in records.values() if r.current]
        for wordings in SHARED:  # each shared fact ends as one canonical record
            canonical = [r for r in current if r.content in wordings]
            assert len(canonical) == 1, (wordings, [r.content for r in canonical])
            held = {m.id for m in canonical[0].merged_from} | {canonical[0].id}
            stored = {i for i in acked if records[i].content in wordings}
            assert stored <= held  # every write of it is the canonical or folded into it
        assert (await memory.doctor()).healthy


async def test_users_on_several_machines_share_the_project_and_keep_the_personal_apart(
    tmp_path: Path, storage_url: str, workers: Workers
) -> None:
    """Two users, each on two "machines" (clones of one remote), store and search one
    store at once. On Postgres each connects with a role of their own (row-level
    security); on SQLite each process acts as its user. No acknowledged write is lost,
    each shared fact ends as one canonical record, every personal record is its
    writer's, and no search returned anyone a personal memory of another."""
    _, clones = bare_with_clones(tmp_path, "a1", "a2", "b1", "b2")
    suffix = uuid.uuid4().hex[:8]
    users = {clone: f"{clone.name[0]}user_{suffix}" for clone in clones}
    settings, database = store_place(tmp_path, storage_url)
    team = postgres.is_postgres(storage_url)
    async with MemoryService.open(settings, database=database, embedder=FakeEmbedder()) as admin:
        if team:
            await admin.prepare_team()
            for user in sorted(set(users.values())):
                await admin.add_member(user)
    url = store_url(tmp_path, storage_url)
    try:
        procs = [
            workers.start(
                WORKER,
                "soak",
                as_role(url, user) if team else url,
                clone,
                SECONDS,
                f"agent-{clone.name}",
                user,
            )
            for clone, user in users.items()
        ]
        release(*procs)
        results = []
        for proc in procs:
            out, err = proc.finish(timeout=SECONDS + 120)
            assert proc.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
        assert [e for r in results for e in r["errors"]] == []
        assert [r["user"] for r in results] == list(users.values())
        assert [i for r in results for i in r["leaks"]] == []
        async with MemoryService.open(
            settings, database=database, embedder=FakeEmbedder(), wait_for_embedder=10
        ) as memory:
            records = {r.id: r async for r in memory.engine.store.iter_records()}
            for result in results:
                assert set(result["acked"]) <= set(records), "an acknowledged write is missing"
                assert result["personal"], "no personal write was made"
                for record_id in result["personal"]:
                    record = records[record_id]
                    assert record.user == result["user"] and record.personal
            for holder in records.values():  # a personal write folds only into its own kind
                for entry in holder.merged_from:
                    folded = records.get(entry.id)
                    if folded is not None and folded.personal:
                        assert holder.personal and holder.user == folded.user
            current = [r for r in records.values() if r.current]
            for wordings in SHARED:
                canonical = [r for r in current if r.content in wordings]
                assert len(canonical) == 1, (wordings, [r.content for r in canonical])
                assert not canonical[0].personal
            assert (await memory.doctor()).healthy
        print(
            f"team soak: {len(users)} processes, {len(set(users.values()))} users, "
            f"{sum(len(r['acked']) for r in results)} stores, "
            f"{sum(len(r['personal']) for r in results)} personal, 0 leaks"
        )
    finally:
        if team:
            await drop_roles(url, *sorted(set(users.values())))
