"""Maintenance: secrets, consolidation, insights, staleness, purge, leases, restore,
conflicts."""

from __future__ import annotations

import itertools
import json
import os
import stat
import sys
import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest

from helpers.git import repository
from helpers.processes import Workers, release
from helpers.records import fact
from helpers.storage import store_place, store_url
from helpers.waiting import eventually
from memory_mcp import maintenance
from memory_mcp.config import Settings, WriteSettings
from memory_mcp.embedders.base import FakeEmbedder
from memory_mcp.errors import InvalidInput, NotFound
from memory_mcp.llm import ChatEndpoint, Command
from memory_mcp.maintenance import Maintenance
from memory_mcp.maintenance.context import TaskRun
from memory_mcp.records import Record, StoreResult, format_time, parse_time
from memory_mcp.scope import project_scope
from memory_mcp.service import MemoryService
from memory_mcp.storage.base import Filters, TaskState
from memory_mcp.write import absorb, prepare

pytestmark = pytest.mark.anyio

START = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


class Clock:
    """A clock the test moves."""

    def __init__(self, now: datetime = START) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def memory(
    tmp_path: Path, settings: Settings, clock: Clock, storage_url: str
) -> AsyncIterator[MemoryService]:
    settings, database = store_place(tmp_path, storage_url, settings=settings)
    async with MemoryService.open(
        settings,
        database=database,
        embedder=FakeEmbedder(),
        clock=clock,
        wait_for_embedder=10,
    ) as service:
        yield service


async def plant(
    memory: MemoryService, text: str, root: Path, *, days_ago: float = 0, scan: bool = True
) -> Record:
    """Store a record around the write pipeline (as an import or a race would); without
    ``scan``, as rules that did not know its secret would have."""
    draft = prepare(
        text,
        kind="fact",
        scope=project_scope(root),
        importance=None,
        tags=(),
        agent="test",
        at=memory.engine.clock() - timedelta(days=days_ago),
        settings=memory.settings.write if scan else WriteSettings(secrets="off"),
    )
    async with memory.engine.store.write() as tx:
        await tx.insert(draft.record, None)
    return draft.record


DUPLICATES = [
    ("Run the linter with make lint before pushing", "Run the linter with make lint before a push"),
    ("Use uv for installs.", "use UV for installs"),
    ("The API server listens on port 8080", "The API server listens on port 8080."),
]


async def planted_duplicates(memory: MemoryService, root: Path) -> list[tuple[Record, Record]]:
    pairs = []
    for i, (a, b) in enumerate(DUPLICATES):
        pairs.append(
            (
                await plant(memory, a, root, days_ago=10 + i),
                await plant(memory, b, root, days_ago=5),
            )
        )
    await plant(memory, "Deploys go through GitHub Actions to Fly.io", root, days_ago=3)
    await memory.reembed()
    return pairs


async def test_the_sweep_folds_what_the_write_time_fold_missed(
    memory: MemoryService, project: Path
) -> None:
    pairs = await planted_duplicates(memory, project)
    [report] = await Maintenance(memory.engine).run(["consolidate"])
    assert report.counts == {"folded": len(pairs)}
    for old, new in pairs:
        canonical = await memory.get(new.id)
        assert canonical.current and canonical.content == new.content
        assert [(m.id, m.content) for m in canonical.merged_from] == [(old.id, old.content)]
        gone = await memory.get(old.id)
        assert gone.archived_reason == "folded" and gone.replaced_by == new.id
        # the absorbed text stays findable, by its words and by its vector
        hits = (await memory.search(old.content, cwd=project)).hits
        assert hits[0].record.id == new.id
    # A later sweep starts where this one stopped: nothing left to fold.
    [again] = await Maintenance(memory.engine).run(["consolidate"])
    assert again.counts == {}


async def test_the_loops_sweep_goes_on_in_slices_until_done(
    memory: MemoryService, project: Path
) -> None:
    pairs = await planted_duplicates(memory, project)  # 7 facts
    worker = Maintenance(memory.engine, sweep_budget=3)
    first = await worker.run(["consolidate"], due_only=True)
    assert first[0].pending == 4
    second = await worker.run(["consolidate"], due_only=True)  # due at once: work was left
    third = await worker.run(["consolidate"], due_only=True)
    assert second[0].pending == 1 and third[0].pending == 0
    folded = sum(r[0].counts.get("folded", 0) for r in (first, second, third))
    assert folded == len(pairs)
    [later] = await worker.run(["consolidate"], due_only=True)
    assert later.skipped.startswith("next run at")


async def test_the_sweep_flags_a_contradiction_once(memory: MemoryService, project: Path) -> None:
    old = await plant(memory, "Run tests with pytest -x", project, days_ago=2)
    new = await plant(memory, "Never run tests with -x", project, days_ago=1)
    await memory.reembed()
    [report] = await Maintenance(memory.engine).run(["consolidate"])
    assert report.counts == {"conflicts": 1}
    [conflict] = await memory.engine.store.conflicts(open_only=True)
    assert (conflict.record_id, conflict.other_id) == (new.id, old.id)
    # Resolved as "both": a sweep from the start does not flag the pair again.
    await memory.resolve_conflict(conflict.id, "both")
    async with memory.engine.store.write() as tx:  # forget where the last sweep stopped
        assert await tx.claim("consolidate", "test", "", "")
        assert await tx.finish(TaskState(task="consolidate"), "test")
    [again] = await Maintenance(memory.engine).run(["consolidate"])
    assert again.counts == {}


