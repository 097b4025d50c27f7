"""``doctor``, ``backup`` and the dry run's copy for the Postgres backend.

The records table is canonical; the rest is derived from it and rebuilt from
it: ``record_terms``, ``records.doc_len``, ``term_counts`` and ``lexical_stats``
(BM25), and the vectors (a current record's passages ``0 .. vec_rows - 1`` in its
embedder's space; a record whose vectors disagree loses them and goes back to
"awaiting vectors", which re-embedding makes again).

A backup is ``dump.FORMAT`` (a ``psql`` script of ``COPY`` blocks).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from memory_mcp.errors import InvalidInput
from memory_mcp.records import format_time, utcnow
from memory_mcp.storage.base import Check, Diagnosis
from memory_mcp.storage.bm25 import document_terms, indexed_columns
from memory_mcp.storage.postgres.dump import (
    IDENTITIES,
    TABLES,
    columns_of,
    quoted,
    setval,
    write_dump,
)
from memory_mcp.storage.postgres.migrations import MIGRATIONS
from memory_mcp.storage.postgres.vector_index import SPACES_SQL, spaces_due

if TYPE_CHECKING:
    from memory_mcp.storage.postgres.store import PgStore

_SHOWN = 20  # problems listed per check; the count says the rest
_BATCH = 1000


async def diagnose(store: PgStore, *, repair: bool = False) -> Diagnosis:
    """Check the database; with ``repair``, rebuild what disagrees with the records."""
    checks = [await _schema(store)]
    if not checks[0].ok:
        return Diagnosis(checks)
    checks.append(await _full_text(store, repair))
    checks.append(await _postings(store, repair))
    checks.append(await _vectors(store, repair))
    checks.append(await _conflicts(store, repair))
    return Diagnosis(checks)


async def _schema(store: PgStore) -> Check:
    check = Check("schema")
    rows = await store.fetch("SELECT name FROM schema_migrations ORDER BY name")
    applied = [str(r[0]) for r in rows]
    known = [m.name for m in MIGRATIONS]
    if applied != known:
        check.problems.append(f"migrations applied {applied}, this version has {known}")
    if not await store.fetch("SELECT 1 FROM pg_extension WHERE extname = 'vector'"):
        check.problems.append("the pgvector extension is not installed")
    return check


async def _full_text(store: PgStore, repair: bool) -> Check:
    """Each record's stems and length against its texts, and the collection's totals."""
    check = Check("full-text index")
    wrong: list[tuple[int, str]] = []
    after = 0
    while True:
        rows = await store.fetch(
            "SELECT r.seq, r.id, r.content, r.merged_text, r.tags, r.doc_len, "
            "coalesce((SELECT json_object_agg(t.term, t.tf) FROM record_terms t "
            "WHERE t.seq = r.seq), '{}'), NOT EXISTS (SELECT 1 FROM record_terms t "
            "WHERE t.seq = r.seq AND t.doc_len <> r.doc_len) "
            "FROM records r WHERE r.seq > %s ORDER BY r.seq LIMIT %s",
            [after, _BATCH],
        )
        if not rows:
            break
        for seq, record_id, content, merged, tags, doc_len, held, lengths_agree in rows:
            length, terms = document_terms(indexed_columns(content, merged, json.loads(tags)))
            stored = held if isinstance(held, dict) else json.loads(held)
            same = length == doc_len and lengths_agree and stored.keys() == terms.keys()
            if not same or any(abs(stored[k] - v) > 1e-9 for k, v in terms.items()):
                wrong.append((int(seq), str(record_id)))
        after = int(rows[-1][0])
    for seq, record_id in wrong[:_SHOWN]:
        check.problems.append(f"record {record_id} (seq {seq}) is indexed with other words")
    if len(wrong) > _SHOWN:
        check.problems.append(f"... and {len(wrong) - _SHOWN} more records like it")
    totals = await store.fetch(
        "SELECT s.documents, s.tokens, (SELECT count(*) FROM records), "
        "(SELECT coalesce(sum(doc_len), 0) FROM records) FROM lexical_stats s"
    )
    if not totals or tuple(totals[0][:2]) != tuple(totals[0][2:]):
        check.problems.append("the collection's word totals disagree with the records")
    orphans = await store.fetch(
        "SELECT count(*) FROM record_terms t WHERE NOT EXISTS "
        "(SELECT 1 FROM records r WHERE r.seq = t.seq)"
    )
    if int(orphans[0][0]):
        check.problems.append(f"{orphans[0][0]} indexed words belong to no record")
    miscounted = await store.fetch(f"SELECT count(*) FROM ({_MISCOUNTED_SQL}) AS x")
    if int(miscounted[0][0]):
        check.problems.append(f"{miscounted[0][0]} words' record counts disagree with the records")
    if check.problems and repair:
        async with store.write() as tx:
            for seq, _ in wrong:
                rows = await tx.fetch(
                    "SELECT content, merged_text, tags FROM records WHERE seq = %s", [seq]
                )
                for content, merged, tags in rows:
                    await tx.index_text(seq, content, merged, json.loads(tags))
            await tx.execute(
                "DELETE FROM record_terms t WHERE NOT EXISTS "
                "(SELECT 1 FROM records r WHERE r.seq = t.seq)"
            )
            await tx.execute(
                "UPDATE lexical_stats SET documents = (SELECT count(*) FROM records), "
                "tokens = (SELECT coalesce(sum(doc_len), 0) FROM records)"
            )
            await tx.execute("DELETE FROM term_counts")
            await tx.execute(
                "INSERT INTO term_counts (term, owner, n) "
                "SELECT term, owner, count(*) FROM record_terms GROUP BY term, owner"
            )
        check.repaired = True
    return check


# The stems whose ``term_counts`` row (by owner) is not the number of their rows in
# ``record_terms``; a stem no record holds any more may keep a row of 0.
_MISCOUNTED_SQL = (
    "SELECT term, owner FROM (SELECT term, owner, count(*) AS n FROM record_terms "
    "GROUP BY term, owner) t FULL JOIN term_counts c USING (term, owner) "
    "WHERE coalesce(t.n, 0) <> coalesce(c.n, 0)"
)


async def _postings(store: PgStore, repair: bool) -> Check:
    """The impact-ordered postings against the current records' stems: the same stems,
    in the record's scope's and corpus's list, with its kind; none of a record that is
    not current."""
    check = Check("word postings")
    queries = (
        (
            "SELECT count(*) FROM (SELECT t.seq, t.term, t.tf FROM record_terms t "
            "JOIN records r ON r.seq = t.seq WHERE r.live "
            "EXCEPT SELECT p.seq, p.term, p.tf FROM postings p) AS missing",
            "{} stems of current records have no posting",
        ),
        (
            "SELECT count(*) FROM postings p LEFT JOIN records r ON r.seq = p.seq "
            "LEFT JOIN posting_lists l ON l.id = p.list WHERE r.seq IS NULL OR NOT r.live "
            "OR l.id IS NULL OR l.scope_key <> r.scope_key OR l.corpus <> r.corpus "
            "OR p.kind <> r.kind OR NOT EXISTS (SELECT 1 FROM record_terms t WHERE t.seq = p.seq "
            "AND t.term = p.term AND t.tf = p.tf)",
            "{} postings belong to no current record's stems in its list",
        ),
    )
    await check.tally(store.fetch, queries)
    if check.problems and repair:
        async with store.write() as tx:
            await tx.execute("DELETE FROM postings")
            await tx.execute(
                "INSERT INTO postings (list, term, impact, seq, tf, doc_len, owner, kind) "
                "SELECT posting_list(r.scope_key, r.corpus), t.term, "
                "posting_impact(t.tf, t.doc_len), t.seq, t.tf, t.doc_len, t.owner, r.kind "
                "FROM record_terms t JOIN records r ON r.seq = t.seq WHERE r.live"
            )
        check.repaired = True
    return check


async def _vectors(store: PgStore, repair: bool) -> Check:
    """The vectors against the records that claim them, and each space's index."""
    check = Check("vectors")
    short = await store.fetch(
        "SELECT r.seq, r.id FROM records r LEFT JOIN vector_indexes i ON i.embedder = r.embedder "
        "WHERE r.embedder IS NOT NULL AND (NOT r.live OR i.id IS NULL OR r.vec_rows <> "
        "(SELECT count(*) FROM vectors v WHERE v.seq = r.seq AND v.space = i.id "
        "AND v.passage < r.vec_rows)) ORDER BY r.seq"
    )
    for seq, record_id in short[:_SHOWN]:
        check.problems.append(f"record {record_id} (seq {seq}) lacks vectors it claims")
    if len(short) > _SHOWN:
        check.problems.append(f"... and {len(short) - _SHOWN} more records like it")
    orphan_sql = (
        "FROM vectors v WHERE NOT EXISTS (SELECT 1 FROM records r JOIN vector_indexes i "
        "ON i.embedder = r.embedder WHERE r.seq = v.seq AND r.live AND i.id = v.space "
        "AND v.passage < r.vec_rows)"
    )
    orphans = await store.fetch(f"SELECT count(*) {orphan_sql}")
    if int(orphans[0][0]):
        check.problems.append(f"{orphans[0][0]} vectors belong to no current record")
    for space, _, lists in spaces_due(await store.fetch(SPACES_SQL, [True])):
        check.problems.append(
            f"vector space {space} needs its ivfflat index built (again) with {lists} lists"
        )
    if check.problems and repair:
        async with store.write() as tx:
            seqs = [int(seq) for seq, _ in short]
            await tx.execute("DELETE FROM vectors WHERE seq = ANY(%s)", [seqs])
            await tx.execute(
                "UPDATE records SET embedder = NULL, vec_rows = 0 WHERE seq = ANY(%s)", [seqs]
            )
            await tx.execute(f"DELETE {orphan_sql}")
            await store.ensure_indexes(tx, grown=True)
        check.repaired = True
    return check


