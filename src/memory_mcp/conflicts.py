"""The operator's conflicts inbox: open conflicts with both texts, and closing one.

A conflict is two current facts of one scope that contradict each other (the
write path or maintenance's sweep found it); both stay current, and searches
and the brief show each with a note naming the other, until the operator
decides here which holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from memory_mcp.engine import Engine
from memory_mcp.errors import InvalidInput, NotFound
from memory_mcp.records import Conflict, Record, format_time, set_aside_reason
from memory_mcp.scope import Scope
from memory_mcp.storage.base import Vector
from memory_mcp.write import prepare


@dataclass
class ConflictView:
    """An open conflict with both texts: one line of the operator's inbox."""

    conflict: Conflict
    new: Record | None
    old: Record | None

    def to_json(self) -> dict[str, Any]:
        return {
            **self.conflict.to_json(),
            "new": None if self.new is None else self.new.to_json(),
            "old": None if self.old is None else self.old.to_json(),
        }


async def open_conflicts(engine: Engine) -> list[ConflictView]:
    """The operator's inbox: every open conflict, oldest first, with both records (those
    about another user's personal records left out)."""
    views = []
    for conflict in await engine.store.conflicts(open_only=True):
        pair = {
            r.id: r for r in await engine.store.get_many([conflict.record_id, conflict.other_id])
        }
        if not all(r.visible_to(engine.user) for r in pair.values()):
            continue
        views.append(
            ConflictView(conflict, pair.get(conflict.record_id), pair.get(conflict.other_id))
        )
    return views


Keep = Literal["new", "old", "both", "merged"]


async def resolve_conflict(
    engine: Engine, conflict_id: int, keep: Keep, text: str | None = None, *, agent: str = "cli"
) -> tuple[Conflict, Record | None]:
    """Close a conflict: keep the newer record, the older, both, or a merged text (written
    by ``agent``: the CLI, the viewer).

    - ``new``: the older record becomes history of the newer (as a supersede);
    - ``old``: the newer record is archived (reason ``conflict-<id>``; restorable);
    - ``both``: both stay current;
    - ``merged``: a new record with ``text`` replaces both (they become its history).

    Returns the conflict as closed, and the record written for ``merged``.

    Raises:
        NotFound: no such conflict, or one of its records is gone.
        InvalidInput: it is already resolved, a record is no longer current, or
            ``text`` is missing (for merged) or given for another choice.
    """
    conflict = await engine.store.conflict(conflict_id)
    pair = {}
    if conflict is not None:
        found = await engine.store.get_many([conflict.record_id, conflict.other_id])
        pair = {r.id: r for r in found}
    if conflict is None or not all(r.visible_to(engine.user) for r in pair.values()):
        # another user's personal records: as if there were no such conflict
        raise NotFound(f"no conflict #{conflict_id} (memory-mcp conflicts lists the open ones)")
    if conflict.resolved_at is not None:
        raise InvalidInput(f"conflict #{conflict_id} was already resolved ({conflict.resolution})")
    if keep not in ("new", "old", "both", "merged"):
        raise InvalidInput(f"keep must be new, old, both or merged, got {keep!r}")
    if (keep == "merged") != bool(text and text.strip()):
        raise InvalidInput(
            "--text is required with --keep merged (the statement that replaces both)"
            if keep == "merged"
            else "--text goes only with --keep merged"
        )
    new, old = pair.get(conflict.record_id), pair.get(conflict.other_id)
    if new is None or old is None:
        raise NotFound(f"a record of conflict #{conflict_id} no longer exists")
    if keep != "both":
        for record in (new, old):
            if not record.current:
                state = record.archived_reason or "replaced"
                raise InvalidInput(
                    f"record {record.id} is no longer current ({state}); "
                    "restore it first or keep both"
                )
    at = format_time(engine.clock())
    merged: Record | None = None
    vectors: list[Vector] | None = None
    if keep == "merged":
        assert text is not None
        draft = prepare(
            text,
            kind=new.kind,
            scope=Scope(new.scope, new.scope_key),
            importance=max(
                (x for x in (new.importance, old.importance) if x is not None), default=None
            ),
            tags=list(dict.fromkeys([*old.tags, *new.tags])),
            agent=agent,
            at=engine.clock(),
            settings=engine.settings.write,
            user=engine.user,
            private=new.private and old.private,  # shared if either side was
        )
        merged = draft.record
        merged.supersedes = list(dict.fromkeys([*old.supersedes, old.id, *new.supersedes, new.id]))
        vectors = await engine.embed_records([merged.content])
        if vectors is not None:
            merged.embedder = engine.embeddings.identity
    resolution = {"new": "kept new", "old": "kept old", "both": "kept both"}.get(keep, "")
    async with engine.store.write() as tx:
        if keep != "both":  # as the transaction sees them: the server may have moved on
            for before in (new, old):
                now_ = await tx.get(before.id)
                if now_ is None or not now_.current or now_.content != before.content:
                    raise InvalidInput(
                        f"record {before.id} changed meanwhile; look at the conflict again"
                    )
        if keep == "new":
            new.supersedes = list(dict.fromkeys([*old.supersedes, old.id, *new.supersedes]))
            await tx.update_merged(new, at)
            await tx.replace(old, new.id)
        elif keep == "old":
            await tx.archive(new.id, set_aside_reason(conflict_id), at)
        elif merged is not None:
            await tx.insert(merged, vectors[0] if vectors else None)
            await tx.replace(old, merged.id)
            await tx.replace(new, merged.id)
            resolution = f"merged into {merged.id}"
        if not await tx.resolve_conflict(conflict_id, resolution, at):
            raise InvalidInput(f"conflict #{conflict_id} was resolved meanwhile")
    closed = await engine.store.conflict(conflict_id)
    assert closed is not None
    return closed, merged