async def test_a_dry_run_counts_exactly_what_the_run_then_does(
    memory: MemoryService, project: Path, other_project: Path, clock: Clock
) -> None:
    await planted_duplicates(memory, project)
    await plant(memory, "Run tests with pytest -x", other_project, days_ago=200)
    await plant(memory, "Never run tests with -x", other_project, days_ago=199)
    await memory.reembed()
    stored = await memory.store("The cache lives in .cache/app", cwd=project)
    await memory.forget(stored.id)
    clock.advance(days=120)
    before = await _snapshot(memory)
    planned = await memory.maintain(dry_run=True)
    assert await _snapshot(memory) == before  # the dry run changed nothing
    done = await Maintenance(memory.engine).run()
    assert [r.to_json() for r in planned] == [r.to_json() for r in done]
    by_task = {r.task: r.counts for r in done}
    assert by_task["consolidate"] == {"folded": 3, "conflicts": 1}
    assert by_task["staleness"] == {"archived": 6, "projects": 2}
    assert by_task["purge"] == {"purged": 1}


async def _snapshot(memory: MemoryService) -> list[dict[str, Any]]:
    return [r.to_json() async for r in memory.engine.store.iter_records()]


async def test_staleness_archives_unused_facts_of_dormant_projects_only(
    memory: MemoryService, project: Path, other_project: Path, clock: Clock
) -> None:
    unused = await memory.store("The staging database is called pigeon_stage", cwd=project)
    used = await memory.store("Release notes go in CHANGELOG.md", cwd=project)
    busy = await memory.store("The frontend builds with vite", cwd=other_project)
    pinned = await memory.store("Never push to main", cwd=project, pinned=True)
    clock.advance(days=10)
    await memory.search("release notes changelog", cwd=project)
    clock.advance(days=95)
    await memory.search("frontend vite", cwd=other_project)  # other_project stays active
    [report] = await Maintenance(memory.engine).run(["staleness"])
    assert report.counts == {"archived": 1, "projects": 1}
    assert (await memory.get(unused.id)).archived_reason == "dormant"
    for kept in (used, busy, pinned):
        assert (await memory.get(kept.id)).current


async def test_an_alias_of_an_active_project_is_not_dormant_and_folds_with_it(
    memory: MemoryService, tmp_path: Path, clock: Clock
) -> None:
    repo = repository(tmp_path / "git-repo")
    old_key = str(repo.resolve())  # the key the project had before identities
    earlier = fact("The staging database is called pigeon_stage", at=clock.now, scope_key=old_key)
    async with memory.engine.store.write() as tx:
        await tx.insert(earlier, None)
    await memory.store("Release notes go in CHANGELOG.md", cwd=repo)  # under the new key
    assert (await memory.project(repo)).scope.aliases == (old_key,)
    clock.advance(days=100)
    await memory.store("The frontend builds with vite", cwd=repo)  # the project is active
    [report] = await Maintenance(memory.engine).run(["staleness"])
    assert report.counts == {}
    assert (await memory.get(earlier.id)).current
    key = (await memory.project(repo)).key
    repeat = fact("The staging database is called pigeon_stage", at=clock.now, scope_key=key)
    async with memory.engine.store.write() as tx:  # a repeat the write path did not see
        await tx.insert(repeat, None)
    _, report = await Maintenance(memory.engine).run(["reembed", "consolidate"])
    assert report.counts.get("folded") == 1


async def test_staleness_is_off_with_a_negative_dormant_days(
    tmp_path: Path, storage_url: str, project: Path, clock: Clock
) -> None:
    settings, database = store_place(tmp_path, storage_url, "m")
    settings.maintenance.dormant_days = -1
    async with MemoryService.open(
        settings, database=database, embedder=FakeEmbedder(), clock=clock
    ) as memory:
        await memory.store("The staging database is called pigeon_stage", cwd=project)
        clock.advance(days=400)
        [report] = await Maintenance(memory.engine).run(["staleness"])
    assert report.skipped and not report.counts


async def test_purge_deletes_only_records_archived_past_the_grace_window(
    memory: MemoryService, project: Path, clock: Clock
) -> None:
    old = await memory.store("Old fact about the build cache", cwd=project)
    await memory.forget(old.id)
    history = await memory.store("The pigeon app's minimum iOS version is 15.", cwd=project)
    clock.advance(days=20)
    young = await memory.store("Young fact about the logging format", cwd=project)
    await memory.forget(young.id)
    newer = await memory.store("The pigeon app's minimum iOS version is 16.", cwd=project)
    assert newer.action == "superseded"
    clock.advance(days=11)  # old: archived 31 days ago; young: 11 days ago
    [report] = await Maintenance(memory.engine).run(["purge"])
    assert report.counts == {"purged": 1}
    assert await memory.engine.store.get(old.id) is None
    assert (await memory.get(young.id)).archived_reason == "forgotten"
    assert (await memory.get(history.id)).replaced_by == newer.id  # history is never purged
    fts = await memory.engine.store.lexical("build cache", _facts_of(project), 10)
    assert fts == []  # its full-text rows went with it


async def test_restore_returns_records_field_for_field(
    memory: MemoryService, project: Path, clock: Clock
) -> None:
    kept = await memory.store("The staging database is called pigeon_stage", cwd=project)
    before = (await memory.get(kept.id)).to_json()
    await memory.forget(kept.id, reason="no longer true")
    clock.advance(days=3)
    [restored] = await memory.restore([kept.id])
    assert restored.to_json() == before
    hits = (await memory.search("staging database name", cwd=project)).hits
    assert hits and hits[0].record.id == kept.id
    with pytest.raises(InvalidInput, match="not archived"):
        await memory.restore([kept.id])
    with pytest.raises(NotFound):
        await memory.restore(["f_NOPE"])


async def test_restoring_a_folded_record_undoes_the_fold(
    memory: MemoryService, project: Path
) -> None:
    first = await memory.store("Run the linter with make lint before pushing", cwd=project)
    second = await memory.store("Run the linter with make lint before a push", cwd=project)
    assert second.action == "folded"
    [restored] = await memory.restore([first.id])
    assert restored.current and restored.replaced_by is None and restored.embedder
    canonical = await memory.get(second.id)
    assert canonical.merged_from == [] and canonical.fold_count == 0 and canonical.embedder
    # A person took them apart: the sweep, which would fold them, leaves them so.
    [report] = await Maintenance(memory.engine).run(["consolidate"])
    assert report.counts == {}
    assert (await memory.get(first.id)).current and (await memory.get(second.id)).current
    assert await memory.conflicts() == []  # kept apart is no question for the inbox


