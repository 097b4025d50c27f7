"""`memory-mcp serve` as a real process: started and stopped, over HTTP, a round trip."""

from __future__ import annotations

import json
import select
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from mcp import Client

from helpers.processes import COMMAND
from helpers.tools import call


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def running(
    env: dict[str, str], cwd: Path, *argv: str, stdin: int = subprocess.PIPE
) -> Iterator[subprocess.Popen[bytes]]:
    """``memory-mcp *argv`` as a process; stopped (SIGTERM, then SIGKILL) if still running."""
    process = subprocess.Popen(
        [COMMAND, *argv],
        cwd=cwd,
        env=env,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)


@contextmanager
def http_server(
    env: dict[str, str], cwd: Path, transport: str, *args: str
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``serve --transport TRANSPORT`` on a free port, until it says it serves; its URL."""
    port = free_port()
    argv = ["serve", "--transport", transport, "--port", str(port), *args]
    with running(env, cwd, *argv, stdin=subprocess.DEVNULL) as process:
        assert process.stderr is not None
        deadline = time.monotonic() + 60
        line = b""
        while time.monotonic() < deadline and b"serving MCP" not in line:
            ready, _, _ = select.select([process.stderr], [], [], 1)
            if ready:
                line = process.stderr.readline()
                assert line or process.poll() is None, "the server exited"
        assert b"serving MCP" in line, "the server did not start"
        path = "/sse" if transport == "sse" else "/mcp"
        yield f"http://127.0.0.1:{port}{path}", process


async def round_trip(writer: Client, reader: Client, cwd: Path | None = None) -> None:
    """Store from one client, find it from another through every search tool."""
    where = {"cwd": str(cwd)} if cwd else {}
    async with writer as w:
        stored = await call(
            w, "memory_store", content="Releases are tagged vX.Y.Z by the release job", **where
        )
    assert stored["action"] == "inserted"
    async with reader as r:
        search = await call(r, "memory_search", query="how are releases tagged", **where)
        project = await call(r, "project_search", query="release tags", **where)
        unified = await call(r, "searchUnifiedMemory", query="release tagging", **where)
    for found in (search["results"], project["results"]):
        assert found[0]["id"] == stored["id"]
        assert found[0]["agent"] == "claude"
    assert unified["results"][0]["id"] == stored["id"]
    assert unified["results"][0]["metadata"]["agent"] == "claude"


def stderr_of(process: subprocess.Popen[bytes], *, within: float = 30) -> bytes:
    """What a server that has exited wrote to stderr; fails if the pipe stays open."""
    stream = process.stderr
    assert stream is not None
    read: list[bytes] = []
    reader = threading.Thread(target=lambda: read.append(stream.read()), daemon=True)
    reader.start()
    reader.join(within)
    assert read, f"stderr still open {within} s after the server exited (a child holds it?)"
    return read[0]


# serve over stdio, spoken to line by line ------------------------------------------


def raw_server(
    env: dict[str, str], cwd: Path, *args: str
) -> AbstractContextManager[subprocess.Popen[bytes]]:
    """``serve`` over stdio, spoken to line by line (``send``, ``receive``)."""
    return running(env, cwd, *args, "serve")


def send(process: subprocess.Popen[bytes], message: dict[str, Any]) -> None:
    assert process.stdin is not None
    process.stdin.write(json.dumps(message).encode() + b"\n")
    process.stdin.flush()


def receive(process: subprocess.Popen[bytes], timeout: float = 60) -> dict[str, Any]:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    assert ready, "no answer from the server"
    line = process.stdout.readline()
    assert line, "the server closed stdout"
    message: dict[str, Any] = json.loads(line)
    return message


def handshake(process: subprocess.Popen[bytes]) -> None:
    send(
        process,
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "claude-code", "version": "1"},
            },
        },
    )
    assert receive(process)["result"]["serverInfo"]["name"] == "memory-mcp"
    send(process, {"jsonrpc": "2.0", "method": "notifications/initialized"})
