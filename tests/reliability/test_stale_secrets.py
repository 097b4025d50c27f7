"""A secret stored before its rule existed never leaks: every output path shows text
through the current rules (search results, the brief, spawn files, the MCP tools,
the command line), and importing an old export redacts it. ``write.secrets = "off"``
turns this off too. (Redacting the store itself is maintenance's ``secrets`` task,
tests/test_maintenance.py.)

The records are planted as the previous rules stored them: the AWS key id
redacted, its unlabelled secret next to it in clear; a password-only Redis URL
untouched.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import anyio
import pytest
from typer.testing import CliRunner

from helpers.storage import store_place
from helpers.tools import in_process
from memory_mcp.brief import build_brief
from memory_mcp.cli.app import app
from memory_mcp.config import Settings, load_settings
from memory_mcp.embedders.base import FakeEmbedder
from memory_mcp.exchange import export_jsonl, import_jsonl
from memory_mcp.service import MemoryService

pytestmark = pytest.mark.anyio

AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
REDIS_PASSWORD = "s3cr3tP4ss"
STORED_BEFORE = [  # what 141321e's rules stored
    f"AWS creds for staging: [REDACTED:aws-access-key-id] / {AWS_SECRET}",
    f".env has REDIS_URL=redis://:{REDIS_PASSWORD}@cache:6379",
]
SECRETS = (AWS_SECRET, REDIS_PASSWORD)


async def plant(
    settings: Settings, database: Path | None, project: Path, *, embedder: bool = True
) -> None:
    """Store the texts as the previous rules left them (this build with the scan off)."""
    settings.write.secrets = "off"
    if not embedder:
        settings.embedder.backend = "bm25"
    async with MemoryService.open(
        settings, database=database, embedder=FakeEmbedder() if embedder else None
    ) as old:
        for text in STORED_BEFORE:
            await old.store(text, cwd=project, importance=1.0)
        await old.store("Deploy notes: staging runs on Fly.io", kind="journal", cwd=project)


def leaks(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


@pytest.fixture
async def memory(tmp_path: Path, storage_url: str, project: Path) -> AsyncIterator[MemoryService]:
    await plant(*store_place(tmp_path, storage_url), project)
    settings, database = store_place(tmp_path, storage_url)
    async with MemoryService.open(settings, database=database, embedder=FakeEmbedder()) as service:
        yield service


async def test_the_store_still_holds_them_until_maintenance_runs(memory: MemoryService) -> None:
    stored = [record.content async for record in memory.engine.store.iter_records()]
    assert leaks("\n".join(stored)) == list(SECRETS)


async def test_search_results_show_them_redacted(memory: MemoryService, project: Path) -> None:
    for query in ("AWS creds for staging", "REDIS_URL cache"):
        found = await memory.search(query, cwd=project)
        assert found.hits, query
        text = "\n".join(hit.record.content for hit in found.hits)
        assert not leaks(text) and "[REDACTED:" in text
        across = await memory.project_search(query, cwd=project)
        assert across.hits and not leaks("\n".join(h.record.content for h in across.hits))
        unified = await memory.unified_search(query, cwd=project, threshold=0.0)
        assert unified.results and not leaks("\n".join(i.content for i in unified.results))


async def test_the_brief_shows_them_redacted(memory: MemoryService, project: Path) -> None:
    for dated in (False, True):  # dated: what inject writes
        brief = await build_brief(memory.engine, project, dated=dated)
        assert "AWS creds for staging" in brief.text and "REDIS_URL" in brief.text
        assert not leaks(brief.text), brief.text


async def test_a_write_about_an_old_record_shows_it_redacted(
    memory: MemoryService, project: Path
) -> None:
    result = await memory.store(
        f".env has REDIS_URL=redis://:{REDIS_PASSWORD}@cache:6379", cwd=project
    )
    assert result.action == "superseded" and result.related_content
    assert not leaks(result.related_content) and "REDIS_URL" in result.related_content


async def test_the_mcp_tools_show_them_redacted(memory: MemoryService, project: Path) -> None:
    async with in_process(memory) as c:
        answers = [
            await c.call_tool("memory_search", {"query": "AWS creds", "cwd": str(project)}),
            await c.call_tool("project_search", {"query": "REDIS_URL", "cwd": str(project)}),
            await c.call_tool(
                "searchUnifiedMemory",
                {"query": "AWS creds REDIS_URL", "cwd": str(project), "threshold": 0.0},
            ),
            await c.call_tool("memory_brief", {"cwd": str(project)}),
        ]
    for answer in answers:
        assert not answer.is_error and answer.structured_content
        text = json.dumps(answer.structured_content)
        assert "REDACTED" in text and not leaks(text), text


async def test_an_old_export_is_redacted_on_import(
    memory: MemoryService, tmp_path: Path, storage_url: str, project: Path
) -> None:
    exported = io.StringIO()
    await export_jsonl(memory.engine, exported)
    assert leaks(exported.getvalue()) == list(SECRETS)  # a backup is lossless
    settings, database = store_place(tmp_path, storage_url, "other")
    async with MemoryService.open(settings, database=database, embedder=FakeEmbedder()) as other:
        summary = await import_jsonl(other.engine, exported.getvalue().splitlines())
        assert summary.records_added == 3
        stored = [record.content async for record in other.engine.store.iter_records()]
    assert not leaks("\n".join(stored)) and "REDIS_URL" in "\n".join(stored)


async def test_with_the_scan_off_they_are_shown_as_stored(
    tmp_path: Path, storage_url: str, project: Path
) -> None:
    await plant(*store_place(tmp_path, storage_url), project)
    settings, database = store_place(tmp_path, storage_url)
    settings.write.secrets = "off"
    async with MemoryService.open(settings, database=database, embedder=FakeEmbedder()) as memory:
        found = await memory.search("AWS creds for staging", cwd=project)
        brief = await build_brief(memory.engine, project)
    assert AWS_SECRET in found.hits[0].record.content
    assert leaks(brief.text) == list(SECRETS)


# The command line ----------------------------------------------------------------------

runner = CliRunner()


def run(*args: str, cwd: Path) -> tuple[int, str]:
    old = os.getcwd()
    os.chdir(cwd)
    try:
        result = runner.invoke(app, list(args))
    finally:
        os.chdir(old)
    return result.exit_code, result.stdout


@pytest.fixture
def cli_store(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORY_MCP_EMBEDDER_BACKEND", "bm25")
    settings = load_settings(project_root=project).settings  # the store the CLI uses
    anyio.run(partial(plant, settings, None, project, embedder=False))


@pytest.mark.usefixtures("cli_store")
def test_cli_search_brief_and_spawn_files_show_them_redacted(project: Path) -> None:
    outputs = [
        run("search", "AWS creds staging", cwd=project),
        run("search", "REDIS_URL cache", "--json", cwd=project),
        run("brief", cwd=project),
        run("brief", "--hook", cwd=project),
        run("inject", cwd=project),
    ]
    for code, out in outputs:
        assert code == 0 and not leaks(out), out
    assert "REDACTED" in outputs[0][1] and "REDACTED" in outputs[3][1]
    written = [p for p in project.rglob("*") if p.is_file() and ".git" not in p.parts]
    spawn = "\n".join(p.read_text(encoding="utf-8") for p in written)
    assert "AWS creds for staging" in spawn and not leaks(spawn), spawn


async def test_the_viewer_shows_them_redacted(memory: MemoryService, project: Path) -> None:
    import httpx

    from memory_mcp.config import ServeSettings
    from memory_mcp.mcp.tokens import Tokens
    from memory_mcp.mcp.transports import transport_security
    from memory_mcp.viewer.app import build_app

    app = build_app(memory, tokens=Tokens("", None), security=transport_security(ServeSettings()))
    key = (await memory.engine.project(project)).key
    found = await memory.listing((key,), limit=10)
    shown = [r for r in found if "AWS creds" in r.content]
    assert shown and not leaks(shown[0].content)
    await memory.forget(shown[0].id, reason="rotated")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8766") as c:
        for path in (
            f"/project?key={key}",
            f"/project?key={key}&q=AWS+creds+REDIS_URL",
            f"/record/{shown[0].id}",
            "/archived",
            f"/brief?key={key}",
        ):
            page = await c.get(path)
            assert page.status_code == 200, path
            assert "REDACTED" in page.text and not leaks(page.text), path
