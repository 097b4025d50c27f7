"""Reads for upkeep: what maintenance, the conflicts inbox and restore ask of the store."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from memory_mcp.records import Conflict, Record
from memory_mcp.storage.base import Position, ScopeAlias, TaskState
from memory_mcp.storage.rows import TASK_COLUMNS, task_of
from memory_mcp.storage.sqlite.sql import (
    SELECT,
    conflicts_sql,
    marks,
    open_conflicts_where,
    record_of,
    seq_of,
)

if TYPE_CHECKING:
    from memory_mcp.storage.sqlite.queries import Queries


class UpkeepReads:
    """Conflicts, archived and unused records, positions in write order, task states
    (``SqliteStore`` is one)."""

    reads: Queries

    async def conflicts(self, *, open_only: bool = False) -> list[Conflict]:
        """Conflicts, oldest first (only unresolved ones if asked)."""
        where = "resolved_at IS NULL" if open_only else "1"
        return await self._conflicts(where, [])

    async def open_conflicts_of(self, record_ids: Sequence[str]) -> list[Conflict]:
        """The open conflicts that any of ``record_ids`` is part of, oldest first."""
        if not record_ids:
            return []
        return await self._conflicts(*open_conflicts_where(record_ids))

    async def conflict(self, conflict_id: int) -> Conflict | None:
        found = await self._conflicts("id = ?", [conflict_id])
        return found[0] if found else None

    async def _conflicts(self, where: str, params: Sequence[Any]) -> list[Conflict]:
        rows = await self.reads.fetch(conflicts_sql(where), params)
        return [Conflict(*row) for row in rows]

    async def archived(
        self,
        scope_keys: Sequence[str] = (),
        *,
        reason: str | None = None,
        before: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Record]:
        """Archived records, most recently archived first.

        Args:
            scope_keys: only these scopes (all when empty).
            reason: only those archived for this reason.
            before: only those archived before this time.
            offset: after the first so many (a page).
        """
        clauses: list[str] = ["r.archived_at IS NOT NULL"]
        params: list[Any] = []
        if scope_keys:
            clauses.append(f"r.scope_key IN ({marks(scope_keys)})")
            params.extend(scope_keys)
        if reason is not None:
            clauses.append("r.archived_reason = ?")
            params.append(reason)
        if before is not None:
            clauses.append("r.archived_at < ?")
            params.append(before)
        rows = await self.reads.fetch(
            f"SELECT {SELECT} FROM records r WHERE {' AND '.join(clauses)} "
            "ORDER BY r.archived_at DESC, r.seq DESC LIMIT ? OFFSET ?",
            [*params, limit, offset],
        )
        return [record_of(row) for row in rows]

    async def project_activity(self) -> dict[str, str]:
        """Each project scope's last activity: its newest write, access or restore.

        Maintenance's own work does not count: insights are left out, and
        archiving changes neither time.
        """
        rows = await self.reads.fetch(
            "SELECT scope_key, max(max(created_at, coalesce(last_access_at, ''))) FROM records "
            "WHERE scope = 'project' AND corpus != 'insights' GROUP BY scope_key"
        )
        last = {str(key): str(at) for key, at in rows}
        for key, at in await self.reads.fetch("SELECT scope_key, last_at FROM scope_activity"):
            if str(key) in last:
                last[str(key)] = max(last[str(key)], str(at))
        return last

    async def unused_facts(self, scope_key: str, created_before: str, limit: int) -> list[Record]:
        """Current facts of a scope never returned by a search, older than a time, not pinned."""
        rows = await self.reads.fetch(
            f"SELECT {SELECT} FROM records r WHERE r.scope_key = ? AND r.corpus = 'facts' "
            "AND r.live = 1 AND r.access_count = 0 AND r.pinned = 0 AND r.created_at < ? "
            "ORDER BY r.seq LIMIT ?",
            [scope_key, created_before, limit],
        )
        return [record_of(row) for row in rows]

    async def unarchived(self, scope_key: str, limit: int) -> list[str]:
        """Ids of a scope's records not archived (current ones and history)."""
        rows = await self.reads.fetch(
            "SELECT id FROM records WHERE scope_key = ? AND archived_at IS NULL "
            "ORDER BY seq LIMIT ?",
            [scope_key, limit],
        )
        return [str(row[0]) for row in rows]

    async def count_unarchived(self, scope_key: str) -> int:
        rows = await self.reads.fetch(
            "SELECT count(*) FROM records WHERE scope_key = ? AND archived_at IS NULL", [scope_key]
        )
        return int(rows[0][0])

    async def aliases(self, key: str) -> list[ScopeAlias]:
        """The aliases of a project key, attached and detached, oldest first."""
        rows = await self.reads.fetch(
            "SELECT alias, key, attached_at, detached_at FROM scope_aliases WHERE key = ? "
            "ORDER BY attached_at, alias",
            [key],
        )
        return [ScopeAlias(*row) for row in rows]

    async def alias_of(self, keys: Collection[str]) -> dict[str, ScopeAlias]:
        """The alias row of each of ``keys`` that has one (attached or detached)."""
        if not keys:
            return {}
        rows = await self.reads.fetch(
            "SELECT alias, key, attached_at, detached_at FROM scope_aliases "
            f"WHERE alias IN ({marks(keys)})",
            list(keys),
        )
        return {str(row[0]): ScopeAlias(*row) for row in rows}

    async def scope_keys(self) -> list[str]:
        """Every scope key that has current records."""
        rows = await self.reads.fetch(
            "SELECT DISTINCT scope_key FROM records WHERE live = 1 ORDER BY scope_key"
        )
        return [str(row[0]) for row in rows]

    async def holds(self, scope_keys: Sequence[str]) -> bool:
        for key in scope_keys:
            if await self.reads.fetch("SELECT 1 FROM records WHERE scope_key = ? LIMIT 1", [key]):
                return True
        return False

    async def after(
        self,
        corpora: Sequence[str],
        position: Position | None,
        limit: int,
        *,
        current_only: bool = True,
    ) -> list[tuple[Position, Record]]:
        """Records of ``corpora`` past a write position, of every scope, in write order:
        the current ones, or (``current_only`` False) history and archived ones too.
        A position is a record's ``seq``, as text."""
        live = "AND r.live = 1 " if current_only else ""
        rows = await self.reads.fetch(
            f"SELECT {SELECT}, r.seq FROM records r WHERE r.seq > ? {live}"
            f"AND r.corpus IN ({marks(corpora)}) ORDER BY r.seq LIMIT ?",
            [seq_of(position), *corpora, limit],
        )
        return [(str(row[-1]), record_of(row)) for row in rows]

    async def count_after(self, corpora: Sequence[str], position: Position | None) -> int:
        rows = await self.reads.fetch(
            f"SELECT count(*) FROM records WHERE seq > ? AND live = 1 "
            f"AND corpus IN ({marks(corpora)})",
            [seq_of(position), *corpora],
        )
        return int(rows[0][0])

    async def conflict_between(self, a: str, b: str) -> bool:
        """Whether two records were ever flagged as a conflict (open or resolved)."""
        rows = await self.reads.fetch(
            "SELECT 1 FROM conflicts WHERE (record_id = ? AND other_id = ?) "
            "OR (record_id = ? AND other_id = ?) LIMIT 1",
            [a, b, b, a],
        )
        return bool(rows)

    async def tasks(self) -> dict[str, TaskState]:
        """Every maintenance task's state, by name."""
        rows = await self.reads.fetch(f"SELECT {TASK_COLUMNS} FROM maintenance ORDER BY task")
        return {str(row[0]): task_of(row) for row in rows}
