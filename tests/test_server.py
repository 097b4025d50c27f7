"""The MCP server in-process: tools, schemas, provenance, cwd, the unified contract, bad input."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from mcp_types import CallToolResult, ListRootsResult, Root

from helpers.storage import store_place
from helpers.tools import call, in_process
from memory_mcp.embedders.base import FakeEmbedder
from memory_mcp.errors import InvalidInput, StorageError
from memory_mcp.ingest import ingest
from memory_mcp.mcp.tools import agent_name, compact_schema, root_path
from memory_mcp.records import Record
from memory_mcp.scope import project_root
from memory_mcp.service import UNIFIED_CONTENT_CAP, MemoryService
from memory_mcp.storage.base import Filters
from memory_mcp.write import new_id

pytestmark = pytest.mark.anyio

TOOLS = {
    "memory_store",
    "memory_search",
    "project_search",
    "searchUnifiedMemory",
    "memory_forget",
    "memory_brief",
}


async def count_records(memory: MemoryService) -> int:
    stats = await memory.engine.store.stats()
    return sum(stats.records.values())


# tools/list ---------------------------------------------------------------------------


async def test_tools_list_is_small_described_and_complete(memory: MemoryService) -> None:
    async with in_process(memory) as c:
        tools = (await c.list_tools()).tools
    assert {t.name for t in tools} == TOOLS
    wire = json.dumps(
        {"tools": [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]}
    )
    assert len(wire) < 6000, f"tools/list is {len(wire)} characters"
    for tool in tools:
        assert tool.description and tool.description.count(".") == 1, tool.name
        assert tool.output_schema is not None, f"{tool.name} has no structured output"
        properties = tool.input_schema["properties"]
        for name, schema in properties.items():
            assert schema.get("description"), f"{tool.name}.{name} has no description"
        assert "roots" not in properties and "ctx" not in properties
        assert '"title"' not in json.dumps([tool.input_schema, tool.output_schema])


def test_compact_schema_drops_titles_and_null_arms_but_not_fields_named_title() -> None:
    schema = {
        "title": "Args",
        "type": "object",
        "properties": {
            "title": {"title": "Title", "type": "string"},
            "cwd": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        },
    }
    assert compact_schema(schema) == {
        "type": "object",
        "properties": {"title": {"type": "string"}, "cwd": {"type": "string"}},
    }
    output = {"properties": {"x": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": ""}}}
    assert compact_schema(output, nullable=True) == {
        "properties": {"x": {"anyOf": [{"type": "string"}, {"type": "null"}]}}
    }


# Provenance and working directory -----------------------------------------------------


@pytest.mark.parametrize(
    ("client_name", "agent"),
    [
        ("claude-code", "claude"),
        ("codex-mcp-client", "codex"),
        ("codex", "codex"),
        ("gemini-cli-mcp-client", "gemini"),
        ("gemini-cli", "gemini"),
        ("cursor-vscode", "cursor-vscode"),
        ("", "unknown"),
        (None, "unknown"),
    ],
)
def test_agent_name_from_client_info(client_name: str | None, agent: str) -> None:
    assert agent_name(client_name) == agent


async def test_store_records_the_calling_agent_and_search_shows_it(
    memory: MemoryService, project: Path
) -> None:
    async with in_process(memory, "claude-code") as c:
        stored = await call(
            c, "memory_store", content="We deploy with Fly.io", cwd=str(project), kind="decision"
        )
    assert stored["action"] == "inserted"
    async with in_process(memory, "codex-mcp-client") as c:
        found = await call(c, "memory_search", query="deploy Fly.io", cwd=str(project))
    assert [r["id"] for r in found["results"]] == [stored["id"]]
    assert found["results"][0]["agent"] == "claude"
    assert found["results"][0]["kind"] == "decision"


async def test_memory_store_can_keep_a_memory_private(memory: MemoryService, project: Path) -> None:
    async with in_process(memory, "claude-code") as c:
        stored = await call(
            c, "memory_store", content="My on-call week is the 12th", cwd=str(project), private=True
        )
    record = await memory.get(stored["id"])
    assert record.private and record.user == memory.engine.store.user


async def test_cwd_comes_from_the_clients_roots_when_not_given(
    memory: MemoryService, project: Path
) -> None:
    async def roots(_context: Any) -> ListRootsResult:
        return ListRootsResult(roots=[Root(uri=(project / "src").as_uri())])  # type: ignore[arg-type]

    for mode in ("legacy", "auto"):
        async with in_process(memory, list_roots_callback=roots, mode=mode) as c:
            stored = await call(c, "memory_store", content=f"Roots decide the project ({mode})")
        record = await memory.get(stored["id"])
        assert record.scope_key == str(project_root(project)), mode


async def test_a_cwd_inside_the_roots_wins_and_one_outside_them_is_refused(
    memory: MemoryService, project: Path, other_project: Path, tmp_path: Path
) -> None:
    async def roots(_context: Any) -> ListRootsResult:
        return ListRootsResult(roots=[Root(uri=project.as_uri())])  # type: ignore[arg-type]

    (project / "src" / "link").symlink_to(other_project)
    async with in_process(memory, list_roots_callback=roots) as c:
        stored = await call(c, "memory_store", content="Explicit cwd", cwd=str(project / "src"))
        assert (await memory.get(stored["id"])).scope_key == str(project_root(project))
        for outside in (
            other_project,
            project / ".." / other_project.name,  # .. resolved
            project / "src" / "link",  # a symlink out of the root
            "//server/share",  # UNC-like
        ):
            result = await c.call_tool(
                "memory_store", {"content": "Elsewhere", "cwd": str(outside)}
            )
            assert result.is_error, outside
            text = result.content[0].text  # type: ignore[union-attr]
            assert "outside the client's roots" in text or "not an existing directory" in text
    assert (await memory.engine.store.stats()).records == {("facts", "project", "current"): 1}


async def test_without_cwd_or_roots_the_process_cwd_is_the_project(
    memory: MemoryService, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(project / "src" / "pkg")
    async with in_process(memory) as c:
        stored = await call(c, "memory_store", content="The process cwd decides")
    assert (await memory.get(stored["id"])).scope_key == str(project_root(project))


async def test_a_root_that_is_not_a_local_directory_is_a_clear_error(
    memory: MemoryService, tmp_path: Path
) -> None:
    async def roots(_context: Any) -> ListRootsResult:
        return ListRootsResult(roots=[Root(uri=(tmp_path / "gone").as_uri())])  # type: ignore[arg-type]

    async with in_process(memory, list_roots_callback=roots) as c:
        result = await c.call_tool("memory_store", {"content": "x"})
    assert result.is_error
    assert "pass cwd" in _text(result)
    assert await count_records(memory) == 0


def test_root_path_reads_file_uris_only() -> None:
    assert root_path("file:///home/me/my%20app") == Path("/home/me/my app")
    with pytest.raises(InvalidInput, match="not a file:// URI"):
        root_path("https://example.com/repo")
    with pytest.raises(InvalidInput, match="another host"):
        root_path("file://build-box/home/me")


async def test_one_server_serves_many_projects(
    memory: MemoryService, project: Path, other_project: Path
) -> None:
    async with in_process(memory) as c:
        await call(c, "memory_store", content="Alpha uses Postgres", cwd=str(project))
        await call(c, "memory_store", content="Beta uses Redis", cwd=str(other_project))
        alpha = await call(c, "memory_search", query="uses", cwd=str(project))
        beta = await call(c, "memory_search", query="uses", cwd=str(other_project))
    assert [r["content"] for r in alpha["results"]] == ["Alpha uses Postgres"]
    assert [r["content"] for r in beta["results"]] == ["Beta uses Redis"]


# Tools --------------------------------------------------------------------------------


async def test_store_reports_folds_and_redactions(memory: MemoryService, project: Path) -> None:
    async with in_process(memory) as c:
        first = await call(c, "memory_store", content="Run tests with make test", cwd=str(project))
        again = await call(c, "memory_store", content="Run tests with make test.", cwd=str(project))
        secret = await call(
            c,
            "memory_store",
            content="The staging key is AKIAIOSFODNN7EXAMPLE",
            cwd=str(project),
        )
    assert again["action"] == "folded"
    assert again["related_id"] == first["id"]
    assert again["related_content"] == "Run tests with make test"
    assert secret["redacted"], secret
    assert "AKIAIOSFODNN7EXAMPLE" not in (await memory.get(secret["id"])).content


async def test_global_scope_only_when_asked(
    memory: MemoryService, project: Path, other_project: Path
) -> None:
    async with in_process(memory) as c:
        local = await call(c, "memory_store", content="Tabs here", cwd=str(project))
        everywhere = await call(
            c, "memory_store", content="Answer tersely", scope="global", cwd=str(project)
        )
        seen = await call(c, "memory_search", query="tabs tersely answer", cwd=str(other_project))
    assert (await memory.get(local["id"])).scope == "project"
    assert (await memory.get(everywhere["id"])).scope == "global"
    assert [r["id"] for r in seen["results"]] == [everywhere["id"]]


async def test_project_search_fans_out_over_every_corpus_and_labels_hits(
    memory: MemoryService, project: Path
) -> None:
    (project / "README.md").write_text("# Release\n\nReleases are cut from the main branch.\n")
    await ingest(memory.engine, project)
    async with in_process(memory) as c:
        await call(c, "memory_store", content="Releases need a changelog entry", cwd=str(project))
        await call(
            c, "memory_store", content="Cut release 1.2 today", kind="journal", cwd=str(project)
        )
        await call(c, "memory_store", content="Ship release 2.0", kind="goal", cwd=str(project))
        found = await call(c, "project_search", query="release", cwd=str(project), limit=10)
    corpora = {r["corpus"] for r in found["results"]}
    assert corpora == {"facts", "journal", "docs", "knowledge"}
    chunk = next(r for r in found["results"] if r["corpus"] == "knowledge")
    assert chunk["meta"] == {"path": "README.md", "heading": "Release"}
    scores = [r["score"] for r in found["results"]]
    assert scores == sorted(scores, reverse=True)


async def test_forget_archives_in_reach_only(
    memory: MemoryService, project: Path, other_project: Path
) -> None:
    async with in_process(memory) as c:
        stored = await call(c, "memory_store", content="We use yarn", cwd=str(project))
        elsewhere = await c.call_tool(
            "memory_forget", {"id": stored["id"], "reason": "npm now", "cwd": str(other_project)}
        )
        assert elsewhere.is_error and "no record" in _text(elsewhere)
        forgotten = await call(
            c, "memory_forget", id=stored["id"], reason="we moved to npm", cwd=str(project)
        )
        after = await call(c, "memory_search", query="yarn", cwd=str(project))
    assert forgotten["reason"] == "we moved to npm"
    assert (await memory.get(stored["id"])).archived_reason == "we moved to npm"
    assert after["results"] == []


async def test_hits_say_what_they_supersede_and_which_conflict_they_are_in(
    memory: MemoryService, project: Path
) -> None:
    async with in_process(memory) as c:
        old = await call(
            c, "memory_store", content="The API listens on port 8080", cwd=str(project)
        )
        new = await call(
            c, "memory_store", content="The API listens on port 9090", cwd=str(project)
        )
        assert new["action"] == "superseded"
        found = await call(c, "memory_search", query="API port", cwd=str(project))
        [hit] = found["results"]
        assert hit["meta"]["supersedes"]["id"] == old["id"]
        assert hit["meta"]["supersedes"]["content"] == "The API listens on port 8080"
        await call(
            c, "memory_store", content="Always squash commits before merging", cwd=str(project)
        )
        flagged = await call(
            c, "memory_store", content="Never squash commits before merging", cwd=str(project)
        )
        assert flagged["action"] == "conflict"
        found = await call(c, "memory_search", query="squash commits", cwd=str(project))
        conflicts = {r["id"]: r["meta"]["conflict"] for r in found["results"]}
        assert {c["id"] for c in conflicts.values()} == {flagged["conflict_id"]}
        assert conflicts[flagged["id"]]["with"]["content"] == "Always squash commits before merging"
        [older] = [rid for rid in conflicts if rid != flagged["id"]]
        assert conflicts[older]["with"] == {  # each side shows the other, both in the results
            "id": flagged["id"],
            "content": "Never squash commits before merging",
            "created_at": (await memory.get(flagged["id"])).created_at,
        }
        unified = await call(c, "searchUnifiedMemory", query="squash commits", cwd=str(project))
        assert len(unified["results"]) == 2
        assert all(
            r["metadata"]["conflict"]["id"] == flagged["conflict_id"] for r in unified["results"]
        )


async def test_forget_needs_no_reason(memory: MemoryService, project: Path) -> None:
    async with in_process(memory) as c:
        stored = await call(c, "memory_store", content="We use yarn", cwd=str(project))
        forgotten = await call(c, "memory_forget", id=stored["id"], cwd=str(project))
    assert forgotten["reason"] == "forgotten"
    assert (await memory.get(stored["id"])).archived_at is not None


# searchUnifiedMemory ------------------------------------------------------------------


async def put(
    memory: MemoryService,
    corpus: str,
    kind: str,
    content: str,
    scope_key: str,
    *,
    at: str = "2026-11-01T00:00:00.000000Z",
    meta: dict[str, Any] | None = None,
) -> str:
    """A record written directly (insights and chunks are not storable by tools)."""
    vectors = await memory.engine.embed_records([content])
    record = Record(
        id=new_id(corpus),  # type: ignore[arg-type]
        corpus=corpus,  # type: ignore[arg-type]
        kind=kind,
        scope="project",
        scope_key=scope_key,
        content=content,
        agent="test",
        created_at=at,
        updated_at=at,
        importance=0.5,
        embedder=memory.engine.embeddings.identity if vectors else None,
        meta=meta or {},
    )
    async with memory.engine.store.write() as tx:
        await tx.insert(record, vectors[0] if vectors else None)
    return record.id


async def unified(memory: MemoryService, project: Path, **arguments: Any) -> dict[str, Any]:
    async with in_process(memory) as c:
        return await call(c, "searchUnifiedMemory", cwd=str(project), **arguments)


@pytest.fixture
async def three_sources(memory: MemoryService, project: Path) -> dict[str, str]:
    key = str(project_root(project))
    return {
        "memory": await put(memory, "facts", "fact", "The cache lives in Redis", key),
        "insights": await put(memory, "insights", "insight", "Redis is the cache layer", key),
        "knowledge": await put(
            memory,
            "knowledge",
            "chunk",
            "## Cache\n\nRedis caches sessions",
            key,
            meta={"path": "docs/cache.md", "heading": "Cache"},
        ),
    }


async def test_unified_defaults_to_every_source(
    memory: MemoryService, project: Path, three_sources: dict[str, str]
) -> None:
    result = await unified(memory, project, query="redis cache", threshold=0)
    assert {r["type"]: r["id"] for r in result["results"]} == three_sources
    assert result["warnings"] == []
    for item in result["results"]:
        assert set(item) == {"type", "id", "content", "similarity", "metadata"}
        assert 0 <= item["similarity"] <= 1
    chunk = next(r for r in result["results"] if r["type"] == "knowledge")
    assert chunk["metadata"]["path"] == "docs/cache.md"


@pytest.mark.parametrize(
    "sources", [["memory"], ["insights"], ["knowledge"], ["memory", "knowledge"]]
)
async def test_unified_explicit_sources(
    memory: MemoryService, project: Path, three_sources: dict[str, str], sources: list[str]
) -> None:
    result = await unified(memory, project, query="redis cache", sources=sources, threshold=0)
    assert sorted(r["type"] for r in result["results"]) == sorted(sources)


async def test_unified_limit_bounds(memory: MemoryService, project: Path) -> None:
    key = str(project_root(project))
    for n in range(25):
        await put(memory, "facts", "fact", f"Service {n} logs to stdout", key)
    assert len((await unified(memory, project, query="logs", threshold=0))["results"]) == 8
    twenty = await unified(memory, project, query="logs", threshold=0, limit=20)
    assert len(twenty["results"]) == 20
    async with in_process(memory) as c:
        for bad in (0, 21):
            result = await c.call_tool("searchUnifiedMemory", {"query": "logs", "limit": bad})
            assert result.is_error and "1 to 20" in _text(result)


async def test_unified_threshold_filters_by_similarity(
    memory: MemoryService, project: Path, three_sources: dict[str, str]
) -> None:
    key = str(project_root(project))
    await put(memory, "facts", "fact", "Lunch is at noon on Fridays", key)
    everything = (await unified(memory, project, query="redis cache", threshold=0))["results"]
    similarities = sorted(r["similarity"] for r in everything)
    assert len(similarities) >= 2
    cut = (similarities[0] + similarities[-1]) / 2
    kept = (await unified(memory, project, query="redis cache", threshold=cut))["results"]
    assert kept
    assert all(r["similarity"] >= cut for r in kept)
    assert {r["id"] for r in kept} == {r["id"] for r in everything if r["similarity"] >= cut}
    none = await unified(memory, project, query="redis cache", threshold=1.0)
    assert all(r["similarity"] >= 1.0 for r in none["results"])


async def test_unified_caps_content(memory: MemoryService, project: Path) -> None:
    key = str(project_root(project))
    long = "Deploy notes: " + "the rollout goes region by region. " * 100
    await put(memory, "knowledge", "chunk", long, key)
    (item,) = (await unified(memory, project, query="rollout region", threshold=0))["results"]
    assert len(item["content"]) == UNIFIED_CONTENT_CAP
    assert item["content"].endswith("…")
    assert long.startswith(item["content"][:-1])


async def test_unified_sorts_by_similarity_then_type_then_id(
    memory: MemoryService, project: Path
) -> None:
    key = str(project_root(project))
    text = "Feature flags live in LaunchDarkly"
    ids = [
        await put(memory, corpus, kind, text, key)
        for corpus, kind in [
            ("knowledge", "chunk"),
            ("insights", "insight"),
            ("knowledge", "chunk"),
            ("facts", "fact"),
        ]
    ]
    await put(memory, "facts", "fact", "Flags are reviewed monthly", key)
    results = (await unified(memory, project, query="feature flags", threshold=0))["results"]
    order = [(-r["similarity"], r["type"], r["id"]) for r in results]
    assert order == sorted(order)
    tied = [r for r in results if r["id"] in ids]
    assert len({r["similarity"] for r in tied}) == 1, "identical records must tie"
    assert [r["type"] for r in tied] == ["insights", "knowledge", "knowledge", "memory"]
    knowledge = [r["id"] for r in tied if r["type"] == "knowledge"]
    assert knowledge == sorted(knowledge)


async def test_unified_a_failing_source_warns_and_the_others_answer(
    memory: MemoryService,
    project: Path,
    three_sources: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lexical = memory.engine.store.lexical

    async def broken(text: str, filters: Filters, k: int) -> Any:
        if filters.corpora == ("knowledge",):
            raise StorageError("database disk image is malformed")
        return await lexical(text, filters, k)

    monkeypatch.setattr(memory.engine.store, "lexical", broken)
    result = await unified(memory, project, query="redis cache", threshold=0)
    assert {r["type"] for r in result["results"]} == {"memory", "insights"}
    (warning,) = result["warnings"]
    assert warning.startswith("knowledge: search failed")
    assert "malformed" in warning


async def test_unified_embeds_the_query_once(
    memory: MemoryService,
    project: Path,
    three_sources: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[list[str]] = []
    embed = memory.engine.embeddings.embed

    async def counting(texts: list[str]) -> Any:
        calls.append(list(texts))
        return await embed(texts)

    monkeypatch.setattr(memory.engine.embeddings, "embed", counting)
    await unified(memory, project, query="redis cache", threshold=0)
    assert calls == [["redis cache"]]


# Bad input ----------------------------------------------------------------------------

BAD_INPUTS: list[tuple[str, dict[str, Any], str]] = [
    ("memory_store", {"content": ""}, "content is empty"),
    ("memory_store", {"content": " \n\t "}, "content is empty"),
    ("memory_store", {"content": 42}, "content"),
    ("memory_store", {"content": "x", "kind": "note"}, "unknown kind 'note'"),
    ("memory_store", {"content": "x", "kind": "chunk"}, "unknown kind 'chunk'"),
    ("memory_store", {"content": "x", "scope": "session"}, "'project' or 'global'"),
    ("memory_store", {"content": "x", "importance": 1.5}, "importance must be a number from 0"),
    ("memory_store", {"content": "x", "importance": -0.1}, "importance must be a number from 0"),
    ("memory_store", {"content": "x" * 64_001}, "the limit is 64,000"),
    ("memory_store", {"content": "x", "cwd": "relative/dir"}, "cwd must be an absolute path"),
    ("memory_store", {"content": "x", "cwd": "/no/such/dir"}, "is not an existing directory"),
    ("memory_store", {"content": "x", "tags": ["t" * 100]}, "keep tags under 64"),
    ("memory_search", {"query": ""}, "query is empty"),
    ("memory_search", {"query": "x", "limit": 0}, "from 1 to 50"),
    ("memory_search", {"query": "x", "limit": 51}, "from 1 to 50"),
    ("memory_search", {"query": "x", "kinds": ["bogus"]}, "unknown kind 'bogus'"),
    ("memory_search", {"query": "x", "since": "last week"}, "since must be an ISO-8601"),
    ("memory_search", {"query": "x", "scope": "everywhere"}, "'project', 'global' or 'all'"),
    ("project_search", {"query": " "}, "query is empty"),
    ("project_search", {"query": "x", "limit": 500}, "from 1 to 50"),
    ("searchUnifiedMemory", {"query": "x", "sources": ["web"]}, "unknown source 'web'"),
    ("searchUnifiedMemory", {"query": "x", "sources": []}, "sources is empty"),
    ("searchUnifiedMemory", {"query": "x", "threshold": 2}, "threshold must be a number"),
    ("searchUnifiedMemory", {"query": "x", "limit": 21}, "from 1 to 20"),
    ("memory_forget", {"id": "f_nope", "reason": "wrong"}, "no record with id 'f_nope'"),
    ("memory_forget", {"id": "f_nope", "reason": " "}, "reason is empty"),
    ("memory_forget", {"id": "f_nope", "why": "wrong"}, "unknown argument 'why'"),
    # Argument errors are one sentence naming the argument, never pydantic's report.
    ("memory_store", {}, "memory_store: content is required."),
    ("memory_store", {"content": "x", "bogus": 1}, "unknown argument 'bogus'; it takes content"),
    ("memory_search", {"query": "x", "limit": "many"}, "limit must be a whole number, got"),
    ("memory_search", {"query": "x", "kinds": "fact"}, "kinds must be a list"),
    (
        "memory_search",
        {"query": "x", "since": "2026-02-01", "until": "2026-01-01"},
        "since (2026-02-01) is not before until (2026-01-01)",
    ),
]


@pytest.mark.parametrize(("tool", "arguments", "message"), BAD_INPUTS)
async def test_bad_input_is_a_tool_error_that_says_what_to_change_and_writes_nothing(
    memory: MemoryService,
    project: Path,
    tool: str,
    arguments: dict[str, Any],
    message: str,
) -> None:
    async with in_process(memory) as c:
        seeded = await call(c, "memory_store", content="Seed memory", cwd=str(project))
        before = await count_records(memory)
        arguments = {"cwd": str(project), **arguments}
        result = await c.call_tool(tool, arguments)
        assert result.is_error, f"{tool} accepted {str(arguments)[:200]}"
        assert message in _text(result), _text(result)
        assert "\n" not in _text(result) and "pydantic" not in _text(result), _text(result)
        assert not _text(result).startswith("Error executing tool"), _text(result)
        assert await count_records(memory) == before
        assert (await memory.get(seeded["id"])).current
        # The server is still up and answers a good call.
        await call(c, "memory_search", query="seed", cwd=str(project))


def test_at_least_fifteen_bad_inputs_are_covered() -> None:
    assert len(BAD_INPUTS) >= 15


def _text(result: CallToolResult) -> str:
    return " ".join(getattr(block, "text", "") for block in result.content)


class SlowToLoad(FakeEmbedder):
    """A model that is still loading until the test lets it finish."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def load(self, *, download: bool = False) -> None:
        assert self.release.wait(30), "the test never released the model"