async def test_project_done_archives_everything_and_restore_brings_it_back(
    memory: MemoryService, project: Path, other_project: Path
) -> None:
    fact = await memory.store("The staging database is called pigeon_stage", cwd=project)
    goal = await memory.store("Ship the beta", kind="goal", cwd=project)
    elsewhere = await memory.store("The frontend builds with vite", cwd=other_project)
    assert await memory.archive_project(project, dry_run=True) == 2
    assert await memory.archive_project(project) == 2
    archived = await memory.engine.store.archived((project_scope(project).key,))
    assert {r.id for r in archived} == {fact.id, goal.id}
    assert {r.archived_reason for r in archived} == {"project-done"}
    assert (await memory.get(elsewhere.id)).current
    await memory.restore([fact.id, goal.id])
    assert (await memory.get(fact.id)).current and (await memory.get(goal.id)).current


async def test_conflicts_resolve_each_way(memory: MemoryService, project: Path) -> None:
    async def conflict(old_text: str, new_text: str) -> tuple[int, str, str]:
        old = await memory.store(old_text, cwd=project)
        new = await memory.store(new_text, cwd=project)
        assert new.conflict_id is not None
        return new.conflict_id, old.id, new.id

    views = []
    cid, old_id, new_id = await conflict("Run tests with pytest -x", "Never run tests with -x")
    views = await memory.conflicts()
    assert [(v.new and v.new.id, v.old and v.old.id) for v in views] == [(new_id, old_id)]
    closed, _ = await memory.resolve_conflict(cid, "new")
    assert closed.resolution == "kept new"
    assert (await memory.get(old_id)).replaced_by == new_id
    assert old_id in (await memory.get(new_id)).supersedes
    with pytest.raises(InvalidInput, match="already resolved"):
        await memory.resolve_conflict(cid, "old")

    cid, old_id, new_id = await conflict("Deploy on Fridays", "Never deploy on Fridays")
    closed, _ = await memory.resolve_conflict(cid, "old")
    assert (await memory.get(new_id)).archived_reason == f"conflict-{cid}"
    assert (await memory.get(old_id)).current
    # Restored, the set-aside side contradicts the kept one again: the conflict is open.
    await memory.restore([new_id])
    assert [v.conflict.id for v in await memory.conflicts()] == [cid]
    closed, _ = await memory.resolve_conflict(cid, "old")
    assert closed.resolution == "kept old"

    cid, old_id, new_id = await conflict("Cache the wheels in CI", "Do not cache the wheels in CI")
    with pytest.raises(InvalidInput, match="--text"):
        await memory.resolve_conflict(cid, "merged")
    closed, merged = await memory.resolve_conflict(
        cid, "merged", "Cache the wheels in CI except on release builds", agent="viewer"
    )
    assert merged is not None and closed.resolution == f"merged into {merged.id}"
    current = await memory.get(merged.id)
    assert current.agent == "viewer"
    assert current.embedder and current.supersedes == [old_id, new_id]
    for replaced in (old_id, new_id):
        assert (await memory.get(replaced)).replaced_by == merged.id
    with pytest.raises(NotFound):
        await memory.resolve_conflict(999, "both")
    assert await memory.conflicts() == []


async def test_only_the_lease_holder_runs_a_task(memory: MemoryService) -> None:
    first = Maintenance(memory.engine, holder="first")
    second = Maintenance(memory.engine, holder="second")
    now = await memory.engine.store.now()  # leases run on the store's clock
    assert await first._claim("purge", now)
    [report] = await second.run(["purge"])
    assert report.skipped == "another process is running it"
    lease = timedelta(seconds=memory.settings.maintenance.lease_seconds + 1)
    assert await first._claim("purge", now - lease)  # first stalled: its lease ran out
    [report] = await second.run(["purge"])
    assert not report.skipped and report.counts == {"purged": 0}
    state = (await memory.engine.store.tasks())["purge"]
    assert state.holder is None and state.last_summary["counts"] == {"purged": 0}


