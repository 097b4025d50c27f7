"""The write pipeline and search through MemoryService, on real SQLite (fake embedder)."""

from __future__ import annotations

import io
import json
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest

from helpers.storage import store_place
from memory_mcp.config import Settings
from memory_mcp.embedders.base import FakeEmbedder
from memory_mcp.errors import InvalidInput, NotFound, SecretRejected
from memory_mcp.service import MemoryService, StoreRequest
from memory_mcp.storage.base import Filters

pytestmark = pytest.mark.anyio


async def test_a_fact_is_found_from_the_repo_and_its_subdirectories_only(
    memory: MemoryService, project: Path, other_project: Path
) -> None:
    stored = await memory.store("We deploy with GitHub Actions to Fly.io", cwd=project)
    assert stored.action == "inserted" and stored.embedded
    for where in (project, project / "src" / "pkg"):
        hits = (await memory.search("deploy GitHub Actions", cwd=where)).hits
        assert [h.record.id for h in hits] == [stored.id]
    assert (await memory.search("deploy GitHub Actions", cwd=other_project)).hits == []


async def test_global_facts_are_written_only_when_asked_and_read_everywhere(
    memory: MemoryService, project: Path, other_project: Path
) -> None:
    stored = await memory.store("The user prefers concise answers", scope="global", cwd=project)
    assert stored.scope == "global" and stored.scope_key == ""
    for where in (project, other_project):
        hits = (await memory.search("concise answers", cwd=where)).hits
        assert [h.record.id for h in hits] == [stored.id]
    assert (await memory.search("concise answers", cwd=project, scope="project")).hits == []
    assert (await memory.search("concise answers", cwd=project, scope="global")).hits


async def test_an_exact_repeat_folds_keeping_the_old_id_and_text(
    memory: MemoryService, project: Path
) -> None:
    first = await memory.store(
        "Use uv for installs.", cwd=project, importance=0.9, tags=["tooling"]
    )
    second = await memory.store("use UV for installs", cwd=project, tags=["python"])
    assert second.action == "folded" and second.related_id == first.id
    canonical = await memory.get(second.id)
    assert canonical.content == "use UV for installs"  # the newer text is canonical
    assert canonical.fold_count == 1
    assert [(m.id, m.content) for m in canonical.merged_from] == [
        (first.id, "Use uv for installs.")
    ]
    assert canonical.importance == 0.9  # the maximum is kept
    assert canonical.tags == ["tooling", "python"]
    old = await memory.get(first.id)
    assert old.archived_reason == "folded" and old.replaced_by == second.id
    hits = (await memory.search("uv installs", cwd=project)).hits
    assert [h.record.id for h in hits] == [second.id]


async def test_a_reworded_duplicate_folds(memory: MemoryService, project: Path) -> None:
    first = await memory.store("Run the linter with make lint before pushing", cwd=project)
    second = await memory.store("Run the linter with make lint before a push", cwd=project)
    assert second.action == "folded" and second.related_id == first.id
    canonical = await memory.get(second.id)
    assert canonical.content == "Run the linter with make lint before a push"
    assert [(m.id, m.content) for m in canonical.merged_from] == [
        (first.id, "Run the linter with make lint before pushing")
    ]
    assert canonical.fold_count == 1


async def test_an_update_supersedes_and_keeps_the_old_value_in_history(
    memory: MemoryService, project: Path
) -> None:
    old = await memory.store("The pigeon app's minimum iOS version is 15.", cwd=project)
    new = await memory.store("The pigeon app's minimum iOS version is 16.", cwd=project)
    assert new.action == "superseded" and new.related_id == old.id
    assert new.related_content == "The pigeon app's minimum iOS version is 15."
    current = await memory.get(new.id)
    assert current.supersedes == [old.id]
    history = await memory.get(old.id)
    assert history.replaced_by == new.id and history.archived_at is None  # history, not archived
    hits = (await memory.search("pigeon minimum iOS version", cwd=project)).hits
    assert [h.record.id for h in hits] == [new.id]
    assert await memory.sources_of(current) == [new.id, old.id]


async def test_a_contradiction_keeps_both_and_records_a_conflict(
    memory: MemoryService, project: Path
) -> None:
    old = await memory.store("Run tests with pytest -x", cwd=project)
    new = await memory.store("Never run tests with -x", cwd=project)
    assert new.action == "conflict" and new.related_id == old.id and new.conflict_id
    conflicts = await memory.engine.store.conflicts(open_only=True)
    assert [(c.record_id, c.other_id) for c in conflicts] == [(new.id, old.id)]
    hits = (await memory.search("run tests -x", cwd=project)).hits
    assert {h.record.id for h in hits} == {old.id, new.id}


