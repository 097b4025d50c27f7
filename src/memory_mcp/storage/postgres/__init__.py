"""The Postgres + pgvector backend (team mode): many machines, one memory.

``storage.url = "postgresql://user@host/db"`` opens it (credentials from the
URL, libpq's environment or its password file; never shown). It needs the
``postgres`` extra (``pip install 'memory-mcp[postgres]'``: psycopg 3 with its
pool, and pgvector's adapter) and a server with the ``vector`` extension.

The same protocols as SQLite (``storage.base``), the same ranking:

- Writes: ``write()`` is a transaction on a pooled connection holding one
  transaction-scoped advisory lock for the store, so a fold decision and its
  write are atomic across machines (``store.PgStore.write``).
- Words: FTS5's BM25 (``storage.bm25``) computed in SQL from each record's
  stems (``record_terms``) and the collection's totals, so the same records rank
  the same way on either backend.
- Vectors: one ``vectors`` table; each (embedder, dimension) is a space with
  its own partial ivfflat index (cosine), built once it holds a few thousand
  rows and again each time they double (``vector_index``). pgvector filters
  after the index scan, so searches deepen while filters reject, then scan
  exactly (``queries.Queries.nearest``).
- Time: leases are measured by the database server's clock.

The modules: ``store`` (``PgStore``: pool, write lock, store-wide reads),
``queries`` (reads shared with transactions), ``transaction`` (the writes),
``upkeep`` (reads for maintenance and the inbox), ``sql`` (filters, BM25),
``migrations`` (the schema), ``vector_index`` (when each space's index is built),
``dump`` (the backup format), ``doctor`` (checks,
repair, backup, the dry run's copy).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from memory_mcp.errors import ConfigError

if TYPE_CHECKING:
    from memory_mcp.config import Settings
    from memory_mcp.storage.base import Store

INSTALL_HINT = "pip install 'memory-mcp[postgres]'"


async def open_store(
    url: str, settings: Settings, *, clock: Callable[[], datetime] | None = None
) -> Store:
    """Open the Postgres store at ``url`` (``clock`` is unused: the server's clock rules).

    Typed as ``Store``, so that mypy holds ``PgStore`` to every protocol method.

    Raises:
        ConfigError: the driver is not installed (with the command that installs it).
        StorageError: the server cannot be reached or the database cannot be prepared.
    """
    del clock
    try:
        import pgvector.psycopg  # noqa: F401
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f"storage.url names a PostgreSQL database, but its driver is not installed "
            f"({exc.name}): {INSTALL_HINT}"
        ) from exc
    from memory_mcp.storage.postgres.store import PgStore

    return await PgStore.open(
        url,
        busy_timeout_ms=settings.storage.busy_timeout_ms,
        backup_dir=settings.database_path().parent / "backups",
    )
