"""Shared fixtures: real SQLite in tmp_path, a fake embedder, and the real model.

The storage backend of the whole suite is SQLite in each test's ``tmp_path``
unless ``--storage-url URL`` (or ``$MEMORY_MCP_TEST_STORAGE_URL``) names another:
``{id}`` in it becomes a name unique to each test (its own database), and the
services the fixtures open, the settings fixture and every process a test
starts (through ``MEMORY_MCP_STORAGE_URL``) use it; a test names each further store it
opens through ``helpers.storage.store_place``. A test marked ``sqlite_only`` is about
the SQLite file itself: it runs on SQLite in its ``tmp_path`` whatever ``sqlite:`` URL
is selected, and is skipped when the URL names another backend.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from helpers import postgres
from helpers.model import MODEL_ENV, MODEL_NAME, local_model, model_path, seed_model_cache
from helpers.processes import Workers
from helpers.storage import STORAGE_URL_ENV, store_place
from memory_mcp.config import Settings, StorageSettings
from memory_mcp.dirs import CACHE_ENV
from memory_mcp.embedders.base import FakeEmbedder
from memory_mcp.embedders.fastembed import FastEmbedEmbedder
from memory_mcp.service import MemoryService
from memory_mcp.storage.factory import scheme


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--storage-url",
        default=os.environ.get(STORAGE_URL_ENV, ""),
        help=f"storage.url of the backend to test (default ${STORAGE_URL_ENV}, else SQLite); "
        "{id} becomes a name unique to each test",
    )


def pytest_configure(config: pytest.Config) -> None:
    template = str(config.getoption("--storage-url") or "")
    if template and "{id}" not in template:
        raise pytest.UsageError(f"--storage-url {template!r} has no {{id}}: tests would share it")
    if postgres.is_postgres(template):
        config.option.storage_url = postgres.start(template)


def pytest_unconfigure(config: pytest.Config) -> None:
    postgres.stop()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    template = str(config.getoption("--storage-url") or "")
    if scheme(template) == "sqlite":
        return
    skip = pytest.mark.skip(reason="this test is about the SQLite file")
    for item in items:
        if item.get_closest_marker("sqlite_only"):
            item.add_marker(skip)


@pytest.fixture
def storage_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """This test's ``storage.url``: empty for SQLite in ``tmp_path`` (the default, and
    always for a ``sqlite_only`` test). On Postgres, the test's databases are made
    as it names them and dropped after it (``helpers.postgres``)."""
    template = str(request.config.getoption("--storage-url") or "")
    if request.node.get_closest_marker("sqlite_only"):
        yield ""
        return
    url = template.replace("{id}", uuid.uuid4().hex[:12])
    if not postgres.is_postgres(url):
        yield url
        return
    postgres.create_database(url)
    try:
        yield url
    finally:
        postgres.drop_databases()


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
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "xdg-cache" / "memory-mcp"))  # any platform
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
    settings, database = store_place(tmp_path, storage_url, settings=settings)
    async with MemoryService.open(
        settings,
        database=database,
        embedder=FakeEmbedder(),
        wait_for_embedder=10,
    ) as service:
        yield service


@pytest.fixture(scope="session")
def real_embedder(tmp_path_factory: pytest.TempPathFactory) -> FastEmbedEmbedder:
    """all-MiniLM-L6-v2 from the local ONNX export, loaded once per test session (its
    streamlined graph kept in a cache folder of the session's, not the developer's)."""
    embedder = FastEmbedEmbedder(MODEL_NAME, model_path=str(model_path()))
    cache = tmp_path_factory.mktemp("model-cache")
    seed_model_cache(cache)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_ENV, str(cache))
        embedder.load()
    return embedder


@pytest.fixture
async def real_memory(
    tmp_path: Path, settings: Settings, real_embedder: FastEmbedEmbedder, storage_url: str
) -> AsyncIterator[MemoryService]:
    """A service on a fresh database with the real model."""
    settings, database = store_place(tmp_path, storage_url, settings=settings)
    async with MemoryService.open(
        settings,
        database=database,
        embedder=real_embedder,
        wait_for_embedder=60,
    ) as service:
        yield service


@pytest.fixture
def workers() -> Iterator[Workers]:
    """Starts worker processes (``workers.start(script, *args)``); kills any left at the end."""
    started = Workers()
    yield started
    started.kill_all()


@pytest.fixture
def env(tmp_path: Path, storage_url: str) -> dict[str, str]:
    """The environment a CLI gives the server: the user's, with this test's data and cache
    (and the backend the suite runs on)."""
    seed_model_cache(tmp_path / "cache" / "memory-mcp")
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("MEMORY_MCP_")},
        "MEMORY_MCP_DATA_DIR": str(tmp_path / "data"),
        MODEL_ENV: local_model(),  # the processes it starts find the model as the tests do
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        CACHE_ENV: str(tmp_path / "cache" / "memory-mcp"),
        **({"MEMORY_MCP_STORAGE_URL": storage_url} if storage_url else {}),
    }