async def test_journal_entries_append_and_exact_repeats_fold(
    memory: MemoryService, project: Path
) -> None:
    a = await memory.store(
        "Fixed the flaky login test by waiting for the redirect", kind="journal", cwd=project
    )
    b = await memory.store(
        "Fixed the flaky login test by waiting for the network", kind="journal", cwd=project
    )
    c = await memory.store(
        "fixed the flaky login test by waiting for the redirect!", kind="journal", cwd=project
    )
    assert (a.action, b.action, c.action) == ("appended", "appended", "folded")
    assert c.related_id == a.id


async def test_a_new_goal_replaces_the_old_one_which_stays_in_history(
    memory: MemoryService, project: Path
) -> None:
    first = await memory.store("Ship the v2 API by March", kind="goal", cwd=project)
    second = await memory.store("Ship the v2 API by April", kind="goal", cwd=project)
    plan = await memory.store("1. schema 2. endpoints 3. docs", kind="plan", cwd=project)
    assert (first.action, second.action, plan.action) == ("inserted", "replaced", "inserted")
    assert second.related_id == first.id
    assert (await memory.get(first.id)).replaced_by == second.id
    assert (await memory.get(second.id)).supersedes == [first.id]
    hits = (await memory.search("v2 API", cwd=project, kinds=["goal"])).hits
    assert [h.record.id for h in hits] == [second.id]


async def test_facts_in_different_projects_never_fold_together(
    memory: MemoryService, project: Path, other_project: Path
) -> None:
    await memory.store("The API listens on port 8080", cwd=project)
    other = await memory.store("The API listens on port 8080", cwd=other_project)
    assert other.action == "inserted"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"content": "   "}, "content is empty"),
        ({"content": "x" * 70_000}, "the limit is 64,000"),
        ({"content": "ok", "kind": "memo"}, "unknown kind 'memo'"),
        ({"content": "ok", "importance": 1.5}, "importance must be a number from 0 to 1"),
        ({"content": "ok", "importance": float("nan")}, "importance"),
        ({"content": "ok", "tags": ["x" * 100]}, "too long"),
        ({"content": "ok", "tags": [f"t{i}" for i in range(30)]}, "the limit is 20"),
        ({"content": "ok", "scope": "session"}, "scope must be 'project' or 'global'"),
        ({"content": "ok", "cwd": "relative/dir"}, "absolute path"),
    ],
)
async def test_bad_input_is_refused_with_what_to_change_and_nothing_written(
    memory: MemoryService, project: Path, kwargs: dict[str, object], message: str
) -> None:
    kwargs.setdefault("cwd", project)
    with pytest.raises(InvalidInput, match=message):
        await memory.store(**kwargs)  # type: ignore[arg-type]
    stats = await memory.engine.store.stats()
    assert stats.records == {}


async def test_control_characters_and_invalid_surrogates_are_cleaned(
    memory: MemoryService, project: Path
) -> None:
    stored = await memory.store("bell\x07 and \x00nul\r\nnext \ud800line\u200b", cwd=project)
    assert (await memory.get(stored.id)).content == "bell and nul\nnext \ufffdline"


async def test_secrets_are_redacted_by_default_and_reported(
    memory: MemoryService, project: Path
) -> None:
    stored = await memory.store(
        "CI uses token ghp_1a2B3c4D5e6F7g8H9i0JkLmNoPqRsTuVwXyZ12 to push", cwd=project
    )
    assert [(r.kind, r.count) for r in stored.redactions] == [("github-token", 1)]
    assert "ghp_" not in (await memory.get(stored.id)).content


async def test_the_reject_policy_refuses_secrets_without_echoing_them(
    tmp_path: Path, storage_url: str, project: Path
) -> None:
    settings, database = store_place(tmp_path, storage_url, "r")
    settings.write.secrets = "reject"
    async with MemoryService.open(settings, database=database, embedder=FakeEmbedder()) as memory:
        with pytest.raises(SecretRejected) as raised:
            await memory.store("password = hunter2hunter2", cwd=project)
        assert "hunter2" not in str(raised.value)
        assert (await memory.engine.store.stats()).records == {}


