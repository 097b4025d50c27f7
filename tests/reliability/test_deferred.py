"""kill -9 between a store's acknowledgement and the embedding it deferred: the
acknowledged records are there and found by their words at once, and
maintenance's re-embedding gives them every passage vector."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from helpers.processes import Workers, release
from helpers.storage import store_place, store_url
from memory_mcp.embedders.base import FakeEmbedder
from memory_mcp.passages import record_passages
from memory_mcp.scope import project_scope
from memory_mcp.service import MemoryService
from memory_mcp.storage.base import Filters

pytestmark = pytest.mark.anyio

ROUNDS = 4
WORKER = Path(__file__).with_name("worker.py")


def kill_round(workers: Workers, url: str, project: Path, rng: random.Random) -> list[str]:
    """Let a writer acknowledge a few writes, then kill -9 it; its acknowledged ids."""
    proc = workers.start(WORKER, "deferred", url, project)
    release(proc)
    acked = [proc.line().strip() for _ in range(rng.randint(2, 12))]
    time.sleep(rng.random() * 0.02)  # in the next write, or just after it
    os.kill(proc.process.pid, signal.SIGKILL)
    rest, _ = proc.finish(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return acked + [line for line in rest.split() if line.startswith("f_")]


async def test_kill_9_before_the_deferred_embedding_loses_nothing_and_converges(
    tmp_path: Path, storage_url: str, project: Path, workers: Workers
) -> None:
    settings, database = store_place(tmp_path, storage_url)
    async with MemoryService.open(settings, database=database, embedder=FakeEmbedder()):
        pass  # the schema exists before the first worker starts
    url = store_url(tmp_path, storage_url)
    rng = random.Random(11)
    acked: list[str] = []
    for _ in range(ROUNDS):
        acked.extend(kill_round(workers, url, project, rng))

    async with MemoryService.open(
        settings, database=database, embedder=FakeEmbedder(), wait_for_embedder=10
    ) as memory:
        store = memory.engine.store
        identity = memory.engine.embeddings.identity
        assert identity is not None
        records = {r.id: r for r in await store.get_many(acked)}
        assert set(acked) <= set(records), "an acknowledged write is missing"
        filters = Filters(scope_keys=(project_scope(project).key,), corpora=("facts",))
        for record_id in acked:  # found by its words at once, and by its whole text's vector
            number = records[record_id].content.split(":")[0].split()[-1]
            hits = await store.lexical(f"Deferred fact {number}", filters, 3)
            assert record_id in [h.record.id for h in hits]
            assert records[record_id].embedder == identity
            vectors = await store.vectors_of(record_id, identity)
            assert vectors is not None and len(vectors) >= 1
        assert await store.count_needing_embedding(identity) >= len(acked)  # windows due
        assert await store.count_needing_embedding(identity, incomplete=False) == 0

        summary = await memory.reembed()  # what maintenance's reembed task runs

        assert summary.remaining == 0 and summary.embedded >= len(acked)
        assert await store.count_needing_embedding(identity) == 0
        for record in await store.get_many(acked):
            vectors = await store.vectors_of(record.id, identity)
            expected = record_passages(record.content, [m.content for m in record.merged_from])
            assert vectors is not None and len(vectors) == len(expected) > 1
        assert (await memory.doctor()).healthy
    print(f"deferred: {ROUNDS} kill -9 rounds, {len(acked)} acknowledged, all converged")
