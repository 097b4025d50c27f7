"""Who reads what: a project's shared memories are everyone's; the global scope is each
user's own, and a private memory stays with its writer, on every read path."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.records import fact, hit_texts
from memory_mcp.errors import NotFound
from memory_mcp.service import MemoryService

pytestmark = pytest.mark.anyio


async def test_global_memories_are_personal_and_private_ones_stay_with_their_writer(
    memory: MemoryService, tmp_path: Path
) -> None:
    with MemoryService.acting_as("alice"):
        tabs = await memory.store("I prefer tabs for indentation", scope="global")
        secret = await memory.store(
            "The staging box answers on port 8443 for my own tests", private=True, cwd=tmp_path
        )
        shared = await memory.store("The staging box answers on port 8080", cwd=tmp_path)
    assert (await memory.get(tabs.id)).user == "alice"
    assert (await memory.get(secret.id)).private

    with MemoryService.acting_as("bob"):
        everywhere = await memory.search("staging box port indentation tabs", cwd=tmp_path)
        unified = await memory.unified_search("staging box port", cwd=tmp_path, threshold=0)
        project = await memory.project_search("staging box port", cwd=tmp_path)
        brief = await memory.brief(tmp_path)
        with pytest.raises(NotFound):
            await memory.forget(secret.id, cwd=tmp_path, anywhere=False)
    assert hit_texts(everywhere) == {"The staging box answers on port 8080"}
    assert hit_texts(project) == {"The staging box answers on port 8080"}
    assert {i.content for i in unified.results} == {"The staging box answers on port 8080"}
    assert "8080" in brief.text
    assert "8443" not in brief.text and "tabs" not in brief.text

    with MemoryService.acting_as("alice"):
        mine = await memory.search("staging box port indentation tabs", cwd=tmp_path)
        brief = await memory.brief(tmp_path)
    assert {tabs.id, secret.id, shared.id} <= {h.record.id for h in mine.hits}
    assert "8443" in brief.text and "tabs" in brief.text


async def test_a_fact_folds_only_into_what_the_same_people_read(
    memory: MemoryService, tmp_path: Path
) -> None:
    text = "Run the migrations before the seed script"
    with MemoryService.acting_as("alice"):
        private = await memory.store(text, private=True, cwd=tmp_path)
        personal = await memory.store("I like short commit messages", scope="global")
    with MemoryService.acting_as("bob"):
        shared = await memory.store(text, cwd=tmp_path)  # not into alice's private copy
        own = await memory.store("I like short commit messages", scope="global")
        again = await memory.store(text, cwd=tmp_path)
    assert shared.action == "inserted" and shared.id != private.id
    assert own.action == "inserted" and own.id != personal.id
    assert (again.action, again.related_id) == ("folded", shared.id)
    with MemoryService.acting_as("alice"):
        mine = await memory.store(text, private=True, cwd=tmp_path)
    assert (mine.action, mine.related_id) == ("folded", private.id)


async def test_records_of_unknown_writer_stay_readable(memory: MemoryService) -> None:
    """Global memories stored before writers were recorded (``user`` "") still reach
    whoever reads the store: they were its one user's."""
    old = fact("Always answer in English", scope="global", scope_key="")
    async with memory.engine.store.write() as tx:
        await tx.insert(old, None)
    with MemoryService.acting_as("carol"):
        found = await memory.search("answer in English", scope="global")
    assert [h.record.id for h in found.hits] == [old.id]
