"""``memory-mcp doctor`` and ``backup``: check the indexes against the records, repair, copy.

The records table is canonical. Everything else is derived from it and can be
rebuilt: the FTS5 index (its ``rebuild`` command reads the records again), the
impact-ordered postings beside it (``postings.py``: made again from the current
records), each current record's neighbours in time (``neighbours.py``) and the
vectors (a current record's passage vectors live at rowids ``seq * MAX_PASSAGES
+ i`` for ``i < vec_rows`` of its embedder's vec0 table). A
record whose vectors are missing or incomplete loses the ones it has and goes
back to "awaiting vectors", which maintenance (or ``memory-mcp reembed``) then
makes again; vectors that belong to no current record are deleted, but for those
of retired records queued in ``retired_vectors``, which every reader skips already
and the engine deletes at its next quiet (``vectors.announce_retired``). Every
vector change is logged in ``vector_changes``, so that the in-memory copies
of other processes catch up.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from memory_mcp.errors import InvalidInput, StorageError
from memory_mcp.records import format_time, utcnow
from memory_mcp.storage.base import Check, Diagnosis
from memory_mcp.storage.sqlite import neighbours
from memory_mcp.storage.sqlite.driver import DATABASE_ERRORS
from memory_mcp.storage.sqlite.vectors import owner_of, rowids_of

if TYPE_CHECKING:  # the store calls these; importing it back would be a circle
    from memory_mcp.storage.sqlite.store import SqliteStore

_SHOWN = 20  # problems listed per check; the count says the rest


async def diagnose(store: SqliteStore, *, repair: bool = False) -> Diagnosis:
    """Check the database; with ``repair``, rebuild what disagrees with the records."""
    integrity = await _integrity(store)
    # SQLite's own check runs FTS5's too: that part is an index to rebuild, not damage.
    fts = [p for p in integrity.problems if "records_fts" in p]
    integrity.problems = [p for p in integrity.problems if p not in fts][:_SHOWN]
    fts = fts[:_SHOWN]
    checks = [integrity]
    if not integrity.ok:
        return Diagnosis(checks)  # a damaged file: leave it alone (restore a backup)
    checks.append(await _full_text(store, repair, fts))
    checks.append(await _postings(store, repair))
    checks.append(await _neighbours(store, repair))
    checks.extend(await _vectors(store, repair))
    checks.append(await _conflicts(store, repair))
    return Diagnosis(checks)


async def _integrity(store: SqliteStore) -> Check:
    """SQLite's own check, on a connection of its own.

    (A long-lived connection may hold FTS5 structure cached from before another
    connection rebuilt the index, and report it as malformed.)
    """

    def run() -> list[str]:
        conn = store.driver.connect(str(store.path), busy_timeout_ms=15000)
        try:
            return [str(r[0]) for r in conn.execute("PRAGMA integrity_check").fetchall()]
        finally:
            conn.close()

    found = await anyio.to_thread.run_sync(run)
    check = Check("sqlite integrity")
    if found != ["ok"]:
        check.problems = found
    return check


async def _full_text(store: SqliteStore, repair: bool, found: list[str]) -> Check:
    """The FTS5 index against the records (FTS5's own check, content included)."""
    check = Check("full-text index", problems=list(found))
    try:
        async with store.write() as tx:
            await tx.execute(
                "INSERT INTO records_fts (records_fts, rank) VALUES ('integrity-check', 1)"
            )
    except DATABASE_ERRORS as exc:  # SQLITE_CORRUPT: busy, read-only, full are not this
        if not check.problems:
            check.problems.append(f"the full-text index disagrees with the records ({exc})")
    if check.problems and repair:
        async with store.write() as tx:
            await tx.execute("INSERT INTO records_fts (records_fts) VALUES ('rebuild')")
        store.forget_word_counts()  # the index made again may count otherwise
        check.repaired = True
    return check


async def _postings(store: SqliteStore, repair: bool) -> Check:
    """The impact-ordered postings against the current records: each current record
    has its stems' postings, in its scope's and corpus's list, and no other record has
    any. (Their values are made from the records: a repair makes every one again.)"""
    check = Check("word postings")
    queries = (
        (
            "SELECT count(*) FROM records r WHERE r.live = 1 AND NOT EXISTS "
            "(SELECT 1 FROM postings p WHERE p.seq = r.seq) AND (r.content || r.merged_text "
            "|| r.tags) GLOB '*[0-9A-Za-z]*'",
            "{} current records have no postings",
        ),
        (
            "SELECT count(DISTINCT p.seq) FROM postings p LEFT JOIN records r ON r.seq = p.seq "
            "WHERE r.seq IS NULL OR r.live = 0",
            "{} records that are not current have postings",
        ),
        (
            "SELECT count(DISTINCT p.seq) FROM postings p JOIN records r ON r.seq = p.seq "
            "LEFT JOIN posting_lists l ON l.id = p.list "
            "WHERE l.id IS NULL OR l.scope_key <> r.scope_key OR l.corpus <> r.corpus",
            "{} records have postings in another scope's or corpus's list",
        ),
        (
            "SELECT count(DISTINCT p.seq) FROM postings p JOIN records r ON r.seq = p.seq "
            "WHERE p.kind <> r.kind",
            "{} records have postings of another kind",
        ),
        ("SELECT count(*) FROM postings_due", "{} records wait to be indexed"),
    )
    await check.tally(store.reads.fetch, queries)
    if check.problems and repair:
        async with store.write() as tx:
            await tx.execute("DELETE FROM postings")
            await tx.execute(
                "INSERT OR IGNORE INTO postings_due (seq) SELECT seq FROM records WHERE live = 1"
            )
        check.repaired = True  # the transaction's commit indexed them all
    return check


async def _neighbours(store: SqliteStore, repair: bool) -> Check:
    """Each current record's neighbours in time (``neighbours``) against the records."""
    check = Check("neighbours in time")
    await check.tally(
        store.reads.fetch,
        ((neighbours.DISAGREEING, "{} records' neighbours in time disagree with the records"),),
    )
    if check.problems and repair:
        async with store.write() as tx:
            for statement in neighbours.REBUILD:
                await tx.execute(statement)
        check.repaired = True
    return check


async def _vectors(store: SqliteStore, repair: bool) -> list[Check]:
    """Each vector table against the records that claim vectors in it."""
    checks = []
    tables = await store.reads.fetch("SELECT table_name, embedder FROM vector_indexes")
    known = {str(embedder) for _, embedder in tables}
    claims = await store.reads.fetch(
        "SELECT embedder, count(*) FROM records WHERE embedder IS NOT NULL GROUP BY embedder"
    )
    for embedder, count in claims:
        if str(embedder) not in known:
            check = Check(f"vectors of {embedder}")
            check.problems.append(
                f"{count} records claim vectors of {embedder}, which has no table"
            )
            if repair:
                async with store.write() as tx:
                    await tx.execute(
                        "UPDATE records SET embedder = NULL, vec_rows = 0 WHERE embedder = ?",
                        [embedder],
                    )
                check.repaired = True
            checks.append(check)
    if not store.vectors_available:
        return checks
    for table, embedder in tables:
        checks.append(await _vector_table(store, str(table), str(embedder), repair))
    return checks


async def _vector_table(store: SqliteStore, table: str, embedder: str, repair: bool) -> Check:
    check = Check(f"vectors of {embedder}")
    async with store.reads.snapshot():  # one moment for both reads
        actual = {int(r[0]) for r in await store.reads.fetch(f"SELECT rowid FROM {table}")}
        claims = [
            tuple(row)
            for row in await store.reads.fetch(
                "SELECT seq, id, vec_rows, live FROM records WHERE embedder = ?", [embedder]
            )
        ]
        # the rows of retired records, gone for every reader, deleted at the next quiet
        queued = await store.reads.fetch(
            "SELECT seq, vec_rows FROM retired_vectors WHERE embedder = ?", [embedder]
        )
    for seq, count in queued:
        actual.difference_update(rowids_of(int(seq), int(count)))
    short, orphans = _disagreements(actual, claims)
    for seq, record_id in short[:_SHOWN]:
        check.problems.append(f"record {record_id} (seq {seq}) lacks vectors it claims")
    if len(short) > _SHOWN:
        check.problems.append(f"... and {len(short) - _SHOWN} more records like it")
    if orphans:
        owners = sorted({owner_of(r) for r in orphans})
        check.problems.append(
            f"{len(orphans)} vectors belong to no current record (seq {owners[0]}"
            + (f" and {len(owners) - 1} more)" if len(owners) > 1 else ")")
        )
    if check.problems and repair:
        held: dict[int, set[int]] = {}
        for rowid in actual:
            held.setdefault(owner_of(rowid), set()).add(rowid)
        seqs = sorted({seq for seq, _ in short} | {owner_of(r) for r in orphans})
        await _repair_vectors(store, table, embedder, seqs, held)
        check.repaired = True
    return check


def _disagreements(
    actual: set[int], claims: list[tuple[Any, ...]]
) -> tuple[list[tuple[int, str]], list[int]]:
    """Records missing vectors they claim, and vectors no current record claims."""
    expected: set[int] = set()
    short: list[tuple[int, str]] = []
    for seq, record_id, count, live in claims:
        rowids = rowids_of(int(seq), int(count))
        if not live:
            short.append((int(seq), str(record_id)))  # vectors on a record that is not current
            continue
        expected.update(rowids)
        if not all(r in actual for r in rowids):
            short.append((int(seq), str(record_id)))
    return short, sorted(actual - expected)


async def _repair_vectors(
    store: SqliteStore, table: str, embedder: str, seqs: list[int], held: dict[int, set[int]]
) -> None:
    """Repair the records found wanting, as they are now, inside one write transaction.

    A server may have written since the check: each record is read again, and
    only what still disagrees is changed (vec0 finds rows fast by rowid alone).
    """
    async with store.write() as tx:
        for seq in seqs:
            rows = await tx.fetch(
                "SELECT seq, id, vec_rows, live, embedder FROM records WHERE seq = ?", [seq]
            )
            claims = [row[:4] for row in rows if row[4] == embedder]
            vec_rows = int(claims[0][2]) if claims else 0
            candidates = held.get(seq, set()) | set(rowids_of(seq, vec_rows))
            present = {
                r
                for r in candidates
                if await tx.fetch(f"SELECT 1 FROM {table} WHERE rowid = ?", [r])
            }
            short, orphans = _disagreements(present, claims)
            doomed = sorted(present) if short else orphans
            await tx.execute_many(f"DELETE FROM {table} WHERE rowid = ?", [(r,) for r in doomed])
            if short:
                await tx.execute(
                    "UPDATE records SET embedder = NULL, vec_rows = 0 WHERE seq = ?", [seq]
                )
            if doomed or short:
                await tx.log_change(embedder, seq)


async def _conflicts(store: SqliteStore, repair: bool) -> Check:
    """Open conflicts whose records are gone."""
    check = Check("conflicts")
    rows = await store.reads.fetch(
        "SELECT id FROM conflicts WHERE resolved_at IS NULL "
        "AND (NOT EXISTS (SELECT 1 FROM records WHERE id = conflicts.record_id) "
        "OR NOT EXISTS (SELECT 1 FROM records WHERE id = conflicts.other_id))"
    )
    if rows:
        check.problems.append(f"{len(rows)} open conflicts name a record that no longer exists")
        if repair:
            async with store.write() as tx:
                await tx.execute(
                    "UPDATE conflicts SET resolved_at = ?, resolution = 'purged' "
                    f"WHERE id IN ({', '.join('?' * len(rows))})",
                    [format_time(utcnow()), *(int(r[0]) for r in rows)],
                )
            check.repaired = True
    return check


async def backup(store: SqliteStore, target: Path, *, force: bool = False) -> Path:
    """A consistent copy of the database while writers go on; returns its path.

    ``target`` may be a directory (the copy is named after the time). The copy
    is readable by its owner only, is written under a temporary name and
    renamed when complete, and must pass ``PRAGMA integrity_check``.

    Raises:
        InvalidInput: the target exists (without ``force``) or its folder does not.
        StorageError: the copy failed its integrity check.
    """
    target, partial = await anyio.to_thread.run_sync(_backup_paths, target, force, store.path)
    try:
        await store.copy_to(partial)
        copy = await type(store).open(partial, driver=store.driver, vector_copy=False)
        try:
            found = await _integrity(copy)
        finally:
            await copy.close()
        if not found.ok:
            raise StorageError(f"the copy failed its integrity check: {found.problems[:3]}")
        await anyio.to_thread.run_sync(os.replace, partial, target)
    finally:
        await anyio.to_thread.run_sync(partial.unlink, True)
    return target


def _backup_paths(target: Path, force: bool, live: Path) -> tuple[Path, Path]:
    """Where a backup goes, and the name it is written under until it is checked."""
    if target.is_dir():
        target = target / f"memory-{utcnow().strftime('%Y%m%dT%H%M%SZ')}.db"
    here = os.path.realpath(live)
    if os.path.realpath(target) in (here, f"{here}-wal", f"{here}-shm", f"{here}-journal"):
        raise InvalidInput(f"{target} is the live database; back up to another file")
    if target.exists() and not force:
        raise InvalidInput(f"{target} exists; pass --force to replace it")
    if not target.parent.is_dir():
        raise InvalidInput(f"{target.parent} is not a directory")
    return target, target.with_name(f".{target.name}.partial")
