"""Availability tiering: auto picks the best present, never silently downgrades or churns."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from helpers.storage import store_place
from helpers.waiting import eventually
from memory_mcp.config import EmbedderSettings
from memory_mcp.embedders.base import FakeEmbedder, Matrix
from memory_mcp.embedders.runtime import Embeddings
from memory_mcp.errors import EmbedderError, ModelNotLocal
from memory_mcp.service import MemoryService

pytestmark = pytest.mark.anyio


class Unavailable(FakeEmbedder):
    """An embedder whose model cannot be loaded (or whose endpoint is down)."""

    def __init__(self, name: str, error: type[EmbedderError] = EmbedderError) -> None:
        super().__init__(name=name)
        self.error = error
        self.up = False

    def load(self, *, download: bool = False) -> None:
        if not self.up:
            raise self.error(f"{self.name} is unreachable")

    def embed(self, texts: Sequence[str]) -> Matrix:
        if not self.up:
            raise EmbedderError(f"{self.name} is unreachable")
        return super().embed(texts)


async def open_with(
    tmp_path: Path, storage_url: str, embedder: FakeEmbedder, backend: str = "auto"
) -> MemoryService:
    settings, database = store_place(tmp_path, storage_url, "m")
    settings.embedder.backend = backend  # type: ignore[assignment]
    context = MemoryService.open(
        settings, database=database, embedder=embedder, wait_for_embedder=10
    )
    service = await context.__aenter__()
    service._context = context  # type: ignore[attr-defined]
    return service


async def close(service: MemoryService) -> None:
    await service._context.__aexit__(None, None, None)  # type: ignore[attr-defined]


async def test_no_model_means_the_bm25_floor_and_status_says_so(
    tmp_path: Path, storage_url: str, project: Path
) -> None:
    memory = await open_with(tmp_path, storage_url, Unavailable("fastembed:missing"))
    try:
        status = memory.engine.embeddings.status()
        assert status.effective == "bm25" and status.degraded and "unreachable" in status.reason
        stored = await memory.store("The build uses Bazel remote caching", cwd=project)
        assert not stored.embedded
        found = await memory.search("bazel caching", cwd=project)
        assert found.mode == "lexical" and [h.record.id for h in found.hits] == [stored.id]
        assert any("lexical search only" in w for w in found.warnings)
    finally:
        await close(memory)


async def test_a_dense_store_keeps_its_embedder_identity_while_it_is_unreachable(
    tmp_path: Path, storage_url: str, project: Path
) -> None:
    memory = await open_with(tmp_path, storage_url, FakeEmbedder(name="fake:a"))
    stored = await memory.store("Staging runs on Fly.io", cwd=project)
    await close(memory)

    # The configured auto embedder is now another one: upgrade-only keeps fake:a.
    memory = await open_with(tmp_path, storage_url, FakeEmbedder(name="fake:b"))
    try:
        status = memory.engine.embeddings.status()
        assert status.identity == "fake:a" and status.degraded
        assert "not configured" in status.reason
        found = await memory.search("staging fly", cwd=project)
        assert found.mode == "lexical" and [h.record.id for h in found.hits] == [stored.id]
        assert (await memory.get(stored.id)).embedder == "fake:a"  # nothing churned
    finally:
        await close(memory)


async def test_a_store_of_the_other_precision_says_embedder_quantize_is_why(
    tmp_path: Path, storage_url: str, project: Path
) -> None:
    """Vectors of the model's int8 copy are another embedder's: turning
    ``embedder.quantize`` on (or off) under ``auto`` keeps the store's vectors and
    says that the setting is the difference."""
    memory = await open_with(tmp_path, storage_url, FakeEmbedder(name="fake:a"))
    await memory.store("Staging runs on Fly.io", cwd=project)
    await close(memory)
    for quantize, name, said in [
        (True, "fake:a:int8", "embedder.quantize is on; they were made without it"),
        (False, "fake:b", None),
    ]:
        settings, database = store_place(tmp_path, storage_url, "m")
        settings.embedder.quantize = quantize
        async with MemoryService.open(
            settings, database=database, embedder=FakeEmbedder(name=name), wait_for_embedder=10
        ) as memory:
            status = memory.engine.embeddings.status()
            assert status.identity == "fake:a" and "not configured" in status.reason
            assert (said in status.reason) if said else "quantize" not in status.reason

    settings, database = store_place(tmp_path, storage_url, "int8")
    settings.embedder.quantize = True
    async with MemoryService.open(
        settings, database=database, embedder=FakeEmbedder(name="fake:a:int8"), wait_for_embedder=10
    ) as memory:
        await memory.store("Staging runs on Fly.io", cwd=project)
    settings.embedder.quantize = False
    async with MemoryService.open(
        settings, database=database, embedder=FakeEmbedder(name="fake:a"), wait_for_embedder=10
    ) as memory:
        status = memory.engine.embeddings.status()
        assert status.identity == "fake:a:int8"
        assert "embedder.quantize is off; they were made with it" in status.reason


async def test_an_unreachable_embedder_resumes_when_it_returns(
    tmp_path: Path, storage_url: str, project: Path
) -> None:
    memory = await open_with(tmp_path, storage_url, FakeEmbedder(name="fake:a"))
    await memory.store("Staging runs on Fly.io", cwd=project)
    await close(memory)

    flaky = Unavailable("fake:a")
    memory = await open_with(tmp_path, storage_url, flaky)
    try:
        assert memory.engine.embeddings.status().identity == "fake:a"
        assert memory.engine.embeddings.status().state == "unavailable"
        late = await memory.store("Production runs on AWS", cwd=project)
        assert not late.embedded
        assert (await memory.status()).awaiting_embedding == 1
        flaky.up = True
        memory.engine.embeddings._retry_at = 0  # the backoff has passed
        await memory.engine.embeddings.embed(["wake up"])  # triggers the retry
        assert await memory.engine.embeddings.wait_settled(10)

        async def ready() -> bool:  # the retry loads it on a thread
            return memory.engine.embeddings.ready

        await eventually(ready, within=10, what="the embedder to be ready after the retry")
        assert memory.engine.embeddings.ready
        summary = await memory.reembed()
        assert summary.embedded == 1 and summary.remaining == 0
        assert (await memory.search("production aws", cwd=project)).mode == "hybrid"
    finally:
        await close(memory)


async def test_an_explicit_backend_switches_and_reembed_converges(
    tmp_path: Path, storage_url: str, project: Path
) -> None:
    memory = await open_with(tmp_path, storage_url, FakeEmbedder(name="fake:a"))
    for i in range(5):
        await memory.store(f"Service {i} listens on port {8000 + i}", cwd=project)
    await close(memory)

    memory = await open_with(
        tmp_path, storage_url, FakeEmbedder(name="fake:b", dim=64), backend="fastembed"
    )
    try:
        assert memory.engine.embeddings.identity == "fake:b"
        assert (await memory.status()).awaiting_embedding == 5
        seen: list[tuple[int, int]] = []
        summary = await memory.reembed(batch_size=2, progress=lambda d, t: seen.append((d, t)))
        assert (summary.embedded, summary.remaining) == (5, 0)
        assert seen == [(2, 5), (4, 5), (5, 5)]  # each batch written as the next embeds
        stats = await memory.engine.store.stats()
        assert stats.embedders == {"fake:b": 5}
        assert (await memory.search("service port", cwd=project)).mode == "hybrid"
    finally:
        await close(memory)


async def test_reembed_without_an_embedder_says_why(tmp_path: Path, storage_url: str) -> None:
    memory = await open_with(tmp_path, storage_url, Unavailable("fake:down"))
    try:
        with pytest.raises(EmbedderError, match="no embedder is ready"):
            await memory.reembed()
    finally:
        await close(memory)


async def test_a_model_that_must_be_downloaded_does_not_hold_up_the_first_answer() -> None:
    missing = Unavailable("fastembed:not-cached", error=ModelNotLocal)
    embeddings = Embeddings(EmbedderSettings(), candidates=[missing])
    embeddings.start({})
    assert await embeddings.wait_settled(10)
    status = embeddings.status()
    assert status.effective == "bm25" and status.degraded
    assert await embeddings.embed(["x"]) is None
    # Once the download attempt failed too, the reason says so once, not once per attempt.
    assert embeddings._loader is not None
    await anyio.to_thread.run_sync(embeddings._loader.join, 10)
    status = embeddings.status()
    assert status.state == "unavailable"
    assert status.reason.count("fastembed:not-cached is unreachable") == 1


class Downloadable(FakeEmbedder):
    """A model that is not cached but downloads (when the test lets it)."""

    def __init__(self) -> None:
        super().__init__(name="fastembed:downloadable")
        self.downloaded = threading.Event()

    def load(self, *, download: bool = False) -> None:
        if not download:
            raise ModelNotLocal(f"{self.name} is not cached")
        if not self.downloaded.wait(10):
            raise EmbedderError("download timed out")


async def test_work_that_needs_vectors_can_wait_for_the_download() -> None:
    model = Downloadable()
    embeddings = Embeddings(EmbedderSettings(), candidates=[model])
    embeddings.start({})
    assert await embeddings.wait_settled(10)  # the cache miss settles at once: go on lexically
    assert not embeddings.ready and embeddings.status().state == "loading"
    model.downloaded.set()
    assert await embeddings.wait_loaded(10)
    assert embeddings.status().effective == "fastembed:downloadable"


async def test_bm25_backend_uses_no_vectors(
    tmp_path: Path, storage_url: str, project: Path
) -> None:
    settings, database = store_place(tmp_path, storage_url, "m")
    settings.embedder.backend = "bm25"
    async with MemoryService.open(settings, database=database) as memory:
        status = memory.engine.embeddings.status()
        assert status.effective == "bm25" and not status.degraded and status.state == "off"
        stored = await memory.store("Lint with ruff", cwd=project)
        assert not stored.embedded
