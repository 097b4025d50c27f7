"""Postgres for the suite: a server of its own, and a database per test.

``--storage-url postgresql://pgserver/mm_{id}`` names no real host: ``pgserver``
means "start a PostgreSQL (with pgvector) in a temporary folder for this test
session" (the PyPI package ``pgserver`` ships the binaries; no Docker, no root),
and the URL becomes that server's. With a real server's URL
(``postgresql://user@host/mm_{id}``) the suite uses it as it is.

Either way each store a test names is its own database, made when the test
first names it (``CREATE DATABASE … TEMPLATE``, from a template database
migrated once per session, ``mm_template`` for ``mm_{id}``) and dropped when the
test ends.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

MAGIC_HOST = "pgserver"
made: list[str] = []  # this test's databases, by URL
_session: dict[str, Any] = {}  # the server pgserver started, and the template database


def is_postgres(url: str) -> bool:
    return urlsplit(url).scheme.lower() in ("postgresql", "postgres")


def start(template: str) -> str:
    """The URL template of the session: ``template``, its magic host replaced by a pgserver
    started for this session."""
    import psycopg  # kept: a test may hide the driver from the code under test

    _session.update(template=_database(template).replace("{id}", "template"), psycopg=psycopg)
    parts = urlsplit(template)
    if parts.hostname != MAGIC_HOST:
        return template
    import pgserver

    folder = Path(tempfile.mkdtemp(prefix="mm-pgserver-"))
    server = pgserver.get_server(folder, cleanup_mode="stop")
    _session.update(server=server, folder=folder)
    # A throwaway server: durability buys nothing and costs every commit a flush.
    for setting in ("fsync = off", "synchronous_commit = off", "full_page_writes = off"):
        server.psql(f"ALTER SYSTEM SET {setting};")
    server.psql("SELECT pg_reload_conf();")
    real = urlsplit(server.get_uri())  # postgresql://postgres:@/postgres?host=/tmp/…
    query = "&".join(q for q in (real.query, parts.query) if q)
    return urlunsplit(real._replace(path=parts.path, query=query))


def stop() -> None:
    """Stop the server ``start`` started, if it did."""
    server = _session.pop("server", None)
    if server is not None:
        server.cleanup()
        shutil.rmtree(_session.pop("folder"), ignore_errors=True)


def _database(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


def _with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _admin(url: str) -> Any:
    return _session["psycopg"].connect(_with_database(url, "postgres"), autocommit=True)


def create_database(url: str) -> None:
    """Make the database ``url`` names, a copy of the session's migrated template."""
    template = _session["template"]
    if not _session.get("migrated"):
        _make_template(_with_database(url, template))
        _session["migrated"] = True
    with _admin(url) as conn:
        conn.execute(
            f"CREATE DATABASE {_quoted(_database(url))} TEMPLATE {_quoted(template)}".encode()
        )
    made.append(url)


def _make_template(url: str) -> None:
    """(Re)create the template database and migrate it by opening a store on it once."""
    import anyio

    from memory_mcp.config import Settings, StorageSettings
    from memory_mcp.storage import open_store

    name = _database(url)
    with _admin(url) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {_quoted(name)} WITH (FORCE)".encode())
        conn.execute(f"CREATE DATABASE {_quoted(name)}".encode())

    async def migrate() -> None:
        store = await open_store(Settings(storage=StorageSettings(url=url)))
        await store.close()

    anyio.run(migrate)


def drop_databases() -> None:
    """Drop the databases this test made (connections left open by killed processes too)."""
    while made:
        url = made.pop()
        with _admin(url) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {_quoted(_database(url))} WITH (FORCE)".encode())


def as_role(url: str, role: str) -> str:
    """``url`` with ``role`` as its user (no password: the test server trusts local roles)."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{role}@{host}"))


async def drop_roles(url: str, *roles: str) -> None:
    """Drop roles a test made (and what they were granted in ``url``'s database)."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for role in roles:
            cursor = await conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
            if await cursor.fetchone():
                await conn.execute(f'DROP OWNED BY "{role}"; DROP ROLE "{role}"'.encode())