async def test_a_failing_task_backs_off_doubling(
    memory: MemoryService, project: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    await plant(memory, "The staging database is called pigeon_stage", project)
    monkeypatch.setattr(memory.engine.embeddings, "_state", "unavailable")
    worker = Maintenance(memory.engine)
    [report] = await worker.run(["reembed"], due_only=True)
    assert "not ready" in report.error
    state = (await memory.engine.store.tasks())["reembed"]
    assert state.failures == 1 and state.retry_after == _stamp(clock() + timedelta(minutes=5))
    [report] = await worker.run(["reembed"], due_only=True)
    assert report.skipped.startswith("waiting until")
    clock.advance(minutes=6)
    await worker.run(["reembed"], due_only=True)
    state = (await memory.engine.store.tasks())["reembed"]
    assert state.failures == 2 and state.retry_after == _stamp(clock() + timedelta(minutes=10))
    monkeypatch.setattr(memory.engine.embeddings, "_state", "ready")
    clock.advance(minutes=11)
    [report] = await worker.run(["reembed"], due_only=True)
    assert report.counts == {"embedded": 1} and not report.error
    assert (await memory.engine.store.tasks())["reembed"].failures == 0


def _facts_of(root: Path) -> Filters:
    return Filters(scope_keys=(project_scope(root).key,), corpora=("facts",))


def _stamp(value: datetime) -> str:
    from memory_mcp.records import format_time

    return format_time(value)


INSIGHT_FACTS = [
    "The pytest suite runs with uv run pytest -q from the repository root",
    "The pytest suite needs the model path set before uv run pytest -q",
    "The pytest suite takes three minutes with uv run pytest -q on two cores",
]


async def test_insights_summarize_related_facts_and_follow_their_sources(
    memory: MemoryService, project: Path
) -> None:
    facts = [await memory.store(t, cwd=project) for t in INSIGHT_FACTS]
    assert [f.action for f in facts] == ["inserted"] * 3
    await memory.store("Deploys go through GitHub Actions to Fly.io", cwd=project)
    worker = Maintenance(memory.engine)
    [report] = await worker.run(["insights"])
    assert report.counts == {"written": 1, "retired": 0}
    result = await memory.unified_search("how do I run the pytest suite", cwd=project)
    insight = next(r for r in result.results if r.type == "insights")
    assert sorted(insight.metadata["sources"]) == sorted(f.id for f in facts)
    assert "pytest" in insight.content and "uv run pytest -q" in insight.content
    [again] = await worker.run(["insights"])
    assert again.counts == {"written": 0, "retired": 0}  # nothing changed
    await memory.forget(facts[0].id)
    added = await memory.store(
        "The pytest suite writes coverage to htmlcov with uv run pytest -q", cwd=project
    )
    assert added.action == "inserted"
    [changed] = await worker.run(["insights"])
    assert changed.counts == {"written": 1, "retired": 1}


# The LLM refine path, against stand-ins the test starts -------------------------------


@pytest.fixture
def chat_server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """An OpenAI-compatible chat endpoint on 127.0.0.1 that answers one fixed statement."""
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, "body": body})
            answer = {"choices": [{"message": {"content": "Lint with make lint before a push."}}]}
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            return None

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/v1", seen
    server.shutdown()
    server.server_close()


