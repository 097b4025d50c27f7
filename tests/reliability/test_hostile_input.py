"""Property-based fuzzing of every tool: an error or a result, never a crash or half a record."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from mcp import Client

from helpers.tools import in_process
from memory_mcp.config import Settings
from memory_mcp.embedders.base import FakeEmbedder
from memory_mcp.service import MemoryService
from memory_mcp.storage.sqlite.doctor import diagnose

EXAMPLES = 120  # per property; the suite stays well under a minute

# Text an agent (or an attacker through one) might paste: FTS5 syntax, control
# characters, NUL, lone surrogates, direction marks, and ordinary words.
FTS_BITS = ['"', '""', "NEAR(", "NEAR/2", " AND ", " OR ", " NOT ", "*", "^", "content:",
            "tags:", "merged_text:", "(", ")", "-", ":", "{", "}", "+", "'", "\\"]  # fmt: skip
ODD = ["\x00", "\x01", "\x1b[31m", "\u200f", "\u202e", "\ud800", "\udfff", "\udc80", "\ufeff",
       "\r\n", "\u2028", "🙂", "e\u0301", "İ", "ß"]  # fmt: skip
WORDS = ["deploy", "tests", "pytest", "uv", "fly.io", "port", "8080", "main", "never", "cache"]

SURROGATES = ["\ud800", "\udfff", "\udc80"]


def texts(*, surrogates: bool) -> st.SearchStrategy[str]:
    """Hostile text; lone surrogates only where the caller can pass them (see below)."""
    odd = ODD if surrogates else [c for c in ODD if c not in SURROGATES]
    chars = st.characters(exclude_categories=() if surrogates else ("Cs",))
    return st.lists(
        st.one_of(
            st.sampled_from(FTS_BITS),
            st.sampled_from(odd),
            st.sampled_from(WORDS),
            st.text(alphabet=chars, max_size=12),
        ),
        max_size=24,
    ).map("".join)


# The in-process MCP client cannot serialize lone surrogates: the tool-level fuzz
# leaves them out, the engine-level one below puts them in, and a stdio test at the
# end sends them as a JSON client can (\ud800 escapes).
hostile_text = texts(surrogates=False)
engine_text = texts(surrogates=True)
anything = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63),
    st.floats(allow_nan=True, allow_infinity=True),
    hostile_text,
    st.lists(hostile_text, max_size=4),
    st.dictionaries(hostile_text, hostile_text, max_size=3),
)

FIELDS = {
    "memory_store": ["content", "kind", "scope", "importance", "tags", "cwd"],
    "memory_search": ["query", "scope", "kinds", "tags", "since", "until", "limit", "cwd"],
    "project_search": ["query", "limit", "cwd"],
    "searchUnifiedMemory": ["query", "sources", "limit", "threshold", "cwd"],
    "memory_forget": ["id", "reason", "cwd"],
    "memory_brief": ["cwd"],
}


REPO = "/tmp/memory-mcp-fuzz-repo"  # made by the test; a plausible cwd
PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "kind": st.sampled_from(["fact", "decision", "gotcha", "journal", "goal", "plan"]),
    "kinds": st.lists(st.sampled_from(["fact", "decision", "gotcha", "journal"]), max_size=2),
    "scope": st.sampled_from(["project", "global", "all"]),
    "importance": st.floats(min_value=0, max_value=1),
    "tags": st.lists(hostile_text, max_size=3),
    "sources": st.lists(st.sampled_from(["memory", "insights", "knowledge"]), max_size=3),
    "limit": st.integers(min_value=1, max_value=20),
    "threshold": st.floats(min_value=0, max_value=1),
    "since": st.sampled_from(["2026-01-01", "2026-11-22T10:00:00Z"]),
    "until": st.sampled_from(["2030-01-01"]),
    "cwd": st.one_of(
        st.just(REPO),
        st.sampled_from([REPO + "/..", "/" + "a" * 300, "//server/share", "/proc/self/root"]),
        hostile_text.map(lambda t: "/" + t),
    ),
}


@st.composite
def calls(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A tool and arguments: hostile text where text goes, other fields plausible or junk."""
    tool = draw(st.sampled_from(sorted(FIELDS)))
    arguments: dict[str, Any] = {}
    for name in FIELDS[tool]:
        if name in ("content", "query", "reason", "id"):
            arguments[name] = draw(hostile_text)
        elif draw(st.integers(0, 3)) == 0:
            arguments[name] = draw(anything)
        elif draw(st.booleans()):
            arguments[name] = draw(PLAUSIBLE[name])
    if draw(st.integers(0, 9)) == 0:
        arguments[draw(hostile_text)] = draw(anything)  # a field no tool has
    return tool, arguments


