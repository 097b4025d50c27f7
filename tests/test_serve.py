"""`memory-mcp serve` as the agent CLIs run it: subprocesses over stdio, SSE and streamable HTTP."""

from __future__ import annotations

import json
import signal
import socket
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.sse import sse_client

from helpers.files import backdate
from helpers.processes import COMMAND
from helpers.serving import (
    handshake,
    http_server,
    raw_server,
    receive,
    round_trip,
    send,
    stderr_of,
)
from helpers.tools import call, client
from helpers.waiting import eventually
from memory_mcp.__main__ import fast_serve_args
from memory_mcp.dirs import HANDSHAKE_CACHE
from memory_mcp.mcp.front import cache_key

pytestmark = pytest.mark.anyio


def stdio(env: dict[str, str], cwd: Path, name: str, *args: str, **kwargs: Any) -> Client:
    params = StdioServerParameters(command=COMMAND, args=[*args, "serve"], env=env, cwd=str(cwd))
    return client(params, name, **kwargs)


async def test_stdio_round_trip_between_claude_code_and_codex(
    env: dict[str, str], project: Path
) -> None:
    """Two server processes, as two CLIs spawn them in one repository, share one brain."""
    await round_trip(
        stdio(env, project, "claude-code", mode="legacy"),
        stdio(env, project / "src" / "pkg", "codex", mode="legacy"),
    )


async def test_the_handshake_cache_gives_the_servers_own_answers(
    env: dict[str, str], project: Path, tmp_path: Path
) -> None:
    async def handshake(*args: str) -> tuple[Any, Any]:
        async with stdio(env, project, "claude-code", *args, mode="legacy") as c:
            tools = await c.list_tools()
            assert c.server_info is not None
            info = (
                c.server_info.model_dump(),
                c.server_capabilities.model_dump(),
                c.instructions,
            )
            await call(c, "memory_search", query="warm up")
        return info, tools.model_dump()

    cache = tmp_path / "cache" / "memory-mcp" / HANDSHAKE_CACHE
    learned = await handshake()  # no cache: every answer comes from the server
    assert cache.is_file()
    backdate(cache)
    stamp = cache.stat().st_mtime_ns
    cached = await handshake()  # answered by the front from the cache
    assert cached == learned
    assert cache.stat().st_mtime_ns == stamp, "the server's answers matched: no rewrite"
    full = await handshake("-v")  # the full command line, no front
    assert full == learned


def test_fast_front_takes_only_plain_stdio_serve() -> None:
    assert fast_serve_args(["serve"]) == (True, None)
    assert fast_serve_args(["serve", "--cwd", "/x"]) == (True, "/x")
    assert fast_serve_args(["serve", "--cwd=/x", "-t", "stdio"]) == (True, "/x")
    assert fast_serve_args(["serve", "--transport", "sse"]) == (False, None)
    assert fast_serve_args(["serve", "--help"]) == (False, None)
    assert fast_serve_args(["-v", "serve"]) == (False, None)
    assert fast_serve_args(["search", "x"]) == (False, None)


# Raw JSON-RPC over a pipe, to watch shutdown ---------------------------------------------


def store(process: subprocess.Popen[bytes], request_id: int, content: str) -> dict[str, Any]:
    send(
        process,
        {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "tools/call",
            "params": {"name": "memory_store", "arguments": {"content": content}},
        },
    )
    return receive(process)


@pytest.mark.parametrize(
    ("how", "args"),
    [
        ("SIGTERM", ()),
        ("SIGINT", ()),
        ("stdin", ()),
        ("SIGTERM", ("-v",)),
        ("SIGINT", ("-v",)),
        ("stdin", ("-v",)),
    ],
)
@pytest.mark.sqlite_only  # checks the SQLite file's integrity
def test_stdio_shuts_down_cleanly(
    env: dict[str, str], project: Path, tmp_path: Path, how: str, args: tuple[str, ...]
) -> None:
    with raw_server(env, project, *args) as process:
        handshake(process)
        answer = store(process, 2, "The build uses Bazel")
        assert not answer["result"]["isError"]
        if how == "stdin":
            assert process.stdin is not None
            process.stdin.close()
        else:
            process.send_signal(getattr(signal, how))
        assert process.wait(timeout=30) == 0
        assert b"Traceback" not in stderr_of(process)
    database = sqlite3.connect(tmp_path / "data" / "memory.db")
    assert database.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert database.execute("SELECT count(*) FROM records").fetchone() == (1,)


