"""Each vector space's ivfflat index: when it is made, and made again as the space grows.

pgvector's HNSW index (0.6, what ``pgserver`` ships) lost whole queries on the
bench store: a beam that enters a cluster of near-identical passages (a template
that differs by a number, one sentence window shared by thousands of records)
fills up inside it, and recall@50 was 0.90 (0.97 at ``ef_search`` 1,000). An
ivfflat index scores every row of the ``IVF_PROBES`` lists nearest the query
exactly, whatever the graph, as SQLite's clusters do: 0.997 of the exact top 50
at 141k rows with 48 of 400 lists, in 6.5 ms.

An ivfflat index learns its lists from the rows there are when it is built, so:

- a space gets its index once it holds rows for ``2 * IVF_PROBES`` lists
  (``ivf_lists``: about 3,800 rows); below that a search reads every row, which
  costs about what scoring 48 lists would;
- it is built again, with ``ivf_lists(rows)`` lists, once the rows have doubled
  since (``due``), so that a search scores about the same share of them;
- inside a transaction (opening a store whose space lacks one, ``doctor
  --repair``, a copy, ``team init``) it is built there (``build_statements``); as the
  store grows, a thread of the process that wrote builds the next one
  ``CONCURRENTLY`` beside the current one and swaps them (``Rebuilder``), so
  writes and searches never wait for it.

Only the tables' owner may build an index: a team member's process that finds
one due says so once; the next ``memory-mcp team init`` (or a process of the
owner's) builds it, and meanwhile searches stay right, only slower.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from memory_mcp.storage.base import IVF_PROBES, ivf_lists

log = logging.getLogger(__name__)

INDEX_LOCK = 0x6D6D6370_0003  # pg_try_advisory_lock key: one builder per database
_SAMPLES = 50  # rows pgvector's k-means samples per list
_CHECK_SHARE = 8  # a process checks again once it wrote an eighth of the rows it saw
_CHECK_LEAST = 1_000  # ... and at least this many rows

# Each space (id, dimension), its rows (counted only where it has no valid index,
# unless the parameter is true; NULL: not counted), and the lists of its valid index
# (NULL: none).
SPACES_SQL = (
    "WITH s AS (SELECT v.id, v.dim, (SELECT substring(array_to_string(c.reloptions, ',') "
    "FROM 'lists=([0-9]+)')::int FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid "
    "JOIN pg_am a ON a.oid = c.relam AND a.amname = 'ivfflat' "
    "WHERE c.relnamespace = current_schema()::regnamespace "
    "AND c.relname = 'vectors_space_' || v.id AND i.indisvalid) AS lists "
    "FROM vector_indexes v) "
    "SELECT s.id, s.dim, CASE WHEN s.lists IS NULL OR %s THEN "
    "(SELECT count(*) FROM vectors x WHERE x.space = s.id) END, s.lists FROM s ORDER BY s.id"
)


def index_name(space: int) -> str:
    return f"vectors_space_{space}"


def due(rows: int, lists: int | None) -> int | None:
    """The lists a space of ``rows`` should be indexed with now, or None: as it is."""
    want = ivf_lists(rows)
    if want < 2 * IVF_PROBES:
        return None
    if lists is not None and want * want < 2 * lists * lists:
        return None  # fewer than twice the rows it was built on
    return want


def build_statements(space: int, dim: int, lists: int, *, concurrently: bool) -> list[str]:
    """The statements that build one space's ivfflat index (cosine) with ``lists``:
    in a transaction, in the place of the one there; ``concurrently`` (outside any
    transaction), as ``index_name(space)_next`` beside it, then put in its place.

    Each first gives the build the memory pgvector asks for (it refuses to build
    with less): its k-means holds ``_SAMPLES`` rows a list, and about as much again
    twice over (111 MB asked at 583 lists of 384 dimensions; 64 MB is the default).
    """
    current = index_name(space)
    target, how = (current + "_next", "CONCURRENTLY ") if concurrently else (current, "")
    megabytes = max(64, -(-3 * lists * _SAMPLES * (8 + 4 * dim) // 2**20))
    local = "false" if concurrently else "true"
    statements = [
        f"DROP INDEX {how}IF EXISTS {target}",
        f"SELECT set_config('maintenance_work_mem', '{megabytes}MB', {local})",
        f"CREATE INDEX {how}{target} ON vectors USING ivfflat "
        f"((embedding::vector({dim})) vector_cosine_ops) WITH (lists = {lists}) "
        f"WHERE space = {space}",
    ]
    if concurrently:
        statements += [
            f"DROP INDEX CONCURRENTLY IF EXISTS {current}",
            f"ALTER INDEX {target} RENAME TO {current}",
        ]
    return statements


def spaces_due(rows: Sequence[Sequence[Any]]) -> list[tuple[int, int, int]]:
    """(space, dimension, lists) of each row of ``SPACES_SQL`` whose index is due."""
    found = []
    for space, dim, count, lists in rows:
        if count is None:
            continue
        want = due(int(count), None if lists is None else int(lists))
        if want is not None:
            found.append((int(space), int(dim), want))
    return found


class Rebuilder:
    """Builds the indexes that came due in a thread of this process, on a connection
    of its own (``CREATE INDEX CONCURRENTLY`` runs outside transactions).

    ``wrote(rows)`` counts the vector rows this process wrote; after an eighth of the
    rows seen at the last check (at least ``_CHECK_LEAST``), the next ``check()`` looks
    at the database again. A build another process runs (the advisory lock) is left to
    it; ``close()`` cancels a build under way (its half-made index is dropped by the
    next one).
    """

    def __init__(self, url: str, search_path: str) -> None:
        self._url = url
        self._search_path = search_path
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._conn: Any = None
        self._written = 0
        self._next_check = 0  # rows to write before checking again (0: check)
        self._refused = False  # this role may not build indexes: said once
        self._closed = False

    def wrote(self, rows: int) -> None:
        self._written += rows

    def check(self) -> threading.Thread | None:
        """Start a check (and the builds it finds due) unless one runs or none is owed;
        the thread that runs it, if any."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return self._thread
            if self._closed or self._refused or self._written < self._next_check:
                return None
            self._written = 0
            self._thread = threading.Thread(
                target=self._run, name="memory-mcp-vector-index", daemon=True
            )
            self._thread.start()
            return self._thread

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for a check under way; False if it still runs."""
        thread = self._thread
        if thread is None:
            return True
        thread.join(seconds)
        return not thread.is_alive()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conn, thread = self._conn, self._thread
        if conn is not None and thread is not None and thread.is_alive():
            try:
                conn.cancel_safe(timeout=2.0)
            except Exception:  # the build ends on its own, or with the process
                log.debug("could not cancel a vector index build", exc_info=True)

    def _run(self) -> None:
        import psycopg
        from psycopg import errors

        try:
            with psycopg.connect(self._url, autocommit=True) as conn:
                with self._lock:
                    if self._closed:
                        return
                    self._conn = conn
                conn.execute(f"SET search_path TO {self._search_path}".encode())
                got = conn.execute("SELECT pg_try_advisory_lock(%s)", [INDEX_LOCK]).fetchone()
                if not got or not got[0]:
                    return  # another process checks and builds
                rows = conn.execute(SPACES_SQL.encode(), [True]).fetchall()
                seen = sum(int(count) for _, _, count, _ in rows)
                self._next_check = max(_CHECK_LEAST, seen // _CHECK_SHARE)
                for space, dim, lists in spaces_due(rows):
                    log.info("building %s with %d lists", index_name(space), lists)
                    for statement in build_statements(space, dim, lists, concurrently=True):
                        conn.execute(statement.encode())
        except errors.InsufficientPrivilege:
            self._refused = True
            log.warning(
                "the vector index is due to be built again for the store's size, but this "
                "role may not build indexes: `memory-mcp team init` as the database's "
                "owner builds it (searches stay right meanwhile, only slower)"
            )
        except errors.QueryCanceled:
            log.info("a vector index build was cancelled (the store closed)")
        except Exception:
            log.warning("could not build a vector index", exc_info=True)
        finally:
            with self._lock:
                self._conn = None
