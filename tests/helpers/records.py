"""Records and vectors written straight to a store (below the write pipeline)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

import numpy as np

from memory_mcp.records import Record, format_time, utcnow
from memory_mcp.write import new_id

if TYPE_CHECKING:
    from memory_mcp.storage.sqlite import SqliteStore


def fact(
    content: str,
    *,
    at: datetime | None = None,
    scope_key: str = "/repo",
    kind: str = "fact",
    embedder: str | None = None,
    **fields: object,
) -> Record:
    """A project fact written by agent "test" at ``at`` (default: now), with ``fields`` set."""
    stamp = format_time(at or utcnow())
    made = Record(
        id=new_id("facts"),
        corpus="facts",
        kind=kind,
        scope="project",
        scope_key=scope_key,
        content=content,
        agent="test",
        created_at=stamp,
        updated_at=stamp,
        embedder=embedder,
    )
    return dataclasses.replace(made, **fields)  # type: ignore[arg-type]


def unit(*values: float) -> np.ndarray:
    """``values`` as a float32 vector of length one."""
    v = np.asarray(values, dtype=np.float32)
    return v / np.linalg.norm(v)


def hit_texts(result: object) -> set[str]:
    """The contents of a search result's hits."""
    return {hit.record.content for hit in result.hits}  # type: ignore[attr-defined]


def behind_its_back(store: SqliteStore, *statements: str | tuple[str, Sequence[object]]) -> None:
    """Run these statements (SQL, or SQL and its parameters) on another connection to the
    store's file and commit them: another program's write, or damage, as the store meets
    it. (Not stdlib ``sqlite3``: its library in the same process would drop the store's
    locks.)"""
    conn = store.driver.connect(str(store.path), busy_timeout_ms=5000)
    try:
        for statement in statements:
            sql, params = (statement, ()) if isinstance(statement, str) else statement
            conn.execute(sql, params)
        conn.commit()
    finally:
        conn.close()