async def test_on_the_lexical_floor_an_update_finds_the_fact_written_just_before_it(
    tmp_path: Path, storage_url: str, project: Path
) -> None:
    """Without vectors, a fact's update is found by its words: the words a process
    counted as new to the store (no record held them) are counted again, not taken
    as held by none for the ten minutes other counts are reused."""
    settings, database = store_place(tmp_path, storage_url, "floor")
    settings.embedder.backend = "bm25"
    async with MemoryService.open(settings, database=database) as memory:
        first = await memory.store("The Quuxbar gateway listens on port 8080", cwd=project)
        second = await memory.store("The Quuxbar gateway listens on port 9090", cwd=project)
        assert (first.action, second.action) == ("inserted", "superseded")
        assert second.related_id == first.id


async def test_filters_apply_before_the_limit(memory: MemoryService, project: Path) -> None:
    for i in range(12):
        await memory.store(f"Service {i} exposes metrics on port {9000 + i}", cwd=project)
    tagged = await memory.store(
        "Service gamma exposes metrics on a unix socket", cwd=project, tags=["Ops"], kind="gotcha"
    )
    hits = (await memory.search("service metrics port", cwd=project, tags=["ops"], limit=2)).hits
    assert [h.record.id for h in hits] == [tagged.id]
    hits = (
        await memory.search("service metrics port", cwd=project, kinds=["gotcha"], limit=2)
    ).hits
    assert [h.record.id for h in hits] == [tagged.id]


async def test_time_filters_use_the_creation_time(memory: MemoryService, project: Path) -> None:
    old_time = datetime(2025, 1, 10, tzinfo=UTC)
    old = await memory.store("Release train leaves on Tuesdays", cwd=project, created_at=old_time)
    new = await memory.store("Release notes are written in CHANGELOG.md", cwd=project)
    since = (await memory.search("release", cwd=project, since="2025-06-01")).hits
    until = (await memory.search("release", cwd=project, until=old_time + timedelta(days=1))).hits
    assert [h.record.id for h in since] == [new.id]
    assert [h.record.id for h in until] == [old.id]
    # A date as until takes in that whole day; a time as until stays exclusive.
    day = (await memory.search("release", cwd=project, until="2025-01-10")).hits
    assert [h.record.id for h in day] == [old.id]
    same = await memory.search("release", cwd=project, since="2025-01-10", until="2025-01-10")
    assert [h.record.id for h in same.hits] == [old.id]
    assert not (await memory.search("release", cwd=project, until="2025-01-10T00:00Z")).hits
    with pytest.raises(InvalidInput, match="is not before until"):
        await memory.search("release", cwd=project, since="2025-01-11", until="2025-01-10")
    with pytest.raises(InvalidInput, match="ISO-8601"):
        await memory.search("release", cwd=project, since="last tuesday")


