"""The storage seam: what the engine needs from a database.

``SqliteStore`` is the implementation; a Postgres + pgvector backend for teams
is planned behind the same two protocols. Writes happen inside ``write()``, a
transaction that holds the store's write lock across processes, so that the
fold decision and the write it leads to are atomic.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from memory_mcp.records import Corpus, MergedEntry, Record

if TYPE_CHECKING:  # numpy loads only where vectors are made or scored
    import numpy as np
    import numpy.typing as npt

Vector: TypeAlias = "npt.NDArray[np.float32]"


@dataclass(frozen=True)
class Filters:
    """What a search may return; applied before the limit."""

    scope_keys: tuple[str, ...]
    corpora: tuple[Corpus, ...]
    kinds: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()  # any of them
    since: str | None = None  # created_at >= since
    until: str | None = None  # created_at < until
    exclude_ids: tuple[str, ...] = ()


@dataclass
class Scored:
    """A record with the raw score a search branch gave it."""

    record: Record
    score: float  # lexical: BM25 (higher is better); dense: cosine similarity


@dataclass
class Around:
    """A record's whole-text vector, and those of its neighbours in time, by id."""

    vector: Vector
    neighbours: dict[str, Vector]


@dataclass
class StoreStats:
    """Counts for ``status``."""

    records: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (corpus, scope, state)
    embedders: dict[str, int] = field(default_factory=dict)  # embedder name -> current rows
    vector_indexes: list[tuple[str, str, int, int]] = field(default_factory=list)
    open_conflicts: int = 0
    database_bytes: int = 0


@dataclass
class TaskState:
    """One maintenance task's row: its lease, last run, back-off and cursor."""

    task: str
    holder: str | None = None
    lease_until: str | None = None
    last_started_at: str | None = None
    last_finished_at: str | None = None
    last_summary: dict[str, Any] = field(default_factory=dict)
    last_error: str | None = None
    failures: int = 0
    retry_after: str | None = None
    cursor: dict[str, Any] = field(default_factory=dict)


class Neighbours(Protocol):
    """The reads that find a record's nearest records (the write path and the sweep)."""

    async def nearest(
        self, vector: Vector, embedder: str, filters: Filters, k: int
    ) -> list[Scored]: ...

    async def lexical(
        self, text: str, filters: Filters, k: int, *, rare_words: bool = False
    ) -> list[Scored]: ...

    async def dense_scores(
        self, vector: Vector, embedder: str, record_ids: Sequence[str]
    ) -> dict[str, float]: ...


class WriteTransaction(Neighbours, Protocol):
    """Operations available inside one write transaction."""

    async def find_by_hash(self, content_hash: str, filters: Filters) -> list[Record]: ...

    async def current(self, filters: Filters, limit: int) -> list[Record]: ...

    async def insert(self, record: Record, vectors: Vector | None) -> None: ...

    async def fold_into(self, old: Record, new_id: str, entry: MergedEntry, at: str) -> None: ...

    async def carry_vectors(self, from_id: str, to_id: str, embedder: str) -> int: ...

    async def replace(self, old: Record, new_id: str) -> None: ...

    async def archive(self, record_id: str, reason: str, at: str) -> bool: ...

    async def add_conflict(
        self, scope_key: str, record_id: str, other_id: str, reason: str, at: str
    ) -> int: ...

    async def insert_raw(self, record: Record) -> bool: ...

    async def set_vectors(self, items: Sequence[tuple[Record, Vector]], embedder: str) -> int: ...

    async def get(self, record_id: str) -> Record | None: ...

    async def update_merged(self, record: Record, at: str) -> bool: ...

    async def restore(self, record_id: str, at: str) -> Record | None: ...

    async def purge(self, record_ids: Sequence[str], archived_before: str, at: str) -> int: ...

    async def resolve_conflict(self, conflict_id: int, resolution: str, at: str) -> bool: ...


class Store(Protocol):
    """A memory store."""

    @property
    def description(self) -> str: ...

    @property
    def vectors_available(self) -> bool: ...

    def write(self) -> AbstractAsyncContextManager[WriteTransaction]: ...

    async def lexical(
        self, text: str, filters: Filters, k: int, *, rare_words: bool = False
    ) -> list[Scored]: ...

    async def nearest(
        self, vector: Vector, embedder: str, filters: Filters, k: int
    ) -> list[Scored]: ...

    async def get(self, record_id: str) -> Record | None: ...

    async def get_many(self, record_ids: Sequence[str]) -> list[Record]: ...

    async def record_access(self, record_ids: Sequence[str], at: str) -> None: ...

    async def needing_embedding(self, embedder: str, limit: int) -> list[Record]: ...

    async def dense_embedders(self) -> dict[str, int]: ...

    def iter_records(self, *, batch: int = 500) -> AsyncIterator[Record]: ...

    async def stats(self) -> StoreStats: ...

    async def close(self) -> None: ...
