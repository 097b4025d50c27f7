"""Writes whose SQL every SQL backend shares: written once, with ``?`` for each
parameter, and run in the backend's own parameter style (``?`` or ``%s``).

A backend's write transaction mixes ``SharedWrites`` in; it supplies the
connection-level ``fetch`` and ``execute``, its ``_put_vectors`` and its mark.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from memory_mcp.records import Conflict, MergedEntry, Record, merged_text
from memory_mcp.storage.base import TaskState, Vector
from memory_mcp.storage.rows import SELECT, conflict_params, finish_params, record_of

# ``to_id`` took ``from_id``'s vectors: it awaits what ``from_id`` awaited (to_id, from_id).
INHERIT_DUE = (
    "UPDATE records SET vectors_due = 1 WHERE id = ? AND EXISTS "
    "(SELECT 1 FROM records o WHERE o.id = ? AND o.vectors_due = 1)"
)


class SharedWrites:
    """The write transaction's methods that read the same on every SQL backend."""

    MARK: ClassVar[str]  # how the backend's driver writes a parameter: ``?`` or ``%s``

    if TYPE_CHECKING:  # the backend's transaction has them

        async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

        async def execute(self, sql: str, params: Sequence[Any] = ()) -> int: ...

        async def _put_vectors(
            self, record_id: str, vectors: Vector, embedder: str, start: int = 0
        ) -> bool: ...

    def _sql(self, sql: str) -> str:
        """``sql`` (written with ``?``) in the backend's parameter style."""
        return sql if self.MARK == "?" else sql.replace("?", self.MARK)

    async def _fetch(self, sql: str, params: Sequence[Any]) -> list[Any]:
        return await self.fetch(self._sql(sql), params)

    async def _execute(self, sql: str, params: Sequence[Any]) -> int:
        return await self.execute(self._sql(sql), params)

    async def _write(self, sql: str, params: Sequence[Any]) -> None:
        """A statement whose result is not wanted: a backend may send it with the next."""
        await self._execute(sql, params)

    async def get(self, record_id: str) -> Record | None:
        """A record as this transaction sees it."""
        rows = await self._fetch(f"SELECT {SELECT} FROM records r WHERE r.id = ?", [record_id])
        return record_of(rows[0]) if rows else None

    async def set_vectors(self, items: Sequence[tuple[Record, Vector]], embedder: str) -> int:
        """Replace the vectors of records (re-embedding); returns how many were updated.

        A record whose text or folded texts changed since it was read (another
        process refined or unfolded it meanwhile) is left for the next round.
        """
        done = 0
        for record, vectors in items:
            done += await self._give_vectors(record, vectors, embedder)
        return done

    async def add_passages(self, record: Record, vectors: Vector, embedder: str) -> bool:
        """Give a record that holds its whole text's vector alone the vectors of its
        other passages (a store's deferred windows): the whole text is not embedded
        again, nor its row rewritten."""
        return await self._give_vectors(record, vectors, embedder, start=1)

    async def _give_vectors(
        self, record: Record, vectors: Vector, embedder: str, *, start: int = 0
    ) -> bool:
        """Write the record's passage vectors from ``start`` (``_put_vectors``) if its texts
        are still those read; it then awaits none."""
        unchanged = await self._fetch(
            "SELECT 1 FROM records WHERE id = ? AND content = ? AND merged_text = ?",
            [record.id, record.content, merged_text(record)],
        )
        if not unchanged or not await self._put_vectors(record.id, vectors, embedder, start):
            return False
        await self._execute("UPDATE records SET vectors_due = 0 WHERE id = ?", [record.id])
        return True

    async def mark_vectors_due(self, record_id: str) -> None:
        await self._write("UPDATE records SET vectors_due = 1 WHERE id = ?", [record_id])

    async def _inherit_due(self, from_id: str, to_id: str) -> None:
        """``to_id`` took ``from_id``'s vectors: what ``from_id`` still awaited, it awaits."""
        await self._execute(INHERIT_DUE, [to_id, from_id])

    async def fold_into(self, old: Record, new_id: str, entry: MergedEntry, at: str) -> None:
        """Retire ``old`` after its text moved into record ``new_id``'s ``merged_from``."""
        del entry  # the entry lives in the new record; the old row points at it
        # updated_at stays: restoring the record gives it back exactly as it was.
        await self._write(
            "UPDATE records SET archived_at = ?, archived_reason = 'folded', replaced_by = ? "
            "WHERE id = ?",
            [at, new_id, old.id],
        )

    async def replace(self, old: Record, new_id: str) -> None:
        """Make ``old`` history of ``new_id`` (superseded fact, previous goal or plan)."""
        await self._write("UPDATE records SET replaced_by = ? WHERE id = ?", [new_id, old.id])

    async def reinstate(self, old: Record, current: Record) -> bool:
        """Make ``old`` (history in ``current``'s chain) current again, and ``current`` its
        history: the value a person chose back. False if either changed meanwhile."""
        if old.archived_at is not None or old.replaced_by is None or current.replaced_by:
            return False
        changed = await self._execute(
            "UPDATE records SET replaced_by = ? WHERE id = ? AND replaced_by IS NULL "
            "AND archived_at IS NULL",
            [old.id, current.id],
        )
        if not changed:
            return False
        supersedes = [i for i in old.supersedes if i != current.id] + [current.id]
        await self._execute(
            "UPDATE records SET replaced_by = NULL, supersedes = ? WHERE id = ?",
            [json.dumps(supersedes), old.id],
        )
        return True

    async def archive(self, record_id: str, reason: str, at: str) -> bool:
        changed = await self._execute(
            "UPDATE records SET archived_at = ?, archived_reason = ? "
            "WHERE id = ? AND archived_at IS NULL",
            [at, reason, record_id],
        )
        return changed > 0

    async def import_conflict(self, conflict: Conflict) -> bool:
        """Insert an exported conflict unless the same one is already there."""
        exists = await self._fetch(
            "SELECT 1 FROM conflicts WHERE record_id = ? AND other_id = ? AND created_at = ?",
            [conflict.record_id, conflict.other_id, conflict.created_at],
        )
        if exists:
            return False
        await self._execute(
            "INSERT INTO conflicts (scope_key, record_id, other_id, reason, created_at, "
            "resolved_at, resolution) VALUES (?, ?, ?, ?, ?, ?, ?)",
            conflict_params(conflict),
        )
        return True

    async def reopen_conflict(self, conflict_id: int, record_id: str) -> bool:
        """Open again the resolved conflict ``record_id`` was archived by, now that it is
        restored, if the record on the other side is still current (the contradiction
        is back, and the inbox must show it); whether it was opened."""
        rows = await self._fetch(
            "SELECT record_id, other_id FROM conflicts WHERE id = ? AND resolved_at IS NOT NULL",
            [conflict_id],
        )
        if not rows or record_id not in rows[0]:
            return False
        other = await self.get(rows[0][1] if rows[0][0] == record_id else rows[0][0])
        if other is None or not other.current:
            return False
        changed = await self._execute(
            "UPDATE conflicts SET resolved_at = NULL, resolution = NULL WHERE id = ?",
            [conflict_id],
        )
        return changed > 0

    async def resolve_conflict(self, conflict_id: int, resolution: str, at: str) -> bool:
        changed = await self._execute(
            "UPDATE conflicts SET resolved_at = ?, resolution = ? "
            "WHERE id = ? AND resolved_at IS NULL",
            [at, resolution, conflict_id],
        )
        return changed > 0

    async def add_alias(self, alias: str, key: str, at: str, *, replace: bool = True) -> bool:
        """Read ``alias`` as ``key``; with ``replace`` False only if it has no row yet."""
        if not replace:
            return (
                await self._execute(
                    "INSERT INTO scope_aliases (alias, key, attached_at) VALUES (?, ?, ?) "
                    "ON CONFLICT (alias) DO NOTHING",
                    [alias, key, at],
                )
                > 0
            )
        return (
            await self._execute(
                "INSERT INTO scope_aliases (alias, key, attached_at) VALUES (?, ?, ?) "
                "ON CONFLICT (alias) DO UPDATE SET key = excluded.key, "
                "attached_at = excluded.attached_at, detached_at = NULL "
                "WHERE scope_aliases.key <> excluded.key OR scope_aliases.detached_at IS NOT NULL",
                [alias, key, at],
            )
            > 0
        )

    async def remove_alias(self, alias: str, at: str) -> bool:
        """Detach an attached alias (its row stays, so adoption leaves it detached)."""
        changed = await self._execute(
            "UPDATE scope_aliases SET detached_at = ? WHERE alias = ? AND detached_at IS NULL",
            [at, alias],
        )
        return changed > 0

    async def release(self, task: str, holder: str) -> None:
        """Give a task's lease back without recording a run."""
        await self._execute(
            "UPDATE maintenance SET holder = NULL, lease_until = NULL "
            "WHERE task = ? AND holder = ?",
            [task, holder],
        )

    async def finish(self, state: TaskState, holder: str) -> bool:
        """Record a run of a task and give its lease back; False if the lease was lost."""
        changed = await self._execute(
            "UPDATE maintenance SET holder = NULL, lease_until = NULL, last_started_at = ?, "
            "last_finished_at = ?, last_summary = ?, last_error = ?, failures = ?, "
            "retry_after = ?, cursor = ? WHERE task = ? AND holder = ?",
            finish_params(state, holder),
        )
        return changed > 0
