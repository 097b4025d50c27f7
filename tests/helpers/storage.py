"""Which storage backend the suite runs on (see conftest's ``--storage-url``), and the
stores a test opens on it.

A test names each store it opens (``store_place(tmp_path, storage_url, "a")``):
two names are two stores, one name opened twice is one store, and the default
name, ``memory``, is the test's own store (the one the ``memory`` fixture and the
processes the test starts use). Without a switch a store is the SQLite file
``tmp_path/NAME.db``; with one it is the switch's URL with the name in it.

A URL template must hold ``{id}`` (each test gets its own stores) and end its
path in a file or database name: a store's name goes at the end of that last
segment, before its extension, so ``sqlite:////tmp/mm-{id}.db`` gives
``sqlite:////tmp/mm-3f2a…-warm.db`` and ``postgresql://host/mm_{id}`` gives
``postgresql://host/mm_3f2a…-warm`` for the store named ``warm`` (on Postgres each
is a database of its own, made when first named: ``helpers.postgres``).
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from pathlib import Path

import msgspec

from helpers import postgres
from memory_mcp.config import Settings, StorageSettings
from memory_mcp.embedders.base import FakeEmbedder
from memory_mcp.service import MemoryService

STORAGE_URL_ENV = "MEMORY_MCP_TEST_STORAGE_URL"
OWN_STORE = "memory"


def store_url(tmp_path: Path, storage_url: str, name: str = OWN_STORE) -> str:
    """The ``storage.url`` of this test's store called ``name`` (what a worker process gets)."""
    if not storage_url:
        return f"sqlite://{tmp_path / name}.db"
    if name == OWN_STORE:
        return storage_url
    path, query, rest = storage_url.partition("?")
    folder, slash, last = path.rpartition("/")
    stem, dot, extension = last.partition(".")
    url = f"{folder}{slash}{stem}-{name}{dot}{extension}{query}{rest}"
    if postgres.is_postgres(url) and url not in postgres.made:
        postgres.create_database(url)
    return url


def store_place(
    tmp_path: Path, storage_url: str, name: str = OWN_STORE, settings: Settings | None = None
) -> tuple[Settings, Path | None]:
    """The settings and ``database`` to open this test's store called ``name`` with:
    ``settings`` (default ``Settings()``) pointed at the store's URL, or unchanged with
    the SQLite file ``tmp_path/NAME.db`` when no switch is set."""
    settings = Settings() if settings is None else settings
    if not storage_url:
        return settings, tmp_path / f"{name}.db"
    storage = msgspec.structs.replace(settings.storage, url=store_url(tmp_path, storage_url, name))
    return msgspec.structs.replace(settings, storage=storage), None


def open_url(url: str) -> AbstractAsyncContextManager[MemoryService]:
    """The store at ``url`` with the fake embedder loaded, as a worker process opens it."""
    settings = Settings(storage=StorageSettings(url=url))
    return MemoryService.open(settings, embedder=FakeEmbedder(), wait_for_embedder=10)