async def test_the_first_store_and_search_wait_for_the_model_that_is_loading(
    tmp_path: Path, storage_url: str, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session's first calls arrive before the model has loaded: they wait for it."""
    slow = SlowToLoad()
    settings, database = store_place(tmp_path, storage_url, "slow")
    async with (
        MemoryService.open(settings, database=database, embedder=slow) as memory,
        in_process(memory) as c,
    ):
        waited = memory.engine.embeddings.wait_settled

        async def wait_then_load(seconds: float) -> bool:
            slow.release.set()  # the model finishes loading only once a call waits for it
            return await waited(seconds)

        monkeypatch.setattr(memory.engine.embeddings, "wait_settled", wait_then_load)
        stored = await call(c, "memory_store", content="Docs live in docs/", cwd=str(project))
        assert (await memory.get(stored["id"])).embedder == slow.name  # decided with vectors
        found = await call(c, "memory_search", query="docs", cwd=str(project))
        assert found["mode"] == "hybrid" and found["warnings"] == []
        assert [r["id"] for r in found["results"]] == [stored["id"]]


async def test_tools_answer_lexically_once_the_wait_for_the_model_runs_out(
    tmp_path: Path, storage_url: str, project: Path
) -> None:
    slow = SlowToLoad()
    settings, database = store_place(tmp_path, storage_url, "slow")
    settings.embedder.load_wait_seconds = 0.05
    async with (
        MemoryService.open(settings, database=database, embedder=slow) as memory,
        in_process(memory) as c,
    ):
        tools = await c.list_tools()
        assert {t.name for t in tools.tools} == TOOLS
        await call(c, "memory_store", content="Docs live in docs/", cwd=str(project))
        early = await call(c, "memory_search", query="docs", cwd=str(project))
        assert early["mode"] == "lexical"
        assert early["warnings"] and "lexical search only" in early["warnings"][0]
        assert len(early["results"]) == 1
        slow.release.set()
        assert await memory.engine.embeddings.wait_settled(30)
        later = await call(c, "memory_search", query="docs", cwd=str(project))
        assert later["mode"] == "hybrid"
        # the memory stored while the model loaded is still found, and the answer says why
        assert len(later["results"]) == 1
        assert later["warnings"] == [
            f"1 record still awaits vectors from {slow.name}: until maintenance re-embeds "
            "them, they are found by their words only"
        ]
        await memory.reembed()
        done = await call(c, "memory_search", query="docs", cwd=str(project))
        assert done["warnings"] == []


async def test_roots_that_are_not_here_confine_nothing(
    memory: MemoryService, project: Path, tmp_path: Path
) -> None:
    """A client in a container or on another machine names roots this one lacks."""

    async def roots(_context: Any) -> ListRootsResult:
        return ListRootsResult(
            roots=[
                Root(uri="file://laptop/home/me/app"),  # type: ignore[arg-type]
                Root(uri=(tmp_path / "not-here").as_uri()),  # type: ignore[arg-type]
            ]
        )

    async with in_process(memory, list_roots_callback=roots) as c:
        stored = await call(c, "memory_store", content="Explicit cwd", cwd=str(project))
    assert (await memory.get(stored["id"])).scope_key == str(project_root(project))
