"""The write pipeline and retrieval with the real model (all-MiniLM-L6-v2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memory_mcp.embedders.fastembed import FastEmbedEmbedder
from memory_mcp.service import MemoryService

pytestmark = pytest.mark.anyio


async def test_the_three_decisions_with_real_embeddings(
    real_memory: MemoryService, project: Path
) -> None:
    first = await real_memory.store("We deploy with GitHub Actions to Fly.io", cwd=project)
    folded = await real_memory.store(
        "Deploys to production go out via GitHub Actions onto Fly.io", cwd=project
    )
    assert folded.action == "folded" and folded.related_id == first.id
    canonical = await real_memory.get(folded.id)
    assert (
        canonical.fold_count == 1
        and canonical.merged_from[0].content == "We deploy with GitHub Actions to Fly.io"
    )

    ios15 = await real_memory.store("The pigeon app's minimum iOS version is 15.", cwd=project)
    ios16 = await real_memory.store("The pigeon app's minimum iOS version is 16.", cwd=project)
    assert ios16.action == "superseded" and ios16.related_id == ios15.id
    assert (await real_memory.get(ios15.id)).replaced_by == ios16.id

    x = await real_memory.store("Run tests with pytest -x", cwd=project)
    never = await real_memory.store("Never run tests with -x", cwd=project)
    assert never.action == "conflict" and never.related_id == x.id


async def test_a_detail_in_the_middle_of_a_long_memory_is_found(
    real_memory: MemoryService, project: Path
) -> None:
    long_text = (
        "Today I spent most of the afternoon reorganising the garage shelves and sorting out "
        "the paint cans, which took far longer than expected because half of them were dried "
        "out. By the way, I volunteered at the Walk for Wildlife charity event in June and "
        "raised money for the local nature reserve. After that I cooked a big pot of chili "
        "for the week and watched two episodes of a documentary about deep sea creatures."
    )
    target = await real_memory.store(long_text, cwd=project)
    for i, filler in enumerate(
        [
            "I need a recipe for vegetarian lasagna with spinach.",
            "My laptop battery drains quickly when I run video calls.",
            "Can you recommend running shoes for flat feet?",
            "I'm planning a trip to Kyoto in the autumn.",
        ]
    ):
        await real_memory.store(filler, cwd=project, tags=[f"filler-{i}"])
    hits = (await real_memory.search("Which charity event did I volunteer at?", cwd=project)).hits
    assert hits[0].record.id == target.id


async def test_similar_wording_across_projects_stays_apart(
    real_memory: MemoryService, project: Path, other_project: Path
) -> None:
    await real_memory.store("The API listens on port 8080", cwd=project)
    other = await real_memory.store("The API listens on port 9090", cwd=other_project)
    assert other.action == "inserted"
    hits = (await real_memory.search("which port does the API use", cwd=project)).hits
    assert [h.record.content for h in hits] == ["The API listens on port 8080"]


def test_the_models_threads_sleep_when_idle(real_embedder: FastEmbedEmbedder) -> None:
    """Spinning onnxruntime threads would hold a core the vector search wants."""
    import onnxruntime as ort

    real_embedder.load()
    assert real_embedder._direct is not None  # the model runs on onnxruntime directly
    options = real_embedder._direct.session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert ort.SessionOptions().get_session_config_entry  # the class is the original again
    assert type(ort.SessionOptions()) is ort.capi.onnxruntime_pybind11_state.SessionOptions


async def test_an_unrelated_question_gets_no_padding(
    real_memory: MemoryService, project: Path
) -> None:
    """With nothing relevant stored, a search answers with nothing rather than filler."""
    from memory_mcp.bench.perf import generate
    from memory_mcp.service import StoreRequest

    await real_memory.store_many(
        [StoreRequest(text, kind=kind, cwd=project) for kind, text, _ in generate(120)]
    )
    for question in ("What is the capital of France?", "What's your favourite pizza topping?"):
        found = await real_memory.search(question, cwd=project)
        assert found.mode == "hybrid" and found.hits == [], [h.record.content for h in found.hits]
    related = await real_memory.search("which port does the API listen on", cwd=project)
    assert related.hits, "a related question still finds what there is"
