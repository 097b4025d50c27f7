"""A store embeds once on its hot path: its whole text. Its other passages follow
after the answer; an exact repeat is not embedded at all."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from helpers.storage import store_place
from memory_mcp.config import Settings
from memory_mcp.embedders.base import FakeEmbedder, Matrix
from memory_mcp.passages import record_passages, split_passages
from memory_mcp.service import MemoryService, StoreRequest
from memory_mcp.storage.base import Store
from memory_mcp.write import apply, prepare

pytestmark = pytest.mark.anyio

LONG = (
    "The billing service retries a failed charge three times with a growing delay. "
    "After the third failure it opens a ticket for the finance team and stops. "
    "Refunds go through the same queue but never retry on their own."
)


class Recording(FakeEmbedder):
    """The fake embedder, keeping every text it was asked to embed."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def embed(self, texts: Sequence[str]) -> Matrix:
        self.texts.extend(texts)
        return super().embed(texts)


async def rows(store: Store, record_id: str, identity: str) -> int:
    """How many passage vectors the record holds."""
    vectors = await store.vectors_of(record_id, identity)
    return 0 if vectors is None else len(vectors)


@pytest.fixture
async def recorded(
    tmp_path: Path, settings: Settings, storage_url: str
) -> AsyncIterator[tuple[MemoryService, Recording]]:
    settings, database = store_place(tmp_path, storage_url, settings=settings)
    embedder = Recording()
    async with MemoryService.open(
        settings, database=database, embedder=embedder, wait_for_embedder=10
    ) as service:
        yield service, embedder


