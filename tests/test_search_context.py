"""Search reads a memory in its conversation, and refines the query by feedback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from helpers.storage import store_place
from memory_mcp.config import Settings, replaced
from memory_mcp.embedders.base import FakeEmbedder
from memory_mcp.records import Conflict, format_time
from memory_mcp.service import MemoryService, StoreRequest
from memory_mcp.storage.base import Around, Filters
from memory_mcp.write import prepare

pytestmark = pytest.mark.anyio

T0 = datetime(2024, 3, 9, 14, 0, tzinfo=UTC)
QUESTION = "Caroline: Did you finally go to the pottery workshop in Lisbon?"
REPLY = "Melanie: Yes, twice! The second time my sister came along."
QUERY = "pottery workshop Lisbon"


async def _open(
    tmp_path: Path, storage_url: str, name: str, **search: float
) -> AsyncIterator[MemoryService]:
    base = Settings()
    settings = replaced(base, search=replaced(base.search, **search)) if search else base
    settings, database = store_place(tmp_path, storage_url, name, settings)
    async with MemoryService.open(
        settings, database=database, embedder=FakeEmbedder(), wait_for_embedder=10
    ) as service:
        yield service


async def _conversation(memory: MemoryService, project: Path) -> dict[str, str]:
    texts = {
        "question": (QUESTION, T0),
        "reply": (REPLY, T0),
        "later": ("Melanie: My sister visits again in June.", T0 + timedelta(hours=3)),
        "earlier": ("Caroline: The ferry to Porto was late again.", T0 - timedelta(days=2)),
    }
    results = await memory.store_valid(
        [
            StoreRequest(text, cwd=project, agent="chat", created_at=at)
            for text, at in texts.values()
        ]
    )
    ids = {name: r.id for name, r in zip(texts, results, strict=True)}  # type: ignore[union-attr]
    assert len(set(ids.values())) == 4
    return ids


async def test_a_reply_ranks_by_the_question_it_answers_and_is_no_hit_for_that_alone(
    tmp_path: Path, storage_url: str, project: Path
) -> None:
    orders = {}
    for name, minutes in (("on", 30), ("off", 0)):
        async for memory in _open(tmp_path, storage_url, name, context_minutes=minutes):
            ids = await _conversation(memory, project)
            ranking = await memory.search(QUERY, cwd=project, min_relevance=0.0)
            found = [h.record.id for h in ranking.hits]
            orders[name] = [next(k for k, v in ids.items() if v == rid) for rid in found]
            # At the relevance floor, only what holds the question's words is a hit:
            # the reply is not made one by its neighbour.
            hits = (await memory.search(QUERY, cwd=project)).hits
            assert [h.record.id for h in hits] == [ids["question"]]
    assert orders["on"][:2] == ["question", "reply"]
    assert orders["off"][0] == "question" and orders["off"].index("reply") > 1
    # Written three hours later: another conversation, not lifted by the question.
    assert orders["on"].index("later") > orders["on"].index("reply")


def _neighbours(around: dict[str, Around], names: dict[str, str]) -> dict[str, list[str]]:
    name_of = {v: k for k, v in names.items()}
    return {name_of[rid]: sorted(name_of[n] for n in a.neighbours) for rid, a in around.items()}


async def test_neighbours_in_time_stay_in_their_project_and_skip_what_is_gone(
    memory: MemoryService, project: Path, other_project: Path
) -> None:
    ids = await _conversation(memory, project)
    elsewhere = await memory.store(
        "Caroline: An unrelated note", cwd=other_project, created_at=T0 + timedelta(minutes=1)
    )
    ids["elsewhere"] = elsewhere.id
    embedder = memory.engine.embeddings.identity
    assert embedder is not None
    within = 30 * 60.0
    around = await memory.engine.store.in_conversation(
        [*ids.values(), "no-such-id"], within, embedder
    )
    # Same creation time: both are each other's neighbour; the other project's note
    # and the records hours or days away are nobody's.
    assert _neighbours(around, ids) == {
        "question": ["reply"],
        "reply": ["question"],
        "later": [],
        "earlier": [],
        "elsewhere": [],
    }
    expected = FakeEmbedder().embed([REPLY])[0]
    vector = around[ids["reply"]].vector
    # int8 codes in the in-memory copy: the cosine moves by a little
    assert float(vector @ expected) / float(np.linalg.norm(vector)) == pytest.approx(1, abs=1e-2)
    neighbour = around[ids["question"]].neighbours[ids["reply"]]
    assert float(np.abs(neighbour - vector).max()) < 1e-6
    await memory.forget(ids["reply"], cwd=project)
    around = await memory.engine.store.in_conversation([ids["question"]], within, embedder)
    assert around[ids["question"]].neighbours == {}
    # A wider window reaches across the hours (and the days); none reads only the records.
    wide = await memory.engine.store.in_conversation([ids["question"]], 3 * 86400.0, embedder)
    assert _neighbours(wide, ids) == {"question": ["earlier", "later"]}
    alone = await memory.engine.store.in_conversation([ids["question"]], 0, embedder)
    assert _neighbours(alone, ids) == {"question": []}
    assert await memory.engine.store.in_conversation([ids["question"]], within, "other:model") == {}


async def test_the_candidates_trip_reads_what_the_search_reads_next_as_apart(
    memory: MemoryService, project: Path, storage_url: str
) -> None:
    """``candidate_reads`` gives what ``nearest_with_scores``, ``in_conversation`` and
    ``open_conflicts_of`` give apart; SQLite, on its copy of the vectors, reads them
    all in one trip."""
    ids = await _conversation(memory, project)
    store = memory.engine.store
    embedder = memory.engine.embeddings.identity
    assert embedder is not None
    keys = await memory.engine.scope_keys("project", project)
    async with store.write() as tx:
        await tx.add_conflict(keys[0], ids["later"], ids["earlier"], "test", format_time(T0))
        await tx.add_conflict(keys[0], ids["reply"], "f_elsewhere", "test", format_time(T0))
    filters = Filters(scope_keys=keys, corpora=("facts",))
    await store.load_vectors(embedder, keys)
    query = FakeEmbedder().embed([QUERY])[0]
    within = 30 * 60.0
    asked = [ids["later"], ids["earlier"], "no-such-id"]
    read = await store.candidate_reads(
        query, embedder, filters, 2, asked, within_seconds=within, conflicts=True
    )
    assert (read.near, read.scores) == await store.nearest_with_scores(
        query, embedder, filters, 2, asked
    )
    found = [*(s.record.id for s in read.near), *read.scores]
    assert {ids["question"], ids["later"], ids["earlier"]} <= set(found)
    if not storage_url:
        assert read.around is not None and read.conflicts is not None
    if read.around is not None:
        apart = await store.in_conversation(found, within, embedder)
        assert list(read.around) == list(apart)
        for rid, both in read.around.items():
            assert np.array_equal(both.vector, apart[rid].vector)
            assert both.neighbours.keys() == apart[rid].neighbours.keys()
            for other, vector in both.neighbours.items():
                assert np.array_equal(vector, apart[rid].neighbours[other])
        assert _neighbours(read.around, ids)["question"] == ["reply"]
    if read.conflicts is not None:
        everyone = list(dict.fromkeys([*(s.record.id for s in read.near), *asked]))
        assert read.conflicts == await store.open_conflicts_of(everyone)
        assert len(read.conflicts) == 1 + (ids["reply"] in everyone)
    unread = await store.candidate_reads(query, embedder, filters, 2, asked)
    assert (unread.near, unread.scores, unread.around, unread.conflicts) == (
        read.near,
        read.scores,
        None,
        None,
    )


async def test_a_hit_in_a_conflict_shows_it_read_with_the_candidates(
    memory: MemoryService, project: Path, storage_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The conflict a hit is in comes with it: read in the candidates' trip on SQLite (no
    read of its own), apart on Postgres."""
    ids = await _conversation(memory, project)
    store = memory.engine.store
    keys = await memory.engine.scope_keys("project", project)
    await memory.search(QUERY, cwd=project)  # the copy holds the searched scopes now
    async with store.write() as tx:
        number = await tx.add_conflict(
            keys[0], ids["question"], ids["earlier"], "test", format_time(T0)
        )
    apart: list[list[str]] = []
    read_apart = store.open_conflicts_of

    async def counted(record_ids: list[str]) -> list[Conflict]:
        apart.append(list(record_ids))
        return await read_apart(record_ids)

    monkeypatch.setattr(store, "open_conflicts_of", counted)
    hits = (await memory.search(QUERY, cwd=project)).hits
    assert [h.record.id for h in hits] == [ids["question"]]
    assert hits[0].notes["conflict"]["id"] == number
    assert hits[0].notes["conflict"]["with"]["id"] == ids["earlier"]
    assert (apart == []) == (not storage_url)
    # project_search reads each corpus's candidates apart, and their conflicts with them
    first = (await memory.project_search(QUERY, cwd=project)).hits[0]
    assert first.record.id == ids["question"] and first.notes["conflict"]["id"] == number
    assert (apart == []) == (not storage_url)