def test_stdout_carries_only_protocol(env: dict[str, str], project: Path) -> None:
    with raw_server(env, project) as process:
        handshake(process)
        for n in range(3):
            answer = store(process, 10 + n, f"Fact number {n} about the build")
            assert answer["jsonrpc"] == "2.0" and answer["id"] == 10 + n


# HTTP ---------------------------------------------------------------------------------


async def test_streamable_http_round_trip(env: dict[str, str], project: Path) -> None:
    with http_server(env, project, "streamable-http") as (url, _):
        await round_trip(
            client(url, "claude-code"),
            client(url, "codex"),
            cwd=project,
        )
        # the viewer's pages beside the MCP endpoint, behind their own guard
        viewer = url.removesuffix("/mcp") + "/ui/"
        async with httpx.AsyncClient() as http:
            page = await http.get(viewer)
            assert page.status_code == 200 and "1</strong> memory ·" in page.text
            assert "script-src" not in page.headers["content-security-policy"]
            assert "default-src 'none'" in page.headers["content-security-policy"]
            assert (await http.get(viewer + "conflicts")).status_code == 200
            assert "This server runs them" in (await http.get(viewer + "maintenance")).text
            refused = await http.post(viewer + "restore", data={"id": "x"})
            assert refused.status_code == 403


async def test_sse_round_trip(env: dict[str, str], project: Path) -> None:
    with http_server(env, project, "sse") as (url, _):
        await round_trip(
            client(sse_client(url), "claude-code"),
            client(sse_client(url), "codex"),
            cwd=project,
        )


