"""Shared fixtures: real SQLite in tmp_path, a fake embedder, and the real model.

The storage backend of the whole suite is SQLite in each test's ``tmp_path``
unless ``--storage-url URL`` (or ``$MEMORY_MCP_TEST_STORAGE_URL``) names another:
``{id}`` in it becomes a name unique to each test (its own database), and the
services the fixtures open, the settings fixture and every process a test
starts (through ``MEMORY_MCP_STORAGE_URL``) use it.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from memory_mcp.config import Settings, StorageSettings
from memory_mcp.embedders.base import FakeEmbedder
from memory_mcp.embedders.fastembed import FastEmbedEmbedder
from memory_mcp.service import MemoryService

REPO = Path(__file__).resolve().parents[1]
MODEL_ENV = "MEMORY_MCP_EMBEDDER_MODEL_PATH"
MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
SHARED = REPO.parent / "shared"
STORAGE_URL_ENV = "MEMORY_MCP_TEST_STORAGE_URL"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--storage-url",
        default=os.environ.get(STORAGE_URL_ENV, ""),
        help=f"storage.url of the backend to test (default ${STORAGE_URL_ENV}, else SQLite); "
        "{id} becomes a name unique to each test",
    )


@pytest.fixture
def storage_url(request: pytest.FixtureRequest) -> str:
    """This test's ``storage.url``: empty for SQLite in ``tmp_path`` (the default)."""
    template = str(request.config.getoption("--storage-url") or "")
    return template.replace("{id}", uuid.uuid4().hex[:12])


def database_in(tmp_path: Path, storage_url: str) -> Path | None:
    """The SQLite file a fixture opens, or None when another backend is selected."""
    return None if storage_url else tmp_path / "memory.db"


@functools.cache
def model_path() -> Path:
    """The real model's folder, found once per test session.

    ``$MEMORY_MCP_EMBEDDER_MODEL_PATH``, else ``../shared/models/`` beside the
    clone (CI), else fastembed's normal download into its cache. When none
    works (offline, no model), the whole run stops with one message saying how
    to provide it.
    """
    configured = os.environ.get(MODEL_ENV)
    if configured:
        if not (Path(configured) / "model.onnx").is_file():
            pytest.exit(f"{MODEL_ENV}={configured} holds no model.onnx; {_MODEL_HINT}", 1)
        return Path(configured)
    beside = SHARED / "models" / "all-MiniLM-L6-v2-onnx"
    if (beside / "model.onnx").is_file():
        return beside
    try:
        offline = FastEmbedEmbedder(MODEL_NAME).can_download()  # seconds, not fastembed's retries
        if offline:
            raise RuntimeError(offline)
        from fastembed import TextEmbedding

        folder = Path(TextEmbedding(MODEL_NAME).model._model_dir)
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        pytest.exit(
            f"the tests that need the real embedding model cannot get it: {MODEL_NAME} is not "
            f"on this machine and fastembed could not download it ({reason[:200]}). "
            f"{_MODEL_HINT}",
            1,
        )
    return folder


_MODEL_HINT = (
    f"Set {MODEL_ENV} to the folder of all-MiniLM-L6-v2's ONNX export (model.onnx, "
    "tokenizer.json), or run the tests once with network access so that fastembed can "
    "download it."
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _isolated_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, storage_url: str
) -> None:
    """No test reads the developer's config or writes to their data directory."""
    for name in list(os.environ):
        if name.startswith("MEMORY_MCP_") and name != MODEL_ENV:
            monkeypatch.delenv(name)
    if storage_url:
        monkeypatch.setenv("MEMORY_MCP_STORAGE_URL", storage_url)
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
def settings(storage_url: str) -> Settings:
    return Settings(storage=StorageSettings(url=storage_url)) if storage_url else Settings()


@pytest.fixture
async def memory(
    tmp_path: Path, settings: Settings, storage_url: str
) -> AsyncIterator[MemoryService]:
    """A service on a fresh database with the deterministic fake embedder."""
    async with MemoryService.open(
        settings,
        database=database_in(tmp_path, storage_url),
        embedder=FakeEmbedder(),
        wait_for_embedder=10,
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
    tmp_path: Path, settings: Settings, real_embedder: FastEmbedEmbedder, storage_url: str
) -> AsyncIterator[MemoryService]:
    """A service on a fresh database with the real model."""
    async with MemoryService.open(
        settings,
        database=database_in(tmp_path, storage_url),
        embedder=real_embedder,
        wait_for_embedder=60,
    ) as service:
        yield service


def start_ready(argv: list[str]) -> subprocess.Popen[str]:
    """Start ``python *argv`` (a worker script) and wait until it prints "ready"."""
    proc = subprocess.Popen(
        [sys.executable, *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise AssertionError(f"worker did not start: {line!r} {proc.communicate()[1]}")
    return proc


def release(*procs: subprocess.Popen[str]) -> None:
    """Send the go line to workers started by ``start_ready``: they begin at once."""
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