async def test_returned_hits_count_as_accesses_after_the_answer(
    memory: MemoryService, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The searches answer before their hits are counted: the counts are written at the
    engine's next quiet, in one transaction, or as it closes."""
    from memory_mcp import engine as engine_module

    monkeypatch.setattr(engine_module, "_QUIET_S", 3600)  # no quiet before the close
    stored = await memory.store("The cache TTL is 5 minutes", cwd=project)
    other = await memory.store("Deploys go out on Tuesdays", cwd=project)
    await memory.search("cache TTL", cwd=project)
    await memory.unified_search("cache TTL", cwd=project)
    await memory.project_search("deploys Tuesdays", cwd=project)
    assert (await memory.get(stored.id)).access_count == 0  # not counted yet
    await memory.engine.finish_deferred(10)  # what a closing engine does
    record = await memory.get(stored.id)
    assert record.access_count == 2 and record.last_access_at is not None
    assert (await memory.get(other.id)).access_count == 1

    monkeypatch.setattr(engine_module, "_QUIET_S", 0.01)
    await memory.search("cache TTL", cwd=project)
    task = memory.engine._completing
    assert task is not None
    await task  # started by the search, written at the quiet after it
    assert (await memory.get(stored.id)).access_count == 3


async def test_a_fold_right_after_a_search_carries_the_counts_of_what_it_absorbs(
    memory: MemoryService, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memory_mcp import engine as engine_module

    monkeypatch.setattr(engine_module, "_QUIET_S", 3600)  # no quiet between the calls
    first = await memory.store("Run the linter with make lint before pushing", cwd=project)
    await memory.search("linter make lint", cwd=project)
    second = await memory.store("Run the linter with make lint before a push", cwd=project)
    assert second.action == "folded"
    holder = await memory.get(second.id)
    assert (holder.access_count, holder.fold_count) == (1, 1)
    assert (await memory.engine.store.get(first.id)).access_count == 1  # type: ignore[union-attr]


async def test_a_store_that_cannot_count_accesses_still_answers(
    memory: MemoryService,
    project: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Read-only, full, busy: the counts are lost with a one-line warning, not the
    search, and the engine closes."""
    from memory_mcp.errors import StorageError

    stored = await memory.store("The cache TTL is 5 minutes", cwd=project)

    async def refuse(accesses: object) -> None:
        raise StorageError("attempt to write a readonly database")

    monkeypatch.setattr(memory.engine.store, "record_access", refuse)
    found = await memory.search("cache TTL", cwd=project)
    assert [h.record.id for h in found.hits] == [stored.id]
    await memory.engine.finish_deferred(10)
    assert "search hits were not counted as accesses: " in caplog.text
    assert "Traceback" not in caplog.text
    assert not memory.engine._accessed


async def test_access_counts_add_up_and_the_last_access_never_moves_back(
    memory: MemoryService, project: Path
) -> None:
    stored = await memory.store("The cache TTL is 5 minutes", cwd=project)
    store = memory.engine.store
    await store.record_access({stored.id: (2, "2026-01-02T00:00:00.000000Z")})
    await store.record_access({stored.id: (1, "2026-01-01T00:00:00.000000Z"), "f_none": (1, "x")})
    record = await memory.get(stored.id)
    assert (record.access_count, record.last_access_at) == (3, "2026-01-02T00:00:00.000000Z")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"query": " "}, "query is empty"),
        ({"query": "x", "limit": 0}, "limit must be a whole number from 1 to 50"),
        ({"query": "x", "limit": 51}, "limit must be a whole number from 1 to 50"),
        ({"query": "x", "kinds": ["memo"]}, "unknown kind"),
        ({"query": "x", "scope": "session"}, "scope must be"),
    ],
)
async def test_bad_search_arguments_say_what_to_change(
    memory: MemoryService, project: Path, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        await memory.search(cwd=project, **kwargs)  # type: ignore[arg-type]


async def test_a_bad_scope_fails_before_the_model_embeds_the_query(
    tmp_path: Path, storage_url: str, project: Path
) -> None:
    # The query's embedding starts while the scope's keys are read: a scope that
    # cannot be read must not cost it.
    settings, database = store_place(tmp_path, storage_url, "s")
    model = FakeEmbedder()
    async with MemoryService.open(
        settings, database=database, embedder=model, wait_for_embedder=10
    ) as memory:
        await memory.store("The cache TTL is 5 minutes", cwd=project)
        before = model.calls
        with pytest.raises(InvalidInput, match="scope must be"):
            await memory.search("cache", cwd=project, scope="session")  # type: ignore[arg-type]
        assert model.calls == before
        assert (await memory.search("cache TTL", cwd=project, scope="project")).hits
        assert model.calls == before + 1


async def test_forget_archives_reversibly_and_refuses_unknown_ids(
    memory: MemoryService, project: Path
) -> None:
    stored = await memory.store("Temporary: the build is broken on main", cwd=project)
    archived = await memory.forget(stored.id, reason="fixed")
    assert (
        archived.archived_reason == "fixed"
        and archived.content == "Temporary: the build is broken on main"
    )
    assert (await memory.search("build broken", cwd=project)).hits == []
    with pytest.raises(InvalidInput, match="already archived"):
        await memory.forget(stored.id)
    with pytest.raises(NotFound):
        await memory.forget("f_nope")


async def test_store_many_batches_and_decides_against_earlier_items(
    memory: MemoryService, project: Path
) -> None:
    results = await memory.store_many(
        [
            StoreRequest("The default branch is `master`", cwd=project),
            StoreRequest("The default branch is `main`", cwd=project),
            StoreRequest("the default branch is main", cwd=project),
        ]
    )
    assert [r.action for r in results] == ["inserted", "superseded", "folded"]


async def test_store_many_validates_everything_before_writing(
    memory: MemoryService, project: Path
) -> None:
    with pytest.raises(InvalidInput):
        await memory.store_many([StoreRequest("fine", cwd=project), StoreRequest("", cwd=project)])
    assert (await memory.engine.store.stats()).records == {}
    results = await memory.store_valid(
        [StoreRequest("fine", cwd=project), StoreRequest("", cwd=project)]
    )
    assert results[0].action == "inserted"  # type: ignore[union-attr]
    assert isinstance(results[1], InvalidInput)


async def test_a_folded_record_is_still_found_by_the_words_of_what_it_absorbed(
    memory: MemoryService, project: Path
) -> None:
    await memory.store("Use uv sync to install the locked dependencies.", cwd=project)
    folded = await memory.store("use UV SYNC to install the locked dependencies", cwd=project)
    assert folded.action == "folded"
    lexical = await memory.engine.store.lexical(
        "Use uv sync locked dependencies", memory_filters(project), 5
    )
    assert [s.record.id for s in lexical] == [folded.id]
    await memory.engine.finish_deferred(10)  # the absorbed record's row, deleted at quiet
    vectors = await memory.engine.store.stats()
    # The same text once normalized: not embedded again, it takes the absorbed one's vector.
    assert vectors.vector_indexes[0][3] == 1


def memory_filters(project: Path) -> Filters:
    return Filters(scope_keys=(str(project.resolve()),), corpora=("facts",))


@pytest.mark.sqlite_only  # the SQLite store's in-memory copy of the vectors
async def test_a_server_loads_its_projects_vectors_ahead_of_use(
    tmp_path: Path, settings: Settings, project: Path
) -> None:
    database = tmp_path / "warm.db"
    async with MemoryService.open(
        settings, database=database, embedder=FakeEmbedder(), wait_for_embedder=10
    ) as first:
        assert (await first.store("The billing service runs on port 8080", cwd=project)).embedded
    async with MemoryService.open(settings, database=database, embedder=FakeEmbedder()) as fresh:
        assert fresh.engine.store.vector_copy_bytes == 0
        await fresh.warm_up(project)
        assert fresh.engine.store.vector_copy_bytes > 0
    # The store's vectors are known before the model is up: the load does not wait for it.
    slow = _SlowToLoad()
    async with MemoryService.open(settings, database=database, embedder=slow) as loading:
        try:
            with anyio.fail_after(5):
                await loading.warm_up(project)
            assert not loading.engine.embeddings.ready
            assert loading.engine.store.vector_copy_bytes > 0
        finally:
            slow.loaded.set()


class _SlowToLoad(FakeEmbedder):
    """A model that loads once ``loaded`` is set (at most 10 s)."""

    def __init__(self) -> None:
        super().__init__()
        self.loaded = threading.Event()

    def load(self, *, download: bool = False) -> None:
        self.loaded.wait(10)


async def test_a_record_without_a_vector_is_as_relevant_as_the_share_of_the_question_it_holds(
    memory: MemoryService, project: Path
) -> None:
    """One shared word with a three-word question is not full relevance."""
    from memory_mcp.scope import project_scope
    from memory_mcp.write import prepare

    await memory.store("Releases are tagged by the release job", cwd=project)
    draft = prepare(
        "Friday standups were moved to the afternoon",
        kind="fact",
        scope=project_scope(project),
        importance=None,
        tags=(),
        agent="test",
        at=memory.engine.clock(),
        settings=memory.settings.write,
    )
    async with memory.engine.store.write() as tx:  # stored while the model was away: no vector
        await tx.insert(draft.record, None)
    asked = await memory.search("what is the weather on Friday in Paris", cwd=project)
    [hit] = [h for h in asked.hits if h.record.id == draft.record.id]
    assert abs(hit.relevance - 1 / 3) < 1e-6  # friday, of weather / friday / paris
    direct = await memory.search("friday standups", cwd=project)
    assert direct.hits[0].record.id == draft.record.id and direct.hits[0].relevance == 1.0


async def test_a_record_says_who_wrote_it_and_a_private_one_stays_marked(
    memory: MemoryService, project: Path
) -> None:
    shared = await memory.store("The staging database is db-stg-2", cwd=project)
    mine = await memory.store("I keep my scratch notes in ~/notes", cwd=project, private=True)
    writer = memory.engine.store.user  # the local login, or the database role
    assert writer
    records = {r.id: r for r in await memory.engine.store.get_many([shared.id, mine.id])}
    assert [(records[i].user, records[i].private) for i in (shared.id, mine.id)] == [
        (writer, False),
        (writer, True),
    ]
    exported = io.StringIO()
    await memory.export(exported)
    lines = [json.loads(line) for line in exported.getvalue().splitlines()[1:]]
    assert {(line["id"], line["user"], line["private"]) for line in lines} == {
        (shared.id, writer, False),
        (mine.id, writer, True),
    }


def test_ids_sort_in_the_order_a_process_made_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Within a millisecond, and when the clock steps back, each id is the last one plus
    one: results of equal score, ordered by id, come out in the order they were written."""
    import memory_mcp.write as write

    ids = [write.new_id("facts") for _ in range(2000)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    monkeypatch.setattr(write.time, "time", lambda: 1.0)  # long before: the clock stepped back
    later = [write.new_id("facts") for _ in range(3)]
    assert ids[-1] < later[0] < later[1] < later[2]