async def _conflicts(store: PgStore, repair: bool) -> Check:
    """Open conflicts whose records are gone."""
    check = Check("conflicts")
    rows = await store.fetch(
        "SELECT id FROM conflicts WHERE resolved_at IS NULL "
        "AND (NOT EXISTS (SELECT 1 FROM records WHERE id = conflicts.record_id) "
        "OR NOT EXISTS (SELECT 1 FROM records WHERE id = conflicts.other_id))"
    )
    if rows:
        check.problems.append(f"{len(rows)} open conflicts name a record that no longer exists")
        if repair:
            async with store.write() as tx:
                await tx.execute(
                    "UPDATE conflicts SET resolved_at = %s, resolution = 'purged' "
                    "WHERE id = ANY(%s)",
                    [format_time(utcnow()), [int(r[0]) for r in rows]],
                )
            check.repaired = True
    return check


async def backup(store: PgStore, target: Path, *, force: bool = False) -> Path:
    """A consistent copy of the store while writers go on (``FORMAT``); its path.

    ``target`` may be a directory (the copy is named after the time). The copy
    is readable by its owner only, written under a temporary name and renamed
    when complete.

    Raises:
        InvalidInput: the target exists (without ``force``) or its folder does not.
    """
    target, partial = await anyio.to_thread.run_sync(_backup_paths, target, force)
    try:
        async with store.connection() as conn:
            await write_dump(conn, store.schema, partial)
        await anyio.to_thread.run_sync(os.replace, partial, target)
    finally:
        await anyio.to_thread.run_sync(partial.unlink, True)
    return target


