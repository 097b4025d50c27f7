"""Reads for upkeep: what maintenance, the conflicts inbox and restore ask of the store."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from memory_mcp.records import Conflict, Record
from memory_mcp.storage.base import Position, ScopeAlias, TaskState
from memory_mcp.storage.postgres.queries import Queries
from memory_mcp.storage.rows import SELECT, TASK_COLUMNS, record_of, task_of


class UpkeepReads(Queries):
    """Conflicts, archived and unused records, positions in write order, task states
    (``PgStore`` is one)."""

    async def conflicts(self, *, open_only: bool = False) -> list[Conflict]:
        return await self._conflicts("resolved_at IS NULL" if open_only else "true", [])

    async def open_conflicts_of(self, record_ids: Sequence[str]) -> list[Conflict]:
        if not record_ids:
            return []
        return await self._conflicts(
            "resolved_at IS NULL AND (record_id = ANY(%s) OR other_id = ANY(%s))",
            [list(record_ids), list(record_ids)],
        )

    async def conflict(self, conflict_id: int) -> Conflict | None:
        found = await self._conflicts("id = %s", [conflict_id])
        return found[0] if found else None

    async def _conflicts(self, where: str, params: Sequence[Any]) -> list[Conflict]:
        rows = await self.fetch(
            "SELECT id, scope_key, record_id, other_id, reason, created_at, resolved_at, "
            f"resolution FROM conflicts WHERE {where} ORDER BY id",
            params,
        )
        return [Conflict(int(row[0]), *row[1:]) for row in rows]

    async def aliases(self, key: str) -> list[ScopeAlias]:
        """The aliases of a project key, attached and detached, oldest first."""
        rows = await self.fetch(
            "SELECT alias, key, attached_at, detached_at FROM scope_aliases WHERE key = %s "
            "ORDER BY attached_at, alias",
            [key],
        )
        return [ScopeAlias(*row) for row in rows]

    async def alias_of(self, keys: Collection[str]) -> dict[str, ScopeAlias]:
        """The alias row of each of ``keys`` that has one (attached or detached)."""
        if not keys:
            return {}
        rows = await self.fetch(
            "SELECT alias, key, attached_at, detached_at FROM scope_aliases WHERE alias = ANY(%s)",
            [list(keys)],
        )
        return {str(row[0]): ScopeAlias(*row) for row in rows}

    async def conflict_between(self, a: str, b: str) -> bool:
        rows = await self.fetch(
            "SELECT 1 FROM conflicts WHERE (record_id = %s AND other_id = %s) "
            "OR (record_id = %s AND other_id = %s) LIMIT 1",
            [a, b, b, a],
        )
        return bool(rows)

    async def archived(
        self,
        scope_keys: Sequence[str] = (),
        *,
        reason: str | None = None,
        before: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Record]:
        """Archived records, most recently archived first."""
        clauses = ["r.archived_at IS NOT NULL"]
        params: list[Any] = []
        if scope_keys:
            clauses.append("r.scope_key = ANY(%s)")
            params.append(list(scope_keys))
        if reason is not None:
            clauses.append("r.archived_reason = %s")
            params.append(reason)
        if before is not None:
            clauses.append("r.archived_at < %s")
            params.append(before)
        rows = await self.fetch(
            f"SELECT {SELECT} FROM records r WHERE {' AND '.join(clauses)} "
            "ORDER BY r.archived_at DESC, r.seq DESC LIMIT %s OFFSET %s",
            [*params, limit, offset],
        )
        return [record_of(row) for row in rows]

    async def project_activity(self) -> dict[str, str]:
        """Each project scope's last activity: its newest write, access or restore."""
        rows = await self.fetch(
            "SELECT scope_key, max(greatest(created_at, coalesce(last_access_at, ''))) "
            "FROM records WHERE scope = 'project' AND corpus <> 'insights' GROUP BY scope_key"
        )
        last = {str(key): str(at) for key, at in rows}
        for key, at in await self.fetch("SELECT scope_key, last_at FROM scope_activity"):
            if str(key) in last:
                last[str(key)] = max(last[str(key)], str(at))
        return last

    async def unused_facts(self, scope_key: str, created_before: str, limit: int) -> list[Record]:
        rows = await self.fetch(
            f"SELECT {SELECT} FROM records r WHERE r.scope_key = %s AND r.corpus = 'facts' "
            "AND r.live AND r.access_count = 0 AND r.pinned = 0 AND r.created_at < %s "
            "ORDER BY r.seq LIMIT %s",
            [scope_key, created_before, limit],
        )
        return [record_of(row) for row in rows]

    async def unarchived(self, scope_key: str, limit: int) -> list[str]:
        rows = await self.fetch(
            "SELECT id FROM records WHERE scope_key = %s AND archived_at IS NULL "
            "ORDER BY seq LIMIT %s",
            [scope_key, limit],
        )
        return [str(row[0]) for row in rows]

    async def count_unarchived(self, scope_key: str) -> int:
        rows = await self.fetch(
            "SELECT count(*) FROM records WHERE scope_key = %s AND archived_at IS NULL",
            [scope_key],
        )
        return int(rows[0][0])

    async def scope_keys(self) -> list[str]:
        rows = await self.fetch(
            "SELECT DISTINCT scope_key FROM records WHERE live ORDER BY scope_key"
        )
        return [str(row[0]) for row in rows]

    async def holds(self, scope_keys: Sequence[str]) -> bool:
        rows = await self.fetch(
            "SELECT 1 FROM records WHERE scope_key = ANY(%s) LIMIT 1", [list(scope_keys)]
        )
        return bool(rows)

    async def after(
        self,
        corpora: Sequence[str],
        position: Position | None,
        limit: int,
        *,
        current_only: bool = True,
    ) -> list[tuple[Position, Record]]:
        """Records of ``corpora`` past a write position (a record's ``seq``, as text)."""
        live = "AND r.live " if current_only else ""
        rows = await self.fetch(
            f"SELECT {SELECT}, r.seq FROM records r WHERE r.seq > %s {live}"
            "AND r.corpus = ANY(%s) ORDER BY r.seq LIMIT %s",
            [int(position or 0), list(corpora), limit],
        )
        return [(str(row[-1]), record_of(row)) for row in rows]

    async def count_after(self, corpora: Sequence[str], position: Position | None) -> int:
        rows = await self.fetch(
            "SELECT count(*) FROM records WHERE seq > %s AND live AND corpus = ANY(%s)",
            [int(position or 0), list(corpora)],
        )
        return int(rows[0][0])

    async def tasks(self) -> dict[str, TaskState]:
        rows = await self.fetch(f"SELECT {TASK_COLUMNS} FROM maintenance ORDER BY task")
        return {str(row[0]): task_of(row) for row in rows}