async def test_a_neighbour_in_time_without_a_vector_is_left_out(
    memory: MemoryService, project: Path
) -> None:
    """A record stored without vectors (the model away) is nobody's neighbour, and the
    record before it has none on that side."""
    ids = await _conversation(memory, project)
    scope = (await memory.engine.project(project)).scope
    bare = prepare(
        "Caroline: (a photo of the workshop)",
        kind="fact",
        scope=scope,
        importance=None,
        tags=(),
        agent="chat",
        at=T0 + timedelta(minutes=1),
        settings=memory.engine.settings.write,
    ).record
    async with memory.engine.store.write() as tx:
        await tx.insert(bare, None)
    ids["bare"] = bare.id
    embedder = memory.engine.embeddings.identity
    assert embedder is not None
    around = await memory.engine.store.in_conversation(
        [ids["question"], ids["reply"], bare.id], 30 * 60.0, embedder
    )
    assert _neighbours(around, ids) == {"question": ["reply"], "reply": ["question"]}


async def test_feedback_reorders_the_relevant_hits_and_admits_none(
    tmp_path: Path, storage_url: str, project: Path
) -> None:
    texts = [
        "Deploy the billing service with helm from the release branch",
        "Billing service deploys need the on-call engineer watching the helm rollout dashboards",
        "The rollout dashboards and the on-call rota live in Grafana",
        "Invoices are emailed on the first of each month",
    ]
    query = "deploy billing service helm"
    orders = {}
    for name, weight in (("with", 0.7), ("without", 0.0)):
        async for memory in _open(
            tmp_path, storage_url, name, feedback_weight=weight, context_minutes=0
        ):
            stored = await memory.store_valid(
                [
                    StoreRequest(t, cwd=project, created_at=T0 - timedelta(days=i))
                    for i, t in enumerate(texts)
                ]
            )
            index = {r.id: n for n, r in enumerate(stored)}  # type: ignore[union-attr]
            ranking = await memory.search(query, cwd=project, limit=10, min_relevance=0.0)
            orders[name] = [index[h.record.id] for h in ranking.hits]
            relevant = (await memory.search(query, cwd=project, limit=10)).hits
            assert [index[h.record.id] for h in relevant] == [0, 1]
            # Nothing about the query at all: feedback admits nothing.
            assert (await memory.search("ferry timetable Porto", cwd=project)).hits == []
    assert sorted(orders["with"]) == sorted(orders["without"])
    assert orders["with"][:2] == [0, 1]
    # What the two best hits share (rollout dashboards, on-call) lifts the third above
    # the invoices, which nothing ties to the question.
    assert orders["with"].index(2) < orders["with"].index(3)
    assert orders["without"].index(3) < orders["without"].index(2)
