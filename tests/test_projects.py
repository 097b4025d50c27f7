"""One project, one memory: worktrees and clones share it, earlier path keys become aliases."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.git import bare_with_clones, git, repository
from helpers.records import fact, hit_texts
from helpers.storage import store_place
from memory_mcp.config import Settings
from memory_mcp.embedders.base import FakeEmbedder
from memory_mcp.errors import InvalidInput, NotFound
from memory_mcp.service import MemoryService

pytestmark = pytest.mark.anyio


async def test_two_worktrees_of_one_repository_share_memories(
    memory: MemoryService, tmp_path: Path
) -> None:
    repo = repository(tmp_path / "repo")
    feature = tmp_path / "feature"
    git(repo, "worktree", "add", "-q", "-b", "feature", str(feature))
    stored = await memory.store("Releases are cut from the main branch on Fridays", cwd=repo)
    found = await memory.search("when are releases cut", cwd=feature)
    assert "Releases are cut from the main branch on Fridays" in hit_texts(found)
    again = await memory.store("Releases are cut from the main branch on Fridays", cwd=feature)
    assert (again.action, again.related_id) == ("folded", stored.id)


async def test_two_clones_of_one_remote_share_memories(
    memory: MemoryService, tmp_path: Path
) -> None:
    _, (alice, bob) = bare_with_clones(tmp_path, "alice", "bob")
    await memory.store("The staging database is rebuilt every night", cwd=alice)
    assert "The staging database is rebuilt every night" in hit_texts(
        await memory.search("staging database", cwd=bob)
    )
    brief = await memory.brief(bob)
    assert "The staging database is rebuilt every night" in brief.text


async def _path_keyed_store(
    tmp_path: Path, settings: Settings, storage_url: str, keys: dict[str, str]
) -> tuple[Settings, Path | None]:
    """A store as the code before identities left it: records under path keys."""
    settings, database = store_place(tmp_path, storage_url, "old", settings=settings)
    opened = MemoryService.open(settings, database=database, embedder=FakeEmbedder())
    async with opened as old, old.engine.store.write() as tx:
        for content, key in keys.items():
            await tx.insert(fact(content, scope_key=key), None)
    return settings, database


async def test_a_path_keyed_store_migrates_with_every_record_findable(
    tmp_path: Path, settings: Settings, storage_url: str
) -> None:
    repo = repository(tmp_path / "repo", origin="git@github.com:org/app.git")
    feature = tmp_path / "feature"
    git(repo, "worktree", "add", "-q", "-b", "feature", str(feature))
    old_keys = {
        "The API gateway times out after 30 seconds": str(repo.resolve()),
        "Feature flags live in flags.yaml": str(feature.resolve()),
        "Another project's secret sauce": str((tmp_path / "elsewhere").resolve()),
    }
    settings, database = await _path_keyed_store(tmp_path, settings, storage_url, old_keys)
    async with MemoryService.open(settings, database=database, embedder=FakeEmbedder()) as new:
        project = await new.project(repo / ".")
        assert (project.key, project.identity.how) == ("github.com/org/app", "remote")
        assert set(project.scope.aliases) == {str(repo.resolve()), str(feature.resolve())}
        found = hit_texts(await new.search("API gateway and feature flags", cwd=feature, limit=10))
        assert found == {
            "The API gateway times out after 30 seconds",
            "Feature flags live in flags.yaml",
        }
        brief = (await new.brief(repo)).text
        assert "The API gateway times out" in brief and "flags.yaml" in brief
        assert "secret sauce" not in brief
        # A write goes under the new key; a repeat of a record under an alias folds into it.
        stored = await new.store("Feature flags live in flags.yaml", cwd=repo)
        assert stored.action == "folded" and stored.scope_key == "github.com/org/app"


async def test_a_detached_alias_stays_detached_until_attached_again(
    tmp_path: Path, settings: Settings, storage_url: str
) -> None:
    repo = repository(tmp_path / "repo")
    old_key = str(repo.resolve())
    settings, database = await _path_keyed_store(
        tmp_path, settings, storage_url, {"Deploys need two approvals": old_key}
    )
    async with MemoryService.open(settings, database=database, embedder=FakeEmbedder()) as first:
        assert (await first.project(repo)).scope.aliases == (old_key,)
        detached = await first.detach_alias(old_key, repo)
        assert detached.scope.aliases == ()
        assert [a.detached_at is not None for a in detached.aliases] == [True]
        assert not hit_texts(await first.search("deploys approvals", cwd=repo))
        with pytest.raises(NotFound):
            await first.detach_alias(old_key, repo)
    # A later process does not attach it again by itself...
    async with MemoryService.open(settings, database=database, embedder=FakeEmbedder()) as later:
        assert (await later.project(repo)).scope.aliases == ()
        _, adopted = await later.adopt(repo)
        assert adopted == []
        # ...but the operator can; the record was never touched.
        attached = await later.attach_alias(f"{repo}/", repo)
        assert attached.scope.aliases == (old_key,)
        assert hit_texts(await later.search("deploys approvals", cwd=repo)) == {
            "Deploys need two approvals"
        }
        with pytest.raises(InvalidInput):
            await later.attach_alias(attached.key, repo)


async def test_a_new_project_id_adopts_the_remote_key_and_its_aliases(
    memory: MemoryService, tmp_path: Path
) -> None:
    repo = repository(tmp_path / "repo", origin="https://github.com/org/app")
    old = fact("Old path-keyed fact about queues", scope_key=str(repo.resolve()))
    async with memory.engine.store.write() as tx:
        await tx.insert(old, None)
    await memory.store("Remote-keyed fact about caches", cwd=repo)
    assert (await memory.project(repo)).scope.aliases == (str(repo.resolve()),)
    (repo / ".memory-mcp.toml").write_text('[project]\nid = "acme/app"\n', encoding="utf-8")
    project = await memory.project(repo)
    assert project.key == "acme/app"
    assert set(project.scope.aliases) == {"github.com/org/app", str(repo.resolve())}
    assert hit_texts(await memory.search("fact about queues caches", cwd=repo)) == {
        "Old path-keyed fact about queues",
        "Remote-keyed fact about caches",
    }


async def test_project_done_and_maintenance_see_records_under_aliases(
    memory: MemoryService, tmp_path: Path
) -> None:
    repo = repository(tmp_path / "repo")
    async with memory.engine.store.write() as tx:
        await tx.insert(fact("Logs rotate daily", scope_key=str(repo.resolve())), None)
    await memory.store("The cache is warmed at boot", cwd=repo)
    assert await memory.archive_project(repo, dry_run=True) == 2
    assert await memory.archive_project(repo) == 2
    assert not hit_texts(await memory.search("logs cache", cwd=repo))