@asynccontextmanager
async def serving(database: Path) -> AsyncIterator[tuple[MemoryService, Client]]:
    async with (
        MemoryService.open(
            Settings(), database=database, embedder=FakeEmbedder(), wait_for_embedder=10
        ) as memory,
        in_process(memory, "fuzzer") as client,
    ):
        yield memory, client


def records(database: Path) -> list[tuple[Any, ...]]:
    """Every record's id, text, tags and meta, read after the store is closed.

    (Never while it is open: the stdlib's sqlite3 is another SQLite library in
    this process, and closing its connection would drop the store's POSIX locks.)
    """
    conn = sqlite3.connect(database)
    try:
        return conn.execute("SELECT id, content, tags, meta FROM records").fetchall()
    finally:
        conn.close()


async def count(memory: MemoryService) -> int:
    return sum((await memory.engine.store.stats()).records.values())


def check_answer(
    portal: BlockingPortal, client: Client, tool: str, arguments: dict[str, Any]
) -> bool:
    """Call the tool; the answer must be a result or a clear error. True if it wrote."""
    result = portal.call(client.call_tool, tool, arguments)
    text = " ".join(getattr(c, "text", "") for c in result.content)
    if result.is_error:
        assert text.strip(), "an error without a message"
        assert "Traceback" not in text and 'File "' not in text, text[:500]
        # the SDK's answer to an exception the engine did not expect: a crash, politely
        assert not re.fullmatch(r"Error executing tool \S+", text.strip()), (tool, arguments)
        return False
    assert result.structured_content is not None
    json.dumps(result.structured_content)  # serializable, whatever went in
    return tool == "memory_store"


@pytest.mark.sqlite_only  # reads the records from the file
def test_every_tool_answers_hostile_arguments_without_crashing(tmp_path: Path) -> None:
    database = tmp_path / "memory.db"
    shutil.rmtree(REPO, ignore_errors=True)
    (Path(REPO) / ".git").mkdir(parents=True)
    seen = {"calls": 0, "errors": 0, "writes": 0}
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(serving(database)) as (memory, client),
    ):

        @settings(
            max_examples=EXAMPLES * 3,
            deadline=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
            database=None,
        )
        @given(call=calls())
        @example(call=("memory_store", {"content": "x" * 1_000_000}))
        @example(call=("memory_search", {"query": "y" * 1_000_000}))
        @example(call=("memory_store", {"content": "ok\x00fact", "cwd": str(tmp_path)}))
        @example(call=("memory_search", {"query": 'NEAR("a" "b", 2) AND content:x*'}))
        @example(call=("memory_store", {"content": "fine", "scope": "global"}))
        def probe(call: tuple[str, dict[str, Any]]) -> None:
            tool, arguments = call
            before = portal.call(count, memory)
            wrote = check_answer(portal, client, tool, arguments)
            after = portal.call(count, memory)
            seen["calls"] += 1
            seen["writes"] += wrote
            seen["errors"] += not wrote and tool == "memory_store"
            if tool == "memory_store" and not wrote:
                assert after == before, "a refused write left something behind"

        probe()
        diagnosis = portal.call(diagnose, memory.engine.store)
    assert diagnosis.healthy, diagnosis.to_json()
    for record_id, content, tags, meta in records(database):
        assert content and "\x00" not in content and len(content) <= 64_000, record_id
        json.loads(tags), json.loads(meta)
    shutil.rmtree(REPO, ignore_errors=True)
    print(f"fuzz: {seen['calls']} calls, {seen['writes']} writes, {seen['errors']} refused")
    assert seen["writes"] > 0 and seen["errors"] > 0  # both paths were exercised


