"""What undoing a fold does to the record that absorbed it: the same on every backend."""

from __future__ import annotations

from typing import Protocol

from memory_mcp.records import Conflict, Record

KEPT_APART = "kept apart"  # the resolution of a pair a person took apart: never folded again


class Unfolding(Protocol):
    """The writes an unfold needs (a backend's write transaction has them)."""

    async def get(self, record_id: str) -> Record | None: ...

    async def update_merged(self, record: Record, at: str) -> bool: ...

    async def drop_vectors(self, record_id: str) -> None: ...

    async def import_conflict(self, conflict: Conflict) -> bool: ...


async def unfold(tx: Unfolding, record: Record, at: str) -> None:
    """Take a folded record's texts out of the current record that holds them.

    The holder (``replaced_by``, followed to the current record) loses the
    entry of the record and the entries the record had absorbed itself, and the
    folds and accesses they brought; tags and importance it took over stay. Its
    vectors were made with the restored texts, so they are dropped (re-embedding
    makes them again). The pair is written down as a resolved conflict, kept
    apart, so that maintenance's consolidation does not fold it again (it skips
    every pair that was ever in the inbox).
    """
    holder_id = record.replaced_by
    seen: set[str] = set()
    while holder_id is not None and holder_id not in seen:
        seen.add(holder_id)
        holder = await tx.get(holder_id)
        if holder is None:
            return
        if holder.current:
            gone = {record.id, *(m.id for m in record.merged_from)}
            kept = [m for m in holder.merged_from if m.id not in gone]
            if len(kept) != len(holder.merged_from):
                holder.merged_from = kept
                holder.fold_count = max(0, holder.fold_count - record.fold_count - 1)
                holder.access_count = max(0, holder.access_count - record.access_count)
                await tx.update_merged(holder, at)
                await tx.drop_vectors(holder.id)
            await tx.import_conflict(
                Conflict(
                    0,
                    holder.scope_key,
                    holder.id,
                    record.id,
                    "fold undone",
                    at,
                    resolved_at=at,
                    resolution=KEPT_APART,
                )
            )
            return
        holder_id = holder.replaced_by
