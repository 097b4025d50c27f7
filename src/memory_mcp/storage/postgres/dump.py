"""The Postgres backend's backup format: a ``psql`` script of ``COPY`` blocks.

One ``COPY … FROM stdin`` block per table, in COPY's text format, all read in
one REPEATABLE READ snapshot while writers go on; no server-side program is
needed (``pg_dump`` of the server's version is often not installed beside the
client). Restore it into a database this memory-mcp version has opened once
(so its schema exists) and that holds no records yet: ``psql -v
ON_ERROR_STOP=1 -1 -f BACKUP "postgresql://…"``; the next start builds the
vector indexes again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from memory_mcp.records import format_time, utcnow

FORMAT = "memory-mcp postgres backup 1"
# Tables in the order a copy fills them: foreign keys first, and ``lexical_stats``
# after the records, whose trigger would otherwise count them twice. The schema's
# own migrations table is made by the migration, never copied.
TABLES = (
    "records",
    "record_terms",
    "lexical_stats",
    "vector_indexes",
    "vectors",
    "conflicts",
    "maintenance",
    "scope_activity",
    "scope_aliases",
)
IDENTITIES = (("records", "seq"), ("vector_indexes", "id"), ("conflicts", "id"))


async def columns_of(conn: Any, table: str) -> list[str]:
    """A table's stored columns (not generated ones), in order."""
    cursor = await conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = "
        "current_schema() AND table_name = %s AND is_generated = 'NEVER' ORDER BY ordinal_position",
        [table],
    )
    return [str(r[0]) for r in await cursor.fetchall()]


def setval(table: str, column: str) -> str:
    """Make an identity column go on after the rows a copy brought."""
    return (
        f"SELECT setval(pg_get_serial_sequence('{table}', '{column}'), "
        f"coalesce((SELECT max({column}) FROM {table}), 0) + 1, false)"
    )


def quoted(name: str) -> bytes:
    """A schema name, quoted as an SQL identifier."""
    return ('"' + name.replace('"', '""') + '"').encode()


async def write_dump(conn: Any, schema: str, path: Path) -> None:
    """Write ``schema``'s tables (``FORMAT``) to ``path``, owner-only, in one snapshot
    of ``conn`` (a connection with ``schema`` first on its search path, not in a
    transaction)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        async with conn.transaction():
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            out.write(f"-- {FORMAT}\n-- taken {format_time(utcnow())}\n".encode())
            out.write(f"-- schema {schema}\n".encode())
            out.write(b"SET search_path TO " + quoted(schema) + b", public;\n")
            out.write(b"DELETE FROM lexical_stats;\n")
            for table in TABLES:
                columns = ", ".join(await columns_of(conn, table))
                out.write(f"COPY {table} ({columns}) FROM stdin;\n".encode())
                async with conn.cursor().copy(
                    f"COPY {table} ({columns}) TO STDOUT".encode()
                ) as copy:
                    async for data in copy:
                        out.write(bytes(data))
                out.write(b"\\.\n")
            for table, column in IDENTITIES:
                out.write(f"{setval(table, column)};\n".encode())
