"""Shared fixtures: real SQLite in tmp_path, a fake embedder, and the real model."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from helpers.model import MODEL_ENV, MODEL_NAME, model_path
from helpers.processes import Workers
from memory_mcp.config import Settings
from memory_mcp.embedders.base import FakeEmbedder
from memory_mcp.embedders.fastembed import FastEmbedEmbedder
from memory_mcp.service import MemoryService


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _isolated_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reads the developer's config or writes to their data directory."""
    for name in list(os.environ):
        if name.startswith("MEMORY_MCP_") and name != MODEL_ENV:
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.setenv("MEMORY_MCP_DATA_DIR", str(tmp_path / "data"))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A git repository (as the product sees one: a .git directory) with a subdirectory."""
    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    (root / "src" / "pkg").mkdir(parents=True)
    return root


@pytest.fixture
def other_project(tmp_path: Path) -> Path:
    root = tmp_path / "other-repo"
    (root / ".git").mkdir(parents=True)
    return root


@pytest.fixture
def settings() -> Settings:
    return Settings()


@pytest.fixture
async def memory(tmp_path: Path, settings: Settings) -> AsyncIterator[MemoryService]:
    """A service on a fresh database with the deterministic fake embedder."""
    async with MemoryService.open(
        settings, database=tmp_path / "memory.db", embedder=FakeEmbedder(), wait_for_embedder=10
    ) as service:
        yield service


@pytest.fixture(scope="session")
def real_embedder() -> FastEmbedEmbedder:
    """all-MiniLM-L6-v2 from the local ONNX export, loaded once per test session."""
    embedder = FastEmbedEmbedder(MODEL_NAME, model_path=str(model_path()))
    embedder.load()
    return embedder


@pytest.fixture
async def real_memory(
    tmp_path: Path, settings: Settings, real_embedder: FastEmbedEmbedder
) -> AsyncIterator[MemoryService]:
    """A service on a fresh database with the real model."""
    async with MemoryService.open(
        settings, database=tmp_path / "memory.db", embedder=real_embedder, wait_for_embedder=60
    ) as service:
        yield service


@pytest.fixture
def workers() -> Iterator[Workers]:
    """Starts worker processes (``workers.start(script, *args)``); kills any left at the end."""
    started = Workers()
    yield started
    started.kill_all()


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The environment a CLI gives the server: the user's, with this test's data and cache."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("MEMORY_MCP_")},
        "MEMORY_MCP_DATA_DIR": str(tmp_path / "data"),
        "MEMORY_MCP_EMBEDDER_MODEL_PATH": os.environ.get("MEMORY_MCP_EMBEDDER_MODEL_PATH", ""),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