@pytest.fixture
def llm_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A command on PATH that reads the prompt on stdin and prints one statement."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "fake-agent"
    script.write_text(
        f"#!{sys.executable}\n"
        "import pathlib, sys\n"
        "prompt = sys.argv[2] if len(sys.argv) > 2 else sys.stdin.read()\n"
        "pathlib.Path(__file__).with_suffix('.prompt').write_text(prompt)\n"
        "print('Lint with make lint before a push.')\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return script


async def _refined(memory: MemoryService, project: Path, llm: Any) -> Record:
    old = await plant(memory, DUPLICATES[0][0], project, days_ago=2)
    new = await plant(memory, DUPLICATES[0][1], project, days_ago=1)
    await memory.reembed()
    [report] = await Maintenance(memory.engine, llm=llm).run(["consolidate"])
    assert report.counts == {"folded": 1}
    record = await memory.get(new.id)
    assert [m.id for m in record.merged_from] == [old.id]
    return record


async def test_refine_through_a_chat_endpoint_keeps_the_previous_text(
    memory: MemoryService, project: Path, chat_server: tuple[str, list[dict[str, Any]]]
) -> None:
    url, seen = chat_server
    record = await _refined(memory, project, ChatEndpoint(url, "stand-in"))
    assert record.content == "Lint with make lint before a push."
    [previous] = record.meta["previous_texts"]
    assert previous["content"] == DUPLICATES[0][1] and previous["by"] == "chat:stand-in"
    assert record.embedder  # its vectors were made again for the new text
    assert seen[0]["path"] == "/v1/chat/completions"
    assert DUPLICATES[0][0] in seen[0]["body"]["messages"][0]["content"]


async def test_refine_through_a_command_on_path(
    memory: MemoryService, project: Path, llm_script: Path
) -> None:
    record = await _refined(memory, project, Command("fake-agent -p"))
    assert record.content == "Lint with make lint before a push."
    assert DUPLICATES[0][0] in llm_script.with_suffix(".prompt").read_text()
    # {prompt} in the template: the prompt is one argument, no shell in between
    answer = await Command("fake-agent -p {prompt}").complete("it's $HOME; `rm -rf /`")
    assert answer == "Lint with make lint before a push."
    assert llm_script.with_suffix(".prompt").read_text() == "it's $HOME; `rm -rf /`"


async def test_an_llm_writes_insights_and_rules_stand_in_when_it_fails(
    memory: MemoryService, project: Path, chat_server: tuple[str, list[dict[str, Any]]]
) -> None:
    url, seen = chat_server
    for text in INSIGHT_FACTS:
        await memory.store(text, cwd=project)
    [report] = await Maintenance(memory.engine, llm=ChatEndpoint(url, "stand-in")).run(["insights"])
    assert report.counts == {"written": 1, "retired": 0}
    [insight] = await memory.engine.store.current(_insights_of(project), 10)
    assert insight.content == "Lint with make lint before a push."  # the stand-in's answer
    assert insight.meta["method"] == "chat:stand-in"
    assert all(t in seen[0]["body"]["messages"][0]["content"] for t in INSIGHT_FACTS)


async def test_insights_fall_back_to_rules_when_the_llm_fails(
    memory: MemoryService, project: Path, tmp_path: Path
) -> None:
    for text in INSIGHT_FACTS:
        await memory.store(text, cwd=project)
    failing = Command(f"{tmp_path}/missing-command")
    [report] = await Maintenance(memory.engine, llm=failing).run(["insights"])
    assert report.counts == {"written": 1, "retired": 0}
    [insight] = await memory.engine.store.current(_insights_of(project), 10)
    assert insight.meta["method"] == "rules" and "3 related memories" in insight.content


def _insights_of(root: Path) -> Filters:
    return Filters(scope_keys=(project_scope(root).key,), corpora=("insights",))


async def test_without_an_llm_the_sweep_keeps_the_text(
    memory: MemoryService, project: Path
) -> None:
    assert Maintenance(memory.engine).llm is None
    record = await _refined(memory, project, None)
    assert record.content == DUPLICATES[0][1] and "previous_texts" not in record.meta


async def test_a_failing_llm_leaves_the_fold_as_it_was(
    memory: MemoryService, project: Path, tmp_path: Path
) -> None:
    record = await _refined(memory, project, Command(f"{tmp_path}/missing-command"))
    assert record.content == DUPLICATES[0][1]


# Re-embed convergence -----------------------------------------------------------------


@asynccontextmanager
async def new_embedder(
    tmp_path: Path, storage_url: str, project: Path
) -> AsyncIterator[tuple[MemoryService, list[StoreResult]]]:
    """Three facts stored with ``fake:old``, then the service opened on ``fake:new``."""
    settings, database = store_place(tmp_path, storage_url, "m")
    async with MemoryService.open(
        settings, database=database, embedder=FakeEmbedder(name="fake:old"), wait_for_embedder=10
    ) as memory:
        stored = [
            await memory.store(f"Fact number {i} about the {word} module", cwd=project)
            for i, word in enumerate(["billing", "search", "auth"])
        ]
    settings, database = store_place(tmp_path, storage_url, "m")
    settings.embedder.backend = "fastembed"  # an explicit choice switches the embedder
    async with MemoryService.open(
        settings, database=database, embedder=FakeEmbedder(name="fake:new"), wait_for_embedder=10
    ) as memory:
        yield memory, stored


async def test_rows_converge_to_a_new_embedder_without_a_command(
    tmp_path: Path, storage_url: str, project: Path
) -> None:
    async with new_embedder(tmp_path, storage_url, project) as (memory, stored):
        assert await memory.engine.store.count_needing_embedding("fake:new") == 3
        waiting = await memory.search("billing module", cwd=project)
        assert [h.record.id for h in waiting.hits][:1] == [stored[0].id]  # found by words
        assert any("3 records still await vectors" in w for w in waiting.warnings)
        async with anyio.create_task_group() as group:
            group.start_soon(memory.maintenance_loop)  # its first check runs at once

            async def all_embedded() -> bool:  # the loop, another task, writes the vectors
                return not await memory.engine.store.count_needing_embedding("fake:new")

            await eventually(all_embedded, within=10, what="the loop to embed the 3 records")
            group.cancel_scope.cancel()
        for record in stored:
            assert (await memory.get(record.id)).embedder == "fake:new"
        assert (await memory.search("billing module", cwd=project)).warnings == []


async def test_a_reembedding_cut_short_leaves_no_stale_count_of_records_awaiting(
    tmp_path: Path, storage_url: str, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The searches' count of records awaiting vectors (kept 30 s) is stale once a batch
    is written, not only once the run ends: a run cancelled between its last batch and
    its final count (the server's loop, stopped) left the warning for 30 s."""
    async with new_embedder(tmp_path, storage_url, project) as (memory, _):
        waiting = await memory.search("billing module", cwd=project)
        assert any("3 records still await vectors" in w for w in waiting.warnings)
        store = memory.engine.store
        real = store.count_needing_embedding
        calls: list[bool] = []

        async def cut_short(embedder: str | None, *, incomplete: bool = True) -> int:
            calls.append(incomplete)
            if len(calls) > 1:  # the final count, after the batches: the run stops there
                raise RuntimeError("cancelled")
            return await real(embedder, incomplete=incomplete)

        monkeypatch.setattr(store, "count_needing_embedding", cut_short)
        with pytest.raises(RuntimeError):
            await memory.engine.reembed()
        monkeypatch.setattr(store, "count_needing_embedding", real)
        assert await real("fake:new") == 0
        assert (await memory.search("billing module", cwd=project)).warnings == []


async def test_the_servers_loop_waits_for_a_quiet_spell_before_a_round(
    tmp_path: Path, storage_url: str, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round of the loop (here re-embedding) waits until no store or search has used
    the model for ``QUIET_S``, the first round too: a session's first calls come as its
    server starts, and do not share the machine with maintenance."""
    from memory_mcp.maintenance import runner

    monkeypatch.setattr(runner, "QUIET_S", 1.0)
    settings, database = store_place(tmp_path, storage_url, "m")
    async with MemoryService.open(
        settings, database=database, embedder=FakeEmbedder(name="fake:old"), wait_for_embedder=10
    ) as memory:
        for i, word in enumerate(["billing", "search", "auth"]):
            await memory.store(f"Fact number {i} about the {word} module", cwd=project)
    settings, database = store_place(tmp_path, storage_url, "m")
    settings.embedder.backend = "fastembed"
    async with MemoryService.open(
        settings, database=database, embedder=FakeEmbedder(name="fake:new"), wait_for_embedder=10
    ) as memory:
        store = memory.engine.store
        assert await store.count_needing_embedding("fake:new") == 3
        async with anyio.create_task_group() as group:
            group.start_soon(memory.maintenance_loop)
            busy_until = anyio.current_time() + 2.5
            while anyio.current_time() < busy_until:  # a search every 0.1 s: never quiet
                await memory.search("billing module", cwd=project)
                await anyio.sleep(0.1)
            assert await store.count_needing_embedding("fake:new") == 3  # not yet

            async def all_embedded() -> bool:
                return not await store.count_needing_embedding("fake:new")

            await eventually(all_embedded, within=10, what="the round once searches stop")
            group.cancel_scope.cancel()


# Several processes ----------------------------------------------------------------------

WORKER = Path(__file__).with_name("maintenance_worker.py")
WRITER = Path(__file__).with_name("concurrency_worker.py")


async def test_two_processes_never_run_the_sweep_at_once_and_writers_see_no_error(
    tmp_path: Path, storage_url: str, project: Path, workers: Workers
) -> None:
    settings, database = store_place(tmp_path, storage_url, "shared")
    async with MemoryService.open(
        settings, database=database, embedder=FakeEmbedder(), wait_for_embedder=10
    ) as memory:
        pairs = []
        for i in range(6):
            a = f"Service {i} reads its settings from config/service{i}.toml at start"
            b = f"Service {i} reads its settings from config/service{i}.toml at startup"
            old, new = (
                await plant(memory, a, project, days_ago=2),
                await plant(memory, b, project, days_ago=1),
            )
            pairs.append((old, new))
        await memory.reembed()
    # Each refine takes a while and logs when it ran and for which sweeper.
    calls = tmp_path / "llm-calls.log"
    slow = tmp_path / "slow-llm.py"
    slow.write_text(
        "import os, sys, time\n"
        "start = time.time()\n"
        "time.sleep(0.3)\n"
        f"with open({str(calls)!r}, 'a') as log:\n"
        "    log.write(f'{os.getppid()} {start} {time.time()}\\n')\n"
        "print(sys.stdin.read().splitlines()[-1][2:])\n"
    )
    llm = f"{sys.executable} {slow}"
    url = store_url(tmp_path, storage_url, "shared")
    sweepers = [workers.start(WORKER, url, 4, llm) for _ in range(2)]
    texts = [
        "The billing job runs nightly at 02:00 UTC",
        "Search indexes are rebuilt by make reindex",
        "Auth tokens expire after 15 minutes",
        "The mobile app ships through Fastlane",
        "Feature flags live in LaunchDarkly",
        "Logs go to Loki via the promtail sidecar",
        "Database migrations use Alembic",
        "The docs site is built with MkDocs Material",
        "Payments use the Stripe test keys in staging",
        "Images are resized by a Lambda on upload",
    ]
    writer = workers.start(WRITER, url, project, *texts)
    release(*sweepers, writer)
    attempts = [p.result(timeout=120) for p in sweepers]
    written = writer.result(timeout=120)

    assert [w["action"] for w in written] == ["inserted"] * len(texts)  # no error, all kept
    skipped = [a for runs in attempts for a in runs if a["report"]["skipped"]]
    assert skipped, "the two sweepers never met: the test proved nothing"
    assert all(not a["report"]["error"] for runs in attempts for a in runs)
    # The refines happen inside the sweep, under its lease: never two at once.
    refines = sorted(
        (float(start), float(end), pid)
        for pid, start, end in (line.split() for line in calls.read_text().splitlines())
    )
    assert len(refines) == len(pairs)
    for (_, end, _), (start, _, _) in itertools.pairwise(refines):
        assert start >= end, "two processes ran the sweep at the same time"
    folded = sum(a["report"]["counts"].get("folded", 0) for runs in attempts for a in runs)
    assert folded == len(pairs)
    async with MemoryService.open(
        settings, database=database, embedder=FakeEmbedder(), wait_for_embedder=10
    ) as memory:
        for old, new in pairs:
            record = await memory.get(new.id)
            assert [m.id for m in record.merged_from] == [old.id]


# A simulation: several projects over 180 days ----------------------------------------

TOPICS = [
    "the {p} service reads its settings from config/{p}-{i}.toml",
    "the {p} deploy job {i} runs from GitHub Actions on tags",
    "module {i} of {p} logs through structlog with JSON output",
    "the {p} cache {i} lives in Redis with a one hour TTL",
]


async def test_six_months_of_use_dry_runs_match_and_everything_is_reversible(
    tmp_path: Path, storage_url: str, clock: Clock
) -> None:
    roots = {}
    for name in ("active", "paused", "finished"):
        roots[name] = tmp_path / name
        (roots[name] / ".git").mkdir(parents=True)
    grace = timedelta(days=30)
    before_archive: dict[str, dict[str, Any]] = {}  # as each was before maintenance archived it
    archived_by: dict[str, str] = {}  # record id -> reason, as maintenance archived it
    totals: Counter[str] = Counter()
    settings, database = store_place(tmp_path, storage_url, "sim")
    async with MemoryService.open(
        settings, database=database, embedder=FakeEmbedder(), clock=clock
    ) as memory:
        for day in range(180):
            for name, root in roots.items():
                if (name == "paused" and day >= 60) or (name == "finished" and day >= 100):
                    continue
                topic = TOPICS[day % len(TOPICS)].format(p=name, i=day // 4)
                await memory.store(topic, cwd=root)
                if day % 3 == 0:  # a duplicate that slipped past the write path
                    await plant(memory, topic.capitalize() + ".", root)
                if day % 2 == 0:
                    await memory.search(TOPICS[(day + 1) % len(TOPICS)].split("{")[0], cwd=root)
            if day == 100:
                assert await memory.archive_project(roots["finished"]) > 0
            if day % 7 == 6:
                await memory.engine.write_accesses()  # the searches' counts, after them
                snapshot = {r["id"]: r async for r in _records(memory)}
                planned = await memory.maintain(dry_run=True)
                assert {r["id"]: r async for r in _records(memory)} == snapshot
                done = await Maintenance(memory.engine).run()
                assert [r.to_json() for r in planned] == [r.to_json() for r in done], day
                after = {r["id"]: r async for r in _records(memory)}
                purged = set(snapshot) - set(after)
                for record_id in purged:  # only what was archived longer than the grace window
                    archived_at = snapshot[record_id]["archived_at"]
                    assert archived_at is not None
                    assert parse_time(archived_at) < clock() - grace
                for record in after.values():
                    if record["archived_at"]:
                        assert parse_time(record["archived_at"]) >= clock() - grace
                        if snapshot[record["id"]]["archived_at"] is None:
                            archived_by[record["id"]] = record["archived_reason"]
                            before_archive[record["id"]] = snapshot[record["id"]]
                for report in done:
                    totals.update({f"{report.task}.{k}": n for k, n in report.counts.items()})
            clock.advance(days=1)
        assert totals["consolidate.folded"] > 0, totals
        assert totals["purge.purged"] > 0 and totals["staleness.archived"] > 0, totals
        # Restore what staleness archived and is still within the grace window.
        dormant = [i for i, why in archived_by.items() if why == "dormant"]
        kept = [r.id for r in await memory.engine.store.get_many(dormant)]
        assert kept, totals
        restored = await memory.restore(kept)
        for record in restored:
            assert record.to_json() == before_archive[record.id]
        done_records = await memory.engine.store.archived(
            (project_scope(roots["finished"]).key,), reason="project-done"
        )
        assert done_records == []  # archived on day 100: purged after the grace window


async def _records(memory: MemoryService) -> AsyncIterator[dict[str, Any]]:
    async for record in memory.engine.store.iter_records():
        yield record.to_json()


# Review findings: each would have slipped through before --------------------------


async def test_a_command_with_prompt_in_its_arguments_gets_no_stdin(tmp_path: Path) -> None:
    script = tmp_path / "reads-stdin.py"
    script.write_text("import sys\nprint(repr(sys.stdin.read()) + ' ' + sys.argv[1])\n")
    answer = await Command(f"{sys.executable} {script} {{prompt}}").complete("hello")
    assert answer == "'' hello"  # stdin was empty (/dev/null), not the server's own


def test_a_command_template_that_does_not_parse_is_refused_at_load() -> None:
    from memory_mcp.config import load_settings
    from memory_mcp.errors import ConfigError

    with pytest.raises(ConfigError, match="llm_command"):
        load_settings(env={"MEMORY_MCP_MAINTENANCE_LLM_COMMAND": 'claude -p "{prompt}'})


async def test_a_restored_dormant_fact_is_not_archived_again_at_once(
    memory: MemoryService, project: Path, clock: Clock
) -> None:
    fact = await memory.store("The staging database is called pigeon_stage", cwd=project)
    clock.advance(days=100)
    worker = Maintenance(memory.engine)
    [report] = await worker.run(["staleness"])
    assert report.counts == {"archived": 1, "projects": 1}
    await memory.restore([fact.id])
    clock.advance(hours=2)
    [again] = await worker.run(["staleness"])
    assert again.counts == {} and (await memory.get(fact.id)).current


async def test_a_folded_record_comes_back_field_for_field(
    memory: MemoryService, project: Path, clock: Clock
) -> None:
    first = await memory.store(
        "Run the linter with make lint before pushing", cwd=project, tags=["ci"]
    )
    await memory.search("linter make lint", cwd=project)
    await memory.engine.write_accesses()  # the search's count, written after its answer
    before = (await memory.get(first.id)).to_json()
    clock.advance(days=1)
    second = await memory.store("Run the linter with make lint before a push", cwd=project)
    assert second.action == "folded"
    holder = await memory.get(second.id)
    assert holder.access_count == 1 and holder.fold_count == 1
    [restored] = await memory.restore([first.id])
    assert restored.to_json() == before
    holder = await memory.get(second.id)
    assert (holder.merged_from, holder.fold_count, holder.access_count) == ([], 0, 0)


async def test_a_task_whose_lease_was_taken_over_stops(memory: MemoryService) -> None:
    now = await memory.engine.store.now()  # leases run on the store's clock
    lease = timedelta(seconds=memory.settings.maintenance.lease_seconds)
    stalled = now - lease - timedelta(seconds=1)  # claimed a lease ago: it has run out
    slow = Maintenance(memory.engine, holder="slow")
    assert await slow._claim("consolidate", stalled)
    run = TaskRun(
        memory.engine,
        "consolidate",
        holder="slow",
        llm=None,
        dry_run=False,
        cursor={},
        claimed=stalled,
    )
    [report] = await Maintenance(memory.engine, holder="other").run(["consolidate"])
    assert not report.skipped  # the stalled lease was free to take
    async with memory.engine.store.write() as tx:
        assert await tx.claim("consolidate", "other", _stamp(now), _stamp(now + lease))
    with pytest.raises(maintenance.LeaseLost):
        await run.renew()


async def test_purge_takes_the_history_of_a_forgotten_fact_and_keeps_a_folds(
    memory: MemoryService, project: Path, clock: Clock
) -> None:
    v15 = await memory.store("The pigeon app's minimum iOS version is 15.", cwd=project)
    v16 = await memory.store("The pigeon app's minimum iOS version is 16.", cwd=project)
    assert v16.action == "superseded"
    await memory.forget(v16.id)
    kept_old = await memory.store("The web app's minimum Node version is 18.", cwd=project)
    kept_new = await memory.store("The web app's minimum Node version is 20.", cwd=project)
    assert kept_new.action == "superseded"
    # the current one is absorbed by a sweep-like fold: its history moves to the holder
    holder = await plant(memory, "The web app's minimum Node version is 20", project)
    await memory.reembed()
    [swept] = await Maintenance(memory.engine).run(["consolidate"])
    assert swept.counts == {"folded": 1}
    assert (await memory.get(kept_new.id)).replaced_by == holder.id
    clock.advance(days=31)
    [report] = await Maintenance(memory.engine).run(["purge"])
    assert report.counts == {"purged": 3}  # v16, its history v15, and the folded record
    assert (
        await memory.engine.store.get(v15.id) is None
        and await memory.engine.store.get(v16.id) is None
    )
    history = await memory.get(kept_old.id)
    assert (
        history.replaced_by == holder.id and kept_old.id in (await memory.get(holder.id)).supersedes
    )


# secrets --------------------------------------------------------------------------------

AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
REDIS_URL = "redis://:s3cr3tP4ss@cache:6379"


async def stored_before_the_rules(memory: MemoryService, root: Path) -> dict[str, Record]:
    """A secret in each place a record keeps text: current, history, archived, folded
    into another record, and the text an LLM rewrote."""

    async def old(text: str) -> Record:
        return await plant(memory, text, root, scan=False)

    records = {
        "current": await old(f"AWS creds for staging: [REDACTED:aws-access-key-id] / {AWS_SECRET}"),
        "history": await old(f"Sessions live in {REDIS_URL}/0"),
        "archived": await old(f"Old cache was {REDIS_URL}/2"),
        "holder": await old("The cache is Redis 7 on the cache host"),
        "clean": await old("Deploys go through GitHub Actions"),
    }
    newer = await old("Sessions live in the database now")
    holder, folded = records["holder"], await old(f"Cache: {REDIS_URL}")
    at = format_time(memory.engine.clock())
    entry = absorb(holder, folded, at)
    holder.meta = {"previous_texts": [{"content": f"Redis at {REDIS_URL}", "by": "llm"}]}
    async with memory.engine.store.write() as tx:
        await tx.replace(records["history"], newer.id)
        await tx.archive(records["archived"].id, "forgotten", at)
        await tx.update_merged(holder, at)
        await tx.fold_into(folded, holder.id, entry, at)
    await memory.reembed()
    return records


async def found_by_words(memory: MemoryService, root: Path, text: str) -> list[str]:
    filters = Filters(scope_keys=(project_scope(root).key,), corpora=("facts",))
    return [item.record.id for item in await memory.engine.store.lexical(text, filters, 10)]


async def test_the_secrets_task_redacts_what_was_stored_before_its_rules(
    memory: MemoryService, project: Path
) -> None:
    records = await stored_before_the_rules(memory, project)
    identity = memory.engine.embeddings.identity
    assert identity is not None and await memory.engine.store.count_needing_embedding(identity) == 0
    assert await found_by_words(memory, project, "s3cr3tP4ss") == [records["holder"].id]

    [report] = await Maintenance(memory.engine).run(["secrets"])

    assert report.counts == {
        "scanned": 7,
        "redacted": 5,  # all but the clean record and the newer one
        "aws-secret-access-key": 1,
        "url-credentials": 5,  # one in the holder's folded text, one in its earlier text
    }
    everything = json.dumps([r.to_json() async for r in memory.engine.store.iter_records()])
    assert AWS_SECRET not in everything and "s3cr3tP4ss" not in everything
    assert "[REDACTED:url-credentials]" in (await memory.get(records["history"].id)).content
    assert (await memory.get(records["archived"].id)).archived_reason == "forgotten"
    assert (await memory.get(records["clean"].id)).embedder == identity  # untouched
    # The full-text index follows (and agrees with every record's text); the vectors
    # made from the secret's text are gone, and made again.
    assert await found_by_words(memory, project, "s3cr3tP4ss") == []
    assert records["holder"].id in await found_by_words(memory, project, "cache redis")
    assert (await memory.doctor()).healthy
    assert await memory.engine.store.count_needing_embedding(identity) == 2  # current and holder
    # No secret in what the run reports or records.
    state = (await memory.engine.store.tasks())["secrets"]
    assert "s3cr3tP4ss" not in json.dumps([report.to_json(), state.last_summary, state.cursor])
    [reembedded] = await Maintenance(memory.engine).run(["reembed"])
    assert reembedded.counts == {"embedded": 2}


async def test_the_secrets_task_runs_once_per_rule_set_and_twice_changes_nothing(
    memory: MemoryService, project: Path
) -> None:
    await stored_before_the_rules(memory, project)
    worker = Maintenance(memory.engine)
    [first] = await worker.run(["secrets"], due_only=True)
    assert first.counts["redacted"] == 5
    [later] = await worker.run(["secrets"], due_only=True)
    assert later.skipped == "the stored texts were scanned with the current rules"
    before = await _snapshot(memory)
    async with memory.engine.store.write() as tx:  # as if the texts were scanned by older rules
        assert await tx.claim("secrets", "test", "", "")
        assert await tx.finish(TaskState(task="secrets", cursor={"rules": "1:older"}), "test")
    [again] = await worker.run(["secrets"], due_only=True)
    assert again.counts == {"scanned": 7, "redacted": 0}
    assert await _snapshot(memory) == before


async def test_a_dry_run_counts_the_secrets_task_and_changes_nothing(
    memory: MemoryService, project: Path
) -> None:
    await stored_before_the_rules(memory, project)
    before = await _snapshot(memory)
    [planned] = await memory.maintain(dry_run=True, tasks=["secrets"])
    assert await _snapshot(memory) == before
    [done] = await Maintenance(memory.engine).run(["secrets"])
    assert planned.to_json() == done.to_json() and done.counts["redacted"] == 5


async def test_the_secrets_task_is_off_with_the_scan(
    memory: MemoryService, project: Path, settings: Settings
) -> None:
    await stored_before_the_rules(memory, project)
    settings.write.secrets = "off"
    [report] = await Maintenance(memory.engine).run(["secrets"])
    assert report.skipped == "write.secrets is off"
    [due] = await Maintenance(memory.engine).run(["secrets"], due_only=True)
    assert due.skipped == "write.secrets is off"
    assert "s3cr3tP4ss" in json.dumps(await _snapshot(memory))


async def test_the_secrets_task_rewrites_only_secrets_whose_shape_names_them(
    memory: MemoryService, project: Path
) -> None:
    """A labelled value is a guess: shown redacted, never rewritten in the store."""
    labelled = await plant(memory, "The staging password is Hunter2-staging!", project, scan=False)
    words = await plant(memory, "The login flow uses auth: oauth2 with PKCE", project, scan=False)
    [report] = await Maintenance(memory.engine).run(["secrets"])
    assert report.counts.get("redacted", 0) == 0
    assert (await memory.get(labelled.id)).content == "The staging password is Hunter2-staging!"
    assert (await memory.get(words.id)).content == "The login flow uses auth: oauth2 with PKCE"
    shown = await memory.search("staging password", cwd=project)
    assert [h.record.content for h in shown.hits] == [
        "The staging password is [REDACTED:password-assignment]"
    ]
