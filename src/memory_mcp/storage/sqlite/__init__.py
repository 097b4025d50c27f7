"""The SQLite backend: one file, WAL, FTS5 for words, sqlite-vec for vectors.

Two connections per process: a writer, whose transactions are ``BEGIN
IMMEDIATE`` (the database's write lock, shared by every process on the file)
and serialized in-process by a lock; and a reader, which in WAL mode never
waits for writers.

Vectors live in one vec0 table per (embedder, dimension), partitioned by scope
key, with the corpus and kind of each record as metadata so that
nearest-neighbour queries filter inside the index. Only current records have
vectors: record ``seq`` owns rowids ``seq * MAX_PASSAGES + i`` for ``i <
vec_rows``. vec0 finds a row quickly only by rowid equality (a rowid range or
IN list scans the whole index), so every per-record read joins on rowid, and
deletes go one rowid at a time. Triggers keep FTS5 in step with ``records``
and queue the vectors of a record that stops being current; ``write()``
deletes them before its transaction commits.

Searches score an in-memory copy of the vector table (``dense.DenseIndex``),
which every vector write keeps current through the ``vector_changes`` log;
vec0's own k-nearest search answers when there is no copy.

The modules: ``store`` (``SqliteStore``: connections, write lock, store-wide
reads), ``queries`` (reads shared by the reader and transactions),
``transaction`` (the writes), ``upkeep`` (reads for maintenance and the inbox),
``vectors`` (vec0 tables, rowids, the change log),
``dense`` (the in-memory copies), ``sql`` (columns, filters, query builders),
``driver`` (which SQLite module loads sqlite-vec), ``migrations`` (the schema and
opening a file), ``doctor`` (checks, repair, backup).
"""

from memory_mcp.storage.sqlite.sql import fts_query
from memory_mcp.storage.sqlite.store import SqliteStore

__all__ = ["SqliteStore", "fts_query"]
