"""Team tokens: one per user, kept as hashes, read again when the file changes."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import httpx
import pytest
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from starlette.types import Receive, Scope, Send

from helpers.serving import http_server, round_trip
from helpers.storage import open_url
from helpers.tools import call, client
from memory_mcp.config import ServeSettings
from memory_mcp.errors import ConfigError, InvalidInput
from memory_mcp.mcp.tokens import CALLER_KEY, Caller, Tokens, add_token, read_tokens
from memory_mcp.mcp.transports import BearerAuth, check_exposure

pytestmark = pytest.mark.anyio


def test_a_token_is_kept_as_its_hash_only_and_names_its_user(tmp_path: Path) -> None:
    file = tmp_path / "tokens.toml"
    alice, bob = add_token(file, "alice"), add_token(file, "bob")
    text = file.read_text()
    assert alice not in text and bob not in text and "sha256:" in text
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    assert sorted(read_tokens(file)) == ["alice", "bob"]
    tokens = Tokens(file=file)
    assert tokens.caller(alice) == Caller("alice") and tokens.caller(bob) == Caller("bob")
    assert tokens.caller("guess") is None and tokens.caller("") is None
    assert Tokens("shared-token-long-enough", file).caller("shared-token-long-enough") == Caller(
        None
    )


def test_a_new_token_replaces_the_old_and_the_file_is_read_again(tmp_path: Path) -> None:
    file = tmp_path / "tokens.toml"
    old = add_token(file, "alice")
    tokens = Tokens(file=file)
    new = add_token(file, "alice")
    os.utime(file, ns=(1, 1))  # a changed file, whatever the clock's resolution
    assert tokens.caller(new) == Caller("alice") and tokens.caller(old) is None
    carol = add_token(file, "carol")
    os.utime(file, ns=(2, 2))
    assert tokens.caller(carol) == Caller("carol")
    file.write_text("[users]\nalice = 'not a hash'\n")  # a broken edit keeps what was read
    os.utime(file, ns=(3, 3))
    assert tokens.caller(carol) == Caller("carol")
    file.unlink()  # deleting the file revokes everyone
    assert tokens.caller(carol) is None


def test_two_users_added_at_once_both_land(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    file = tmp_path / "tokens.toml"
    names = [f"user{n}" for n in range(12)]
    with ThreadPoolExecutor(4) as pool:
        given = dict(zip(names, pool.map(lambda name: add_token(file, name), names), strict=True))
    tokens = Tokens(file=file)
    assert sorted(read_tokens(file)) == sorted(names)
    assert all(tokens.caller(token) == Caller(name) for name, token in given.items())


def test_bad_names_and_bad_files_are_refused(tmp_path: Path) -> None:
    file = tmp_path / "tokens.toml"
    with pytest.raises(InvalidInput, match="not a user name"):
        add_token(file, "alice smith")
    file.write_text("[users]\nalice = 'abc'\n")
    with pytest.raises(ConfigError, match="sha256"):
        read_tokens(file)
    file.write_text("token = 'x'\n")
    with pytest.raises(ConfigError, match="users"):
        read_tokens(file)


def test_a_public_address_with_a_tokens_file_may_serve(tmp_path: Path) -> None:
    file = tmp_path / "tokens.toml"
    with pytest.raises(ConfigError, match="does not exist"):
        check_exposure(ServeSettings(host="0.0.0.0", tokens_file=str(file)))
    add_token(file, "alice")
    check_exposure(ServeSettings(host="0.0.0.0", tokens_file=str(file)))


async def test_the_request_carries_who_sent_it(tmp_path: Path) -> None:
    file = tmp_path / "tokens.toml"
    alice = add_token(file, "alice")

    async def echo(scope: Scope, receive: Receive, send: Send) -> None:
        body = json.dumps({"user": scope[CALLER_KEY].user}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    app = BearerAuth(echo, Tokens(file=file))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://t"
    ) as http:
        assert (await http.get("/", headers={"Authorization": f"Bearer {alice}"})).json() == {
            "user": "alice"
        }
        refused = await http.get("/", headers={"Authorization": "Bearer nope"})
        assert refused.status_code == 401


async def test_a_server_with_a_tokens_file_admits_each_user_and_no_one_else(
    env: dict[str, str], project: Path, tmp_path: Path
) -> None:
    file = tmp_path / "tokens.toml"
    alice, bob = add_token(file, "alice"), add_token(file, "bob")
    env = {**env, "MEMORY_MCP_SERVE_TOKENS_FILE": str(file)}
    with http_server(env, project, "sse") as (url, _):
        for given in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": alice}):
            async with httpx.AsyncClient() as http:
                assert (await http.get(url, headers=given, timeout=10)).status_code == 401, given
        await round_trip(
            client(sse_client(url, headers={"Authorization": f"Bearer {alice}"}), "claude-code"),
            client(sse_client(url, headers={"Authorization": f"Bearer {bob}"}), "codex"),
            cwd=project,
        )


async def test_each_token_user_reads_the_team_memories_and_only_their_own_personal_ones(
    env: dict[str, str], project: Path, tmp_path: Path
) -> None:
    """One shared streamable-HTTP server, two users: what each stores is attributed to
    them; the other finds the project's shared memories, never their personal ones."""
    file = tmp_path / "tokens.toml"
    alice, bob = add_token(file, "alice"), add_token(file, "bob")
    env = {**env, "MEMORY_MCP_SERVE_TOKENS_FILE": str(file)}

    def as_user(url: str, token: str, name: str) -> Client:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        return client(streamable_http_client(url, http_client=http), name)

    where = {"cwd": str(project)}
    with http_server(env, project, "streamable-http") as (url, _):
        async with as_user(url, alice, "claude-code") as a:
            shared = await call(a, "memory_store", content="CI caches pip wheels", **where)
            personal = await call(
                a, "memory_store", content="I review CI logs in vim", scope="global"
            )
            private = await call(
                a, "memory_store", content="My CI token rotates monthly", private=True, **where
            )
        async with as_user(url, bob, "codex") as b:
            seen = await call(b, "memory_search", query="CI pip vim token", **where)
            brief = await call(b, "memory_brief", **where)
        async with as_user(url, alice, "gemini-cli") as a:
            own = await call(a, "memory_search", query="CI pip vim token", **where)
    assert [r["id"] for r in seen["results"]] == [shared["id"]]
    assert "vim" not in brief["brief"] and "rotates" not in brief["brief"]
    assert {shared["id"], personal["id"], private["id"]} <= {r["id"] for r in own["results"]}
    url = env.get("MEMORY_MCP_STORAGE_URL") or f"sqlite://{tmp_path / 'data' / 'memory.db'}"
    async with open_url(url) as memory:
        assert (await memory.get(shared["id"])).user == "alice"
        assert (await memory.get(private["id"])).private
