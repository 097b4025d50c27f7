"""The HTTP transports' guards, on a real server process: the token, the bind, DNS rebinding."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest
from mcp.client.sse import sse_client

from helpers.processes import COMMAND
from helpers.serving import http_server, round_trip
from helpers.tools import client
from memory_mcp.config import ServeSettings
from memory_mcp.errors import ConfigError
from memory_mcp.mcp.transports import check_exposure, is_loopback

pytestmark = pytest.mark.anyio


async def test_http_with_a_token_needs_it(env: dict[str, str], project: Path) -> None:
    token = "s3cret-token-of-some-length"
    env = {**env, "MEMORY_MCP_SERVE_TOKEN": token}
    with http_server(env, project, "sse") as (url, _):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": token}):
            async with httpx.AsyncClient() as http:
                response = await http.get(url, headers=headers, timeout=10)
            assert response.status_code == 401, headers
            assert response.headers["www-authenticate"].startswith("Bearer")
        await round_trip(
            client(sse_client(url, headers={"Authorization": f"Bearer {token}"}), "claude-code"),
            client(sse_client(url, headers={"Authorization": f"Bearer {token}"}), "codex"),
            cwd=project,
        )


def test_dns_rebinding_protection_rejects_foreign_hosts(env: dict[str, str], project: Path) -> None:
    with http_server(env, project, "streamable-http") as (url, _):
        body = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        headers = {"Host": "attacker.example", "Accept": "application/json, text/event-stream"}
        response = httpx.post(url, json=body, headers=headers, timeout=10)
        assert response.status_code in (400, 403, 421)


def test_binding_a_public_address_without_a_token_refuses_to_start(
    env: dict[str, str], project: Path
) -> None:
    result = subprocess.run(
        [COMMAND, "serve", "--transport", "streamable-http", "--host", "0.0.0.0"],
        cwd=project,
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 78
    assert b"without a token" in result.stderr


@pytest.mark.parametrize(
    ("host", "token", "ok"),
    [
        ("127.0.0.1", "", True),
        ("localhost", "", True),
        ("::1", "", True),
        ("0.0.0.0", "", False),
        ("192.168.1.20", "", False),
        ("0.0.0.0", "short", False),
        ("0.0.0.0", "a-long-enough-random-token", True),
    ],
)
def test_exposure_rules(host: str, token: str, ok: bool) -> None:
    settings = ServeSettings(host=host, token=token)
    assert is_loopback(host) == (host in ("127.0.0.1", "localhost", "::1"))
    if ok:
        check_exposure(settings)
    else:
        with pytest.raises(ConfigError):
            check_exposure(settings)