async def copy_schema(source: PgStore, copy: PgStore) -> None:
    """Fill ``copy`` (freshly migrated, in another schema) with ``source``'s rows of one
    moment (one REPEATABLE READ transaction), then make its vector indexes."""
    live = quoted(source.schema).decode()
    async with copy.connection() as conn, conn.transaction():
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        await conn.execute("DELETE FROM lexical_stats")
        for table in TABLES:
            columns = ", ".join(await columns_of(conn, table))
            await conn.execute(
                f"INSERT INTO {table} ({columns}) SELECT {columns} FROM {live}.{table}".encode()
            )
        for table, column in IDENTITIES:
            await conn.execute(setval(table, column).encode())
    async with copy.write() as tx:
        await copy.ensure_indexes(tx)


def _backup_paths(target: Path, force: bool) -> tuple[Path, Path]:
    """Where a backup goes, and the name it is written under until it is complete."""
    if target.is_dir():
        target = target / f"memory-{utcnow().strftime('%Y%m%dT%H%M%SZ')}.sql"
    if target.exists() and not force:
        raise InvalidInput(f"{target} exists; pass --force to replace it")
    if not target.parent.is_dir():
        raise InvalidInput(f"{target.parent} is not a directory")
    return target, target.with_name(f".{target.name}.partial")