@settings(max_examples=EXAMPLES * 2, deadline=None, database=None, derandomize=True)
@given(query=hostile_text)
@pytest.mark.sqlite_only  # SQLite's FTS5
def test_search_strings_never_reach_fts5_as_syntax(query: str) -> None:
    from memory_mcp.storage.sqlite import fts_query

    expression = fts_query(query)
    conn = sqlite3.connect(":memory:")
    try:
        conn.execute("CREATE VIRTUAL TABLE t USING fts5(content, merged_text, tags)")
        conn.execute("INSERT INTO t VALUES ('deploy tests', '', '[]')")
        if expression:
            conn.execute("SELECT * FROM t WHERE t MATCH ?", [expression]).fetchall()
    finally:
        conn.close()


ENGINE_CALLS = ["store", "search", "project_search", "unified_search", "forget", "brief"]


@pytest.mark.sqlite_only  # reads the records from the file
def test_the_engine_answers_hostile_text_with_its_own_errors(tmp_path: Path) -> None:
    """What the CLI and a JSON client can pass, lone surrogates included."""
    from memory_mcp.brief import build_brief
    from memory_mcp.errors import MemoryMcpError

    database = tmp_path / "memory.db"
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    outcomes = {"ok": 0, "refused": 0}
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(serving(database)) as (memory, _),
    ):

        async def attempt(op: str, text: str, other: str) -> None:
            cwd: Any = repo if other == "" else other
            if op == "store":
                await memory.store(text, cwd=cwd, tags=[other], agent=other)
            elif op == "search":
                await memory.search(text, cwd=repo, tags=[other])
            elif op == "project_search":
                await memory.project_search(text, cwd=cwd)
            elif op == "unified_search":
                await memory.unified_search(text, cwd=repo, sources=[other] if other else None)
            elif op == "forget":
                await memory.forget(text, reason=other, cwd=repo)
            else:
                await build_brief(memory.engine, cwd)

        @settings(max_examples=EXAMPLES * 2, deadline=None, database=None, derandomize=True)
        @given(
            op=st.sampled_from(ENGINE_CALLS),
            text=engine_text,
            other=st.one_of(st.just(""), engine_text),
        )
        @example(op="search", text="\ud800 deploy", other="")
        @example(op="store", text="fact with \udfff inside", other="")
        @example(op="forget", text="f_\ud800", other="why")  # once an unexpected error
        @example(op="search", text="deploy", other="\ud800")  # a surrogate in a tag
        @example(op="store", text="fine", other="/tmp/\ud800x")  # and in a cwd
        @example(op="project_search", text="fine", other="/" + "c" * 300)  # a name too long
        def probe(op: str, text: str, other: str) -> None:
            message = None
            try:
                portal.call(attempt, op, text, other)
            except MemoryMcpError as exc:  # the engine's own errors say what to change
                message = str(exc)
            outcomes["ok" if message is None else "refused"] += 1
            assert message is None or message.strip()

        probe()
        assert portal.call(diagnose, memory.engine.store).healthy
    for record_id, content, _, _ in records(database):
        assert content and not any("\ud800" <= ch <= "\udfff" for ch in content), record_id
    print(f"engine fuzz: {outcomes['ok']} answered, {outcomes['refused']} refused")
    assert outcomes["ok"] and outcomes["refused"]


def test_a_word_of_a_million_letters_stems_without_recursion() -> None:
    """The stemmer once recursed over runs of y (found by the fuzz: a 1 MB query)."""
    from memory_mcp.lexical import stem

    assert stem("y" * 1_000_000).startswith("yyyy")
    assert stem("syzygy") == "syzygi" and stem("player") == "player"


def test_a_lone_surrogate_over_stdio_gets_an_answer(tmp_path: Path, env: dict[str, str]) -> None:
    """JSON can escape one (\\ud800); the SDK's parser dropped such a call unanswered."""
    from helpers.serving import handshake, raw_server, receive, send

    env = {**env, "MEMORY_MCP_EMBEDDER_BACKEND": "bm25"}
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    with raw_server(env, repo) as process:
        handshake(process)
        for n, (tool, arguments) in enumerate(
            [
                ("memory_store", {"content": "half \ud800 a pair"}),
                ("memory_search", {"query": "half \udfff"}),
                ("memory_search", {"query": "an emoji 🙂 written as a pair"}),
            ]
        ):
            call = {"name": tool, "arguments": arguments}
            send(process, {"jsonrpc": "2.0", "id": 40 + n, "method": "tools/call", "params": call})
            answer = receive(process, timeout=30)
            assert answer["id"] == 40 + n and "result" in answer, answer
            assert not answer["result"]["isError"], answer
