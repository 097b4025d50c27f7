"""Archiving, the soft delete, and its undoing: what ``memory_forget``, ``restore``,
``archived`` and ``project done`` do.

An archived record leaves every search and the brief, and stays restorable
exactly as it was until maintenance's purge deletes it (``maintenance.grace_days``
after it was archived).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from memory_mcp.engine import Engine
from memory_mcp.errors import InvalidInput, NotFound
from memory_mcp.records import Record, format_time, set_aside_by, without_surrogates
from memory_mcp.write import clean_text

_BATCH = 200  # records per transaction


async def forget(
    engine: Engine,
    record_id: str,
    *,
    reason: str = "forgotten",
    cwd: str | Path | None = None,
    anywhere: bool = True,
) -> Record:
    """Archive a record (reversible until the purge's grace window ends).

    Args:
        anywhere: False limits it to records of ``cwd``'s project and the global
            scope (what an agent may touch); the operator's CLI may archive any.

    Raises:
        NotFound: no record has that id (in reach).
        InvalidInput: the record is already archived, or no reason is given.
    """
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidInput("reason is empty; say why the memory no longer holds")
    if not isinstance(record_id, str) or not record_id.strip():
        raise InvalidInput("id is empty; pass the id of the memory to forget")
    record = await engine.store.get(without_surrogates(record_id.strip()))
    if (
        record is not None
        and not anywhere
        and (
            record.scope_key not in await engine.scope_keys("all", cwd)
            or not record.visible_to(engine.user)
        )
    ):
        record = None
    if record is None:
        where = "" if anywhere else " in this project or the global scope"
        raise NotFound(f"no record with id {record_id!r}{where}")
    if record.archived_at is not None:
        raise InvalidInput(f"record {record_id} is already archived ({record.archived_reason})")
    async with engine.store.write() as tx:
        await tx.archive(record.id, clean_text(reason), format_time(engine.clock()))
    archived = await engine.store.get(record.id)
    assert archived is not None
    return archived


async def restore(engine: Engine, record_ids: Sequence[str]) -> list[Record]:
    """Bring archived records back exactly as they were (until the purge takes them).

    All or nothing: an unknown id, or one that is not archived, fails the call
    before anything changes. A record a fold had absorbed leaves the record that
    holds it (and the two are kept apart from consolidation). A record a
    conflict's resolution archived (``conflict-<id>``) opens that conflict again
    while the record it contradicts is current. Vectors are made again at once
    when the embedder is ready (else re-embedding catches up).

    Raises:
        NotFound: no record has one of the ids (or it was purged).
        InvalidInput: a record is not archived.
    """
    ids = list(dict.fromkeys(i.strip() for i in record_ids if i.strip()))
    if not ids:
        raise InvalidInput("no id given; pass the ids of archived records (memory-mcp archived)")
    at = format_time(engine.clock())
    found: dict[str, Record] = {}
    async with engine.store.write() as tx:  # checked inside: nothing changes on an error
        for record_id in ids:
            record = await tx.get(record_id)
            if record is None:
                raise NotFound(f"no record with id {record_id!r} (purged records cannot come back)")
            if record.archived_at is None:
                raise InvalidInput(f"record {record_id} is not archived")
            found[record_id] = record
        restored = [r for r in [await tx.restore(i, at) for i in ids] if r is not None]
        for record in found.values():
            if (conflict_id := set_aside_by(record.archived_reason)) is not None:
                await tx.reopen_conflict(conflict_id, record.id)
    holders = [r.replaced_by for r in found.values() if r.replaced_by]
    await engine.embed_stored([*ids, *holders])
    return await engine.store.get_many([r.id for r in restored])


async def archive_project(engine: Engine, cwd: str | Path | None, *, dry_run: bool = False) -> int:
    """Archive every record of a finished project (reason ``project-done``); how many.

    History goes too, so the purge leaves nothing of the project behind once the
    grace window ends; ``restore`` brings any of it back until then.
    """
    keys = (await engine.project(cwd)).keys
    if dry_run:
        return sum([await engine.store.count_unarchived(key) for key in keys])
    archived = 0
    at = format_time(engine.clock())
    for key in keys:
        while batch := await engine.store.unarchived(key, _BATCH):
            async with engine.store.write() as tx:
                for record_id in batch:
                    archived += await tx.archive(record_id, "project-done", at)
    return archived


async def archived(
    engine: Engine,
    scope_keys: Sequence[str] = (),
    *,
    reason: str | None = None,
    limit: int = 50,
    offset: int = 0,
) -> list[Record]:
    """Archived records of these scopes (every scope if none), most recent first
    (after the first ``offset``)."""
    return await engine.store.archived(tuple(scope_keys), reason=reason, limit=limit, offset=offset)