def test_bench_launch_times_spawn_to_tools_list(
    env: dict[str, str], project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memory_mcp.bench.launch import run_launch_bench

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    first = run_launch_bench(project, launches=1, command=[COMMAND, "serve"])
    assert first.cold is not None and first.cold > 0, "the first launch learns the handshake"
    again = run_launch_bench(project, launches=2, command=[COMMAND, "serve"])
    assert again.cold is None, "later launches find the cache"
    assert len(again.warm) == 2 and all(t > 0 for t in again.warm)
    assert again.to_json()["launches"] == 2


def test_the_first_search_of_a_session_is_hybrid(
    env: dict[str, str], project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search sent right after tools/list, before the model has loaded, waits for it."""
    from memory_mcp.bench.launch import run_launch_bench

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    report = run_launch_bench(project, launches=2, command=[COMMAND, "serve"], search=True)
    assert [launch.mode for launch in report.launches] == ["hybrid", "hybrid"]
    assert report.to_json()["first_search_hybrid"] == 2


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        json.dumps({"key": "old-version", "versions": ["2025-06-18"]}),
        json.dumps({"key": cache_key(), "versions": [], "initialize": {}, "tools_list": {}}),
    ],
)
async def test_a_bad_or_stale_handshake_cache_is_relearned(
    env: dict[str, str], project: Path, tmp_path: Path, content: str
) -> None:
    cache = tmp_path / "cache" / "memory-mcp" / HANDSHAKE_CACHE
    cache.parent.mkdir(parents=True, exist_ok=True)  # it holds the model's copy already
    cache.write_text(content)
    async with stdio(env, project, "claude-code", mode="legacy") as c:
        tools = await c.list_tools()
        await call(c, "memory_search", query="anything")
    assert {t.name for t in tools.tools} >= {"memory_store", "searchUnifiedMemory"}
    learned = json.loads(cache.read_text())
    assert learned["key"] == cache_key()
    assert len(learned["tools_list"]["tools"]) == len(tools.tools)


def call_tool(process: subprocess.Popen[bytes], request_id: int, name: str, **args: Any) -> None:
    send(
        process,
        {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "tools/call",
            "params": {"name": name, "arguments": args},
        },
    )


def test_a_server_that_cannot_start_answers_pending_requests_with_an_error(
    env: dict[str, str], project: Path
) -> None:
    with raw_server(env, project) as process:  # learn the handshake cache
        handshake(process)
        send(process, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        assert "tools" in receive(process)["result"]
    broken = {**env, "MEMORY_MCP_STORAGE_DRIVER": "bogus"}
    with raw_server(broken, project) as process:
        handshake(process)  # answered from the cache
        call_tool(process, 2, "memory_search", query="anything")
        answer = receive(process)
        assert answer["id"] == 2
        assert "memory-mcp stopped" in answer["error"]["message"]
        assert process.wait(timeout=60) == 78
        assert b"storage.driver" in stderr_of(process)


def test_malformed_client_messages_do_not_break_the_session(
    env: dict[str, str], project: Path
) -> None:
    with raw_server(env, project) as process:
        handshake(process)
        assert process.stdin is not None
        send(process, {"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": [1]})
        process.stdin.write(b"[" * 100_000 + b"\n")
        process.stdin.write(b"{not json\n")
        process.stdin.flush()
        answers = {}
        call_tool(process, 4, "memory_store", content="Still works after garbage")
        while 4 not in answers:
            message = receive(process)
            answers[message.get("id")] = message
        assert not answers[4]["result"]["isError"]
        process.stdin.close()
        assert process.wait(timeout=30) == 0


def test_a_client_that_stops_reading_ends_the_session_cleanly(
    env: dict[str, str], project: Path
) -> None:
    with raw_server(env, project) as process:
        handshake(process)
        assert process.stdout is not None and process.stdin is not None
        process.stdout.close()
        call_tool(process, 5, "memory_store", content="Nobody reads this answer")
        assert process.wait(timeout=30) == 0
        assert b"Traceback" not in stderr_of(process)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_http_stops_cleanly_on_a_signal(
    env: dict[str, str], project: Path, signum: signal.Signals
) -> None:
    with http_server(env, project, "streamable-http") as (_, process):
        process.send_signal(signum)
        assert process.wait(timeout=30) == 0


async def test_the_server_runs_maintenance_by_itself(env: dict[str, str], project: Path) -> None:
    from memory_mcp.config import load_settings
    from memory_mcp.maintenance import TASKS
    from memory_mcp.storage.factory import open_store

    env = {**env, "MEMORY_MCP_EMBEDDER_BACKEND": "bm25"}
    async with stdio(env, project, "claude-code", mode="legacy") as c:
        await call(c, "memory_store", content="Releases are tagged vX.Y.Z", cwd=str(project))
        store = await open_store(load_settings(env=env).settings)  # the server's store
        try:

            async def all_finished() -> dict[str, Any] | None:
                tasks = await store.tasks()  # written by the server process
                return (
                    tasks if all(t in tasks and tasks[t].last_finished_at for t in TASKS) else None
                )

            tasks = await eventually(
                all_finished, within=60, what="the server to finish every maintenance task"
            )
        finally:
            await store.close()
    assert tasks["reembed"].last_summary["skipped"].startswith("no dense embedder")
    assert all(not tasks[t].last_error for t in TASKS)


def on_a_taken_port(
    env: dict[str, str], project: Path, *argv: str
) -> tuple[int, subprocess.CompletedProcess[str]]:
    """``memory-mcp ARGV --port P`` while another socket listens on P: P and the run."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [COMMAND, *argv, "--port", str(port)],
            env=env,
            cwd=project,
            capture_output=True,
            text=True,
            timeout=120,
        )
    return port, done


def test_a_port_in_use_is_one_line_and_exit_78(env: dict[str, str], project: Path) -> None:
    port, done = on_a_taken_port(env, project, "serve", "--transport", "streamable-http")
    assert done.returncode == 78
    assert done.stderr.splitlines() == [
        f"error: port {port} on 127.0.0.1 is in use (another memory-mcp server?); pick another "
        "with --port or serve.port"
    ]
    taken, ui = on_a_taken_port(env, project, "ui")  # the viewer's port is its option alone
    assert ui.returncode == 78
    assert ui.stderr.splitlines() == [
        f"error: port {taken} on 127.0.0.1 is in use (another memory-mcp server?); pick another "
        "with --port"
    ]


async def test_the_vectors_start_loading_while_the_sdk_is_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store opens and the warm-up (the start directory's vectors) begins before the
    server is built, which imports the MCP SDK in a thread meanwhile: the first search
    of a large store does not wait for the import and then the load."""
    import threading

    from memory_mcp.config import load_settings
    from memory_mcp.mcp import transports
    from memory_mcp.service import MemoryService

    began = threading.Event()

    async def warm_up(self: MemoryService, cwd: object = None) -> None:
        began.set()

    class Built(Exception):
        pass

    def build(memory: MemoryService) -> None:  # in the worker thread, as the SDK's import
        assert began.wait(10), "the warm-up had not begun"
        raise Built

    monkeypatch.setattr(MemoryService, "warm_up", warm_up)
    monkeypatch.setattr(transports, "_build_server", build)
    loaded = load_settings(
        env={
            "MEMORY_MCP_DATA_DIR": str(tmp_path / "data"),
            "MEMORY_MCP_EMBEDDER_BACKEND": "bm25",
            "MEMORY_MCP_MAINTENANCE_ENABLED": "false",
        }
    )
    with pytest.raises(ExceptionGroup) as raised:
        await transports.serve(loaded, "stdio")
    assert raised.group_contains(Built)