async def test_a_store_embeds_its_whole_text_and_its_windows_after_the_answer(
    recorded: tuple[MemoryService, Recording], project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memory_mcp import engine as engine_module

    # no quiet comes before the close, however slowly a loaded machine runs this test
    monkeypatch.setattr(engine_module, "_QUIET_S", 3600)
    memory, embedder = recorded
    passages = split_passages(LONG)
    assert len(passages) > 2
    store, identity = memory.engine.store, memory.engine.embeddings.identity
    assert identity is not None

    result = await memory.store(LONG, cwd=project)

    assert embedder.texts == [LONG]  # the hot path: one embedding
    assert result.embedded
    assert await rows(store, result.id, identity) == 1
    assert await store.count_needing_embedding(identity) == 1  # the windows are due
    assert await store.count_needing_embedding(identity, incomplete=False) == 0
    found = await memory.search("opens a ticket for the finance team", cwd=project)
    assert [h.record.id for h in found.hits][:1] == [result.id]
    assert found.warnings == []  # found densely already: nothing to warn about
    before = len(embedder.texts)

    await memory.engine.finish_deferred(10)

    # after the answer, its windows: the whole text is embedded once, on the hot path
    assert embedder.texts[before:] == passages[1:]
    held = await store.vectors_of(result.id, identity)
    assert held is not None and len(held) == len(passages)
    assert np.allclose(held, FakeEmbedder().embed(passages), atol=1e-5)  # every passage, in order
    assert await store.count_needing_embedding(identity) == 0


async def test_a_fold_holder_s_deferred_passages_are_all_embedded_again(
    recorded: tuple[MemoryService, Recording], project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record that holds other rows than its whole text's (a fold's) is not given its
    windows after them: every passage of it and of what it absorbed is embedded again."""
    from memory_mcp import engine as engine_module

    monkeypatch.setattr(engine_module, "_QUIET_S", 3600)
    memory, embedder = recorded
    store, identity = memory.engine.store, memory.engine.embeddings.identity
    assert identity is not None
    first = await memory.store(LONG, cwd=project)
    await memory.engine.finish_deferred(10)
    again = await memory.store(LONG.replace("three times", "three times over"), cwd=project)
    assert again.action == "folded" and again.id != first.id
    before = len(embedder.texts)
    await memory.engine.finish_deferred(10)
    holder = await memory.get(again.id)
    wanted = record_passages(holder.content, [m.content for m in holder.merged_from])
    assert embedder.texts[before:] == wanted
    held = await store.vectors_of(again.id, identity)
    assert held is not None and len(held) == len(wanted)
    assert await store.count_needing_embedding(identity) == 0


async def test_the_deferred_passages_are_embedded_once_the_engine_is_quiet(
    recorded: tuple[MemoryService, Recording], project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memory_mcp import engine as engine_module

    monkeypatch.setattr(engine_module, "_QUIET_S", 0.01)
    memory, _ = recorded
    identity = memory.engine.embeddings.identity
    assert identity is not None
    result = await memory.store(LONG, cwd=project)
    task = memory.engine._completing
    assert task is not None
    await task  # the background task, started by the store, ends once it is done
    assert await rows(memory.engine.store, result.id, identity) == len(split_passages(LONG))
    assert await memory.engine.store.count_needing_embedding(identity) == 0


async def test_a_search_holds_the_deferred_passages_back_as_a_store_does(
    recorded: tuple[MemoryService, Recording], project: Path
) -> None:
    """The windows wait for a pause in searches too: embedded between them, they made
    each search wait for the model."""
    memory, _ = recorded
    await memory.store(LONG, cwd=project)
    engine = memory.engine
    engine._active_at = time.monotonic() - 3600  # as if the store were an hour ago
    await memory.search("finance team", cwd=project)
    assert time.monotonic() - engine._active_at < 60
    await memory.unified_search("finance team", cwd=project)  # every search that embeds
    engine._active_at = time.monotonic() - 3600
    await memory.unified_search("finance team", cwd=project)
    assert time.monotonic() - engine._active_at < 60


def test_a_burst_of_stores_keeps_the_model_until_it_pauses() -> None:
    """Stores that keep coming find the model free: the windows they defer wait for a
    pause, unless a thousand records wait or the oldest has waited a minute."""
    from memory_mcp.engine import embed_due_now

    assert not embed_due_now(0.01, 300, 4.0)  # 300 stores in 4 s, no pause
    assert not embed_due_now(0.2, 999, 59.0)
    assert embed_due_now(0.25, 1, 0.25)  # a quarter of a second without a call
    assert embed_due_now(0.0, 1000, 10.0)
    assert embed_due_now(0.0, 2, 60.0)


async def test_a_batch_embeds_every_passage_at_once(
    recorded: tuple[MemoryService, Recording], project: Path
) -> None:
    memory, embedder = recorded
    other = "Deploys go out on Tuesdays only. Fridays are frozen for releases of any kind."
    results = await memory.store_many(
        [StoreRequest(LONG, cwd=project), StoreRequest(other, cwd=project)]
    )
    assert sorted(embedder.texts) == sorted([*split_passages(LONG), *split_passages(other)])
    identity = memory.engine.embeddings.identity
    assert identity is not None
    assert await memory.engine.store.count_needing_embedding(identity) == 0
    assert all(r.embedded for r in results)


async def test_an_exact_repeat_costs_no_embedding_and_keeps_its_vectors(
    recorded: tuple[MemoryService, Recording], project: Path
) -> None:
    memory, embedder = recorded
    first = await memory.store(LONG, cwd=project)
    await memory.engine.finish_deferred(10)
    embedded = len(embedder.texts)

    again = await memory.store(LONG.upper().replace(".", " . "), cwd=project)

    assert len(embedder.texts) == embedded  # not embedded, now or later
    assert again.action == "folded" and again.related_id == first.id and again.embedded
    identity = memory.engine.embeddings.identity
    assert identity is not None
    vectors = await memory.engine.store.vectors_of(again.id, identity)
    assert vectors is not None and len(vectors) == len(split_passages(LONG))
    assert await memory.engine.store.count_needing_embedding(identity) == 0
    await memory.engine.finish_deferred(10)
    assert len(embedder.texts) == embedded


async def test_a_repeat_whose_record_changed_meanwhile_is_embedded_under_the_lock(
    recorded: tuple[MemoryService, Recording], project: Path
) -> None:
    memory, embedder = recorded
    engine = memory.engine
    identity = engine.embeddings.identity
    draft = prepare(
        LONG,
        kind="fact",
        scope=(await engine.project(project)).scope,
        importance=None,
        tags=(),
        agent="test",
        at=engine.clock(),
        settings=engine.settings.write,
    )
    asked: list[str] = []

    async def late(text: str) -> list[Matrix] | None:
        asked.append(text)
        return await engine.embed_records([text], whole_only=True)

    async with engine.store.write() as tx:  # nothing to repeat: the one it repeated is gone
        result = await apply(
            tx, draft, None, embedder=identity, fold_settings=engine.settings.fold,
            now="2026-01-01T00:00:00Z", embed_late=late,
        )  # fmt: skip

    assert asked == [LONG] and embedder.texts == [LONG]
    assert result.action == "inserted" and result.embedded and draft.vectors_due
    assert identity is not None
    assert await rows(engine.store, result.id, identity) == 1


@pytest.mark.sqlite_only  # Postgres deletes a retired record's vectors as it retires it
async def test_a_retired_records_vector_rows_are_deleted_once_the_engine_is_quiet(
    recorded: tuple[MemoryService, Recording], project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its commit only announces them gone (``vectors.announce_retired``); the engine
    deletes them at the quiet after the next store or search, or as it closes."""
    from memory_mcp import engine as engine_module

    monkeypatch.setattr(engine_module, "_QUIET_S", 0.01)
    memory, _ = recorded
    store = memory.engine.store

    async def vec0_rows() -> int:
        return sum(int(row[3]) for row in (await store.stats()).vector_indexes)

    first = await memory.store("The cache holds the last 500 builds", cwd=project)
    second = await memory.store("Releases are tagged from the main branch", cwd=project)
    await memory.engine.finish_deferred(10)
    before = await vec0_rows()
    await memory.forget(first.id, cwd=project)
    assert store.vectors_to_sweep
    assert await vec0_rows() == before  # the forget's commit left them
    await memory.search("releases", cwd=project)  # the engine is active: then quiet
    task = memory.engine._completing
    assert task is not None
    await task
    assert not store.vectors_to_sweep
    assert await vec0_rows() == before - 1

    await memory.forget(second.id, cwd=project)
    assert store.vectors_to_sweep
    await memory.engine.finish_deferred(10)  # what a closing engine does
    assert not store.vectors_to_sweep
    assert await vec0_rows() == before - 2


@pytest.mark.sqlite_only
async def test_a_sweep_that_fails_is_not_tried_again_at_every_search(
    recorded: tuple[MemoryService, Recording],
    project: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A store that cannot delete them now (read-only, say) is asked again a minute
    later, not by every search; the retired rows stay gone for every reader."""
    from memory_mcp import engine as engine_module
    from memory_mcp.errors import StorageError

    monkeypatch.setattr(engine_module, "_QUIET_S", 0.01)
    memory, _ = recorded
    store = memory.engine.store
    gone = await memory.store("The cache holds the last 500 builds", cwd=project)
    await memory.engine.finish_deferred(10)
    await memory.forget(gone.id, cwd=project)
    tried: list[int] = []

    async def refuse(most: int) -> int:
        tried.append(most)
        raise StorageError("attempt to write a readonly database")

    monkeypatch.setattr(store, "sweep_vectors", refuse)
    for _ in range(3):
        found = await memory.search("cache builds", cwd=project)
        assert gone.id not in [h.record.id for h in found.hits]
        task = memory.engine._completing
        assert task is not None
        await task
    assert len(tried) == 1
    assert "could not delete the vectors of retired records" in caplog.text
    assert store.vectors_to_sweep
