"""Open the store that ``storage.url`` names: the one place that imports a backend.

    ""                        the default SQLite file (``data_dir``/memory.db)
    sqlite:///path/memory.db  a SQLite file of your choice
    postgresql://…            PostgreSQL + pgvector (``storage/postgres``; the ``postgres``
                              extra installs its driver)

Backends load lazily, so that an installation uses (and needs) only its own.
A URL is never shown with its password (``redacted``).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from memory_mcp.errors import ConfigError
from memory_mcp.records import utcnow

if TYPE_CHECKING:
    from memory_mcp.config import Settings
    from memory_mcp.storage.base import Store

# Schemes of the backends besides SQLite, by the module that holds them.
_BACKENDS = {"postgresql": "postgres", "postgres": "postgres"}


def scheme(url: str) -> str:
    """The backend a ``storage.url`` names (``sqlite`` when empty)."""
    return urlsplit(url).scheme.lower() if url else "sqlite"


def redacted(url: str) -> str:
    """``url`` without its password, to show or log."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def sqlite_path(url: str, default: Path) -> Path:
    """The SQLite file of a ``storage.url``: ``default`` when the URL is empty (or
    names another backend).

    Raises:
        ConfigError: a ``sqlite:`` URL that names no file.
    """
    if scheme(url) != "sqlite" or not url:
        return default
    path = url.split("://", 1)[1] if "://" in url else ""
    if not path.startswith("/") or path == "/":
        raise ConfigError(
            f"storage.url {redacted(url)!r} names no file: write sqlite:///path/to/memory.db "
            "(or leave it empty for the default file)"
        )
    return Path(path[1:] if path.startswith("//") else path).expanduser()


async def open_store(
    settings: Settings,
    *,
    database: Path | None = None,
    clock: Callable[[], datetime] = utcnow,
) -> Store:
    """Open (creating and migrating as needed) the store ``settings.storage.url`` names.

    Args:
        settings: the settings (``storage`` and ``data_dir``).
        database: a SQLite file to use instead of the configured one (tests, bench).
        clock: the store's time for a backend that runs on this machine (SQLite).

    Raises:
        ConfigError: the URL names a backend this version does not have, or none, or
            one whose driver is not installed.
        StorageError: the store cannot be opened or migrated.
    """
    url = settings.storage.url.strip()
    name = scheme(url)
    if name == "sqlite":
        from memory_mcp.storage.sqlite import SqliteStore

        path = database or settings.database_path()
        return await SqliteStore.open(
            path,
            driver=settings.storage.driver,
            busy_timeout_ms=settings.storage.busy_timeout_ms,
            clock=clock,
        )
    module = _BACKENDS.get(name)
    if module is None:
        raise ConfigError(
            f"storage.url {redacted(url)!r}: no storage backend is called {name!r}; "
            "leave it empty (or write sqlite:///path/to/memory.db) for SQLite"
        )
    backend = importlib.import_module(f"memory_mcp.storage.{module}")
    opened: Store = await backend.open_store(url, settings, clock=clock)
    return opened


def names_store(url: str, store: Store, settings: Settings) -> bool:
    """Whether ``url`` (a ``storage.url``) names ``store``, however it is spelled: a SQLite
    file by its real path (symlinks and ``..`` resolved), another backend by its URL
    without credentials, the scheme's aliases and letter case (``postgres://`` is
    ``postgresql://``, a host is the same in any case)."""
    url = url.strip()
    name = scheme(url)
    if _BACKENDS.get(name, name) != store.backend:
        return False
    if store.backend == "sqlite":
        path = sqlite_path(url, settings.database_path())
        return os.path.realpath(path) == os.path.realpath(store.location)
    return _canonical(url) == _canonical(store.location.split(" (schema ", 1)[0])


def _canonical(url: str) -> tuple[object, ...]:
    """What tells two URLs of one backend's server and database apart."""
    parts = urlsplit(url)
    query = sorted(p for p in parts.query.split("&") if p)
    host = (parts.hostname or "").lower()
    return (parts.username or "", host, parts.port, parts.path.rstrip("/"), tuple(query))
