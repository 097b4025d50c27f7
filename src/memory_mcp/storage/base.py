"""The storage seam: what the engine needs from a database.

Every module above ``storage/`` is typed against ``Store`` and
``WriteTransaction`` and imports no backend; ``storage.open_store`` picks the
backend from ``storage.url``: ``storage/sqlite/`` (the default) or
``storage/postgres/`` (PostgreSQL + pgvector, for teams), and
``tests/storage/test_contract.py`` says what any backend must do.

Writes happen inside ``write()``, a transaction that holds the store's write
lock across processes, so that the fold decision and the write it leads to are
atomic. Nothing crosses the seam in a backend's language: the engine passes
text (not a query syntax), filters, and opaque positions (``Position``) that
only the store that handed them out reads.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from memory_mcp.ranker import RankerConfig
from memory_mcp.records import Conflict, Corpus, MergedEntry, Record

if TYPE_CHECKING:  # numpy loads only where vectors are made or scored
    import numpy as np
    import numpy.typing as npt

Vector: TypeAlias = "npt.NDArray[np.float32]"
# Where a walk over the records in write order stopped: made by the store, only read by it.
Position: TypeAlias = str

# Dense search by clusters (IVF) on both backends: the vectors of a scope (SQLite) or
# of a space (Postgres's ivfflat index) fall into ``ivf_lists(rows)`` clusters, and a
# search scores exactly the rows of the ``IVF_PROBES`` clusters nearest the query:
# 0.99 of the exact top 50 records at 108k and 436k rows on SQLite, 0.99 at 141k
# rows on Postgres (``bench perf`` prints the recall it measures). SQLite scores more
# clusters where they are small (``sqlite.dense.probed_clusters``).
IVF_PROBES = 48
# A new memory's neighbours for the write decision (``nearest_with_scores``) come from
# fewer clusters: what can fold into it, supersede it or conflict with it is close
# (cosine 0.70 or more, ``fold.dense_subject``), and lies in the clusters nearest it.
# The decisions of 600 stores at 50,000 memories and 600 at 200,000 were the same
# from 24 clusters as from 48, and those of 1,185 facts at 10,000, 1,748 at 50,000
# and 1,177 at 200,000 from 12 as from 24 (two of the 10,000's had a close neighbour
# fewer among their six: not one that decided). The rank of SQLite's neighbour read
# took 0.52-0.65 ms instead of 0.73-1.0 at 50,000 memories, 0.91 instead of 1.46-1.67
# at 10,000, 0.80-1.10 instead of 1.30-1.60 at 200,000; a store's p50 0.44 ms less at
# 10,000 and 50,000.
NEIGHBOUR_PROBES = 12
_LISTS_PER_ROOT = 1.55  # clusters per square root of the rows (512 at 108k rows)


def ivf_lists(rows: int) -> int:
    """How many clusters ``rows`` vectors fall into (at least one, at most ``rows``)."""
    return max(1, min(rows, round(_LISTS_PER_ROOT * math.sqrt(rows))))


@dataclass(frozen=True)
class Filters:
    """What a search may return; applied before the limit."""

    scope_keys: tuple[str, ...]
    corpora: tuple[Corpus, ...]
    kinds: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()  # any of them
    agents: tuple[str, ...] = ()  # written by any of these agents
    since: str | None = None  # created_at >= since
    until: str | None = None  # created_at < until
    through: str | None = None  # created_at <= through (a page's cursor)
    exclude_ids: tuple[str, ...] = ()
    # Only what this user may read (``records.visible_to``); None: every record.
    viewer: str | None = None
    private: bool | None = None  # only private records (True), or only shared ones (False)

    @property
    def narrowing(self) -> bool:
        """Whether they ask more of a record than its scope, corpus and reader: a kind, a
        tag, an agent, a time, an id left out, private records only. What the reader may
        see, or shared records only, drops few records (the private ones of others)."""
        lists = (self.kinds, self.tags, self.agents, self.exclude_ids)
        return any(lists) or bool(self.since or self.until or self.through or self.private)

    @property
    def selective(self) -> bool:
        """Whether they ask more of a record than its scope and corpus (and liveness)."""
        return self.narrowing or self.viewer is not None or self.private is not None


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
class CandidateReads:
    """What a search reads of its candidates in one trip (``candidate_reads``)."""

    near: list[Scored]  # the nearest records, best first
    scores: dict[str, float]  # the asked records' cosines
    around: dict[str, Around] | None = None  # None: not read
    conflicts: list[Conflict] | None = None  # None: not read


@dataclass
class StoreStats:
    """Counts for ``status``."""

    records: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (corpus, scope, state)
    embedders: dict[str, int] = field(default_factory=dict)  # embedder name -> current rows
    vector_indexes: list[tuple[str, str, int, int]] = field(default_factory=list)
    open_conflicts: int = 0
    database_bytes: int = 0
    cache_bytes: int = 0  # kept beside the database, safe to delete (SQLite: kept vectors)


@dataclass(frozen=True)
class RecordCount:
    """Current records of one corpus, agent and month (``YYYY-MM``), and how many of
    them have vectors."""

    corpus: str
    agent: str
    month: str
    records: int
    embedded: int


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

    @property
    def outcome(self) -> str:
        """What its last run did, in words (``summary_words`` of its summary)."""
        return summary_words(self.last_summary)


def summary_words(summary: dict[str, Any]) -> str:
    """A task run's summary (``TaskReport.to_json``) in words: "3 folded; 12 left",
    "skipped: why", "failed: why" or "nothing to do"."""
    if summary.get("skipped"):
        return f"skipped: {summary['skipped']}"
    if summary.get("error"):
        return f"failed: {summary['error']}"
    counts = summary.get("counts") or {}
    done = ", ".join(f"{n} {what}" for what, n in counts.items() if n) or "nothing to do"
    return done + (f"; {summary['pending']} left" if summary.get("pending") else "")


@dataclass(frozen=True)
class ScopeAlias:
    """A scope key read as a project's key: one it had before its identity, or one an
    operator attached. Detached, it is kept (so it is not attached again by itself)."""

    alias: str
    key: str
    attached_at: str
    detached_at: str | None = None

    @property
    def attached(self) -> bool:
        return self.detached_at is None


@dataclass
class Check:
    """One of ``doctor``'s checks: what it found, and what a repair did."""

    name: str
    problems: list[str] = field(default_factory=list)
    repaired: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    async def tally(
        self,
        fetch: Callable[[str], Awaitable[list[Any]]],
        queries: Sequence[tuple[str, str]],
    ) -> None:
        """Run each (counting query, message): a count above zero is a problem, said by
        the message with the count in its ``{}``."""
        for sql, message in queries:
            count = int((await fetch(sql))[0][0])
            if count:
                self.problems.append(message.format(count))

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "ok": self.ok,
            "problems": self.problems,
            "repaired": self.repaired,
        }


@dataclass
class Diagnosis:
    """What ``doctor`` found: its checks, in order."""

    checks: list[Check]

    @property
    def healthy(self) -> bool:
        """Nothing wrong, or everything wrong was repaired."""
        return all(c.ok or c.repaired for c in self.checks)

    def to_json(self) -> dict[str, object]:
        return {"healthy": self.healthy, "checks": [c.to_json() for c in self.checks]}


# Search branches -----------------------------------------------------------------------


class Neighbours(Protocol):
    """The reads that find a record's nearest records (the write path and the sweep)."""

    async def nearest(
        self, vector: Vector, embedder: str, filters: Filters, k: int, *, exact: bool = False
    ) -> list[Scored]:
        """Current records nearest ``vector`` (best passage), filters applied before ``k``.

        ``exact``: score every vector instead of asking the backend's approximate
        index (a benchmark's reference for that index's recall).
        """
        ...

    async def lexical(
        self, text: str, filters: Filters, k: int, *, rare_words: bool = False
    ) -> list[Scored]:
        """Current records matching any word of ``text`` (plain text: the backend builds
        its own query), best first; ``rare_words`` matches on the text's rarest words."""
        ...

    async def dense_scores(
        self, vector: Vector, embedder: str, record_ids: Sequence[str]
    ) -> dict[str, float]:
        """The best passage cosine of each of these records with ``vector``."""
        ...

    async def nearest_with_scores(
        self,
        vector: Vector,
        embedder: str,
        filters: Filters,
        k: int,
        record_ids: Sequence[str],
        *,
        probes: int | None = None,
        ahead: object | None = None,
    ) -> tuple[list[Scored], dict[str, float]]:
        """``nearest`` and ``dense_scores`` of ``record_ids`` at once: a new memory's
        neighbours by vector and its cosine with those its rarest words found, or a
        query's nearest records and its cosine with the lexical branch's. A clustered
        scope is searched in ``probes`` clusters where the backend's index takes a
        number per read; unless given, fewer than ``nearest``'s (``IVF_PROBES``): what
        a write decision needs (``NEIGHBOUR_PROBES``). ``ahead``: what ``rank_ahead``
        returned for the same vector, filters and probes, used if nothing was written
        since."""
        ...


class SearchBranches(Neighbours, Protocol):
    """What a search reads besides the two branches' candidates."""

    async def candidate_reads(
        self,
        vector: Vector,
        embedder: str,
        filters: Filters,
        k: int,
        record_ids: Sequence[str],
        *,
        within_seconds: float | None = None,
        conflicts: bool = False,
        probes: int | None = None,
        ahead: object | None = None,
    ) -> CandidateReads:
        """``nearest_with_scores``, with what a search reads next of the records it found
        and of ``record_ids``, in the same trip where the backend can (None where it
        does not: the caller asks): unless ``within_seconds`` is None, the
        ``in_conversation`` of those with vectors; if ``conflicts``, the open conflicts
        any of them is in (``open_conflicts_of``)."""
        ...

    async def in_conversation(
        self, record_ids: Sequence[str], within_seconds: float, embedder: str
    ) -> dict[str, Around]:
        """Each record's whole-text vector, with its neighbours in time."""
        ...

    async def rank_ahead(
        self, vector: Vector, embedder: str, filters: Filters, probes: int
    ) -> object | None:
        """Rank the vectors ``nearest_with_scores`` would read for ``filters`` now, off
        the connection that the lexical branch is reading on, for that call to take
        (``ahead``); None: the backend ranks inside its reads, there is nothing to do
        ahead of them."""
        ...

    async def vectors_of(self, record_id: str, embedder: str) -> Vector | None:
        """A current record's passage vectors from ``embedder`` (whole text first)."""
        ...

    async def load_vectors(
        self, embedder: str, scope_keys: Collection[str], *, settle: float = 0.0
    ) -> bool:
        """Warm whatever the backend keeps to answer ``nearest`` for these scopes.

        ``settle``: wait up to as many seconds for any index the backend builds
        in the background for them; False if one is still being built then.
        """
        ...

    def forget_word_counts(self) -> None:
        """Drop any cached word statistics (``rare_words``)."""
        ...

    async def prune_caches(self) -> int:
        """Remove what the backend keeps beside the store for records or vectors it no
        longer holds (maintenance's ``purge``); the bytes freed."""
        ...

    async def analyze(self) -> None:
        """After a bulk write (an import): bring the query planner's statistics up to
        date, where the backend plans from them (Postgres; SQLite's queries are
        planned by hand)."""
        ...

    async def write_mark(self) -> object | None:
        """A mark of what has been committed, taken before reads that a write
        transaction may use if nothing was committed since (``unchanged_since``);
        None: the backend cannot tell, and such reads are made again under the lock."""
        ...

    async def record_access(self, accesses: Mapping[str, tuple[int, str]]) -> None:
        """Count returned hits as accesses (ranking and staleness read these): each
        record's new accesses, by id, and the time of the last (``last_access_at``
        never moves back)."""
        ...


# Record reads --------------------------------------------------------------------------


class RecordReads(Protocol):
    """Records by id, by filters, by prior and in write order."""

    async def get(self, record_id: str) -> Record | None: ...

    async def get_many(self, record_ids: Sequence[str]) -> list[Record]:
        """The records that exist of these ids, in the order asked."""
        ...

    async def current(self, filters: Filters, limit: int, offset: int = 0) -> list[Record]:
        """Current records matching ``filters``, newest first (after the first ``offset``)."""
        ...

    async def record_counts(self, filters: Filters) -> list[RecordCount]:
        """How many current records ``filters`` let through, by corpus, agent and month,
        and how many of them have vectors (``rows.record_counts``)."""
        ...

    async def find_by_hash(self, content_hash: str, filters: Filters) -> list[Record]:
        """Current records matching ``filters`` whose text has this ``content_hash``, newest
        first."""
        ...

    async def top_by_prior(
        self, filters: Filters, ranking: RankerConfig, now: datetime, limit: int
    ) -> list[tuple[Record, float]]:
        """The ``limit`` current records with the highest ``ranker.prior``, with it,
        highest first (ties by id). Each backend computes the prior its own way;
        the contract suite holds it to ``ranker.prior``."""
        ...

    def iter_records(self, *, batch: int = 500) -> AsyncIterator[Record]:
        """Every record, archived and history included, in write order."""
        ...

    async def after(
        self,
        corpora: Sequence[str],
        position: Position | None,
        limit: int,
        *,
        current_only: bool = True,
    ) -> list[tuple[Position, Record]]:
        """Records of ``corpora`` past ``position`` (None: from the start), in write
        order, each with its own position: current ones, or with history and archived."""
        ...

    async def count_after(self, corpora: Sequence[str], position: Position | None) -> int:
        """How many current records of ``corpora`` are past ``position``."""
        ...

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
        ...

    async def scope_keys(self) -> list[str]:
        """Every scope key that has current records."""
        ...

    async def holds(self, scope_keys: Sequence[str]) -> bool:
        """Whether any record, current or not, is stored under one of these keys (one
        index probe each, where ``scope_keys`` reads every record)."""
        ...

    async def project_activity(self) -> dict[str, str]:
        """Each project scope's last activity: its newest write, access or restore."""
        ...

    async def unused_facts(self, scope_key: str, created_before: str, limit: int) -> list[Record]:
        """Current facts of a scope never returned by a search, older than a time, not pinned."""
        ...

    async def unarchived(self, scope_key: str, limit: int) -> list[str]:
        """Ids of a scope's records not archived (current ones and history)."""
        ...

    async def count_unarchived(self, scope_key: str) -> int: ...


# Scope aliases -------------------------------------------------------------------------


class ScopeAliases(Protocol):
    """Which scope keys are read as another project's key (``identity``, ``Engine.project``)."""

    async def aliases(self, key: str) -> list[ScopeAlias]:
        """The aliases of a project key, attached and detached, oldest first."""
        ...

    async def alias_of(self, keys: Collection[str]) -> dict[str, ScopeAlias]:
        """The alias row of each of ``keys`` that has one (attached or detached)."""
        ...


# Embedding queue -----------------------------------------------------------------------


class EmbeddingQueue(Protocol):
    """Records awaiting vectors from the current embedder."""

    async def needing_embedding(self, embedder: str, limit: int) -> list[Record]:
        """Current records whose vectors are missing, from another embedder, or due (only
        the whole text's so far: ``WriteTransaction.mark_vectors_due``), oldest first."""
        ...

    async def count_needing_embedding(
        self, embedder: str | None, *, incomplete: bool = True
    ) -> int:
        """How many ``needing_embedding`` holds; ``incomplete`` False leaves out the records
        whose whole text has its vector (a search finds them densely already)."""
        ...

    async def dense_embedders(self) -> dict[str, int]:
        """Embedders that have vectors in this store, with their record counts."""
        ...

    @property
    def vectors_to_sweep(self) -> bool:
        """Whether the vector rows of records that stopped being current may wait to be
        deleted (``sweep_vectors``): searches skip them already."""
        ...

    async def sweep_vectors(self, most: int) -> int:
        """Delete about ``most`` of the waiting vector rows (a record's at least), in a
        write transaction of their own: how many records' (0: none waited)."""
        ...


# Conflicts -----------------------------------------------------------------------------


class ConflictReads(Protocol):
    """The operator's inbox of contradicting records."""

    async def conflicts(self, *, open_only: bool = False) -> list[Conflict]: ...

    async def open_conflicts_of(self, record_ids: Sequence[str]) -> list[Conflict]: ...

    async def conflict(self, conflict_id: int) -> Conflict | None: ...

    async def conflict_between(self, a: str, b: str) -> bool:
        """Whether two records were ever flagged as a conflict (open or resolved)."""
        ...


# Leases --------------------------------------------------------------------------------


class Leases(Protocol):
    """Maintenance tasks' state, and the one clock their leases are measured by."""

    async def tasks(self) -> dict[str, TaskState]: ...

    async def now(self) -> datetime:
        """The store's time: every process measures leases by it, so that a machine
        whose clock is off cannot take a lease that is not free."""
        ...


# The transaction -----------------------------------------------------------------------


class WriteTransaction(Neighbours, Protocol):
    """Operations available inside one write transaction."""

    async def unchanged_since(self, mark: object | None) -> bool:
        """Whether nothing has been committed since ``write_mark`` gave ``mark``, so that
        what the store's reads saw then is what this transaction sees (False: not
        known)."""
        ...

    async def find_by_hash(self, content_hash: str, filters: Filters) -> list[Record]: ...

    async def current(self, filters: Filters, limit: int) -> list[Record]: ...

    async def get(self, record_id: str) -> Record | None: ...

    async def insert(
        self, record: Record, vectors: Vector | None, *, vectors_due: bool = False
    ) -> None:
        """Insert a new record with its passage vectors; ``vectors_due``: they are its
        whole text's only, the rest of its passages are due (``mark_vectors_due``)."""
        ...

    async def insert_raw(self, record: Record) -> bool: ...

    async def fold_into(self, old: Record, new_id: str, entry: MergedEntry, at: str) -> None: ...

    async def carry_vectors(self, from_id: str, to_id: str, embedder: str) -> int: ...

    async def replace(self, old: Record, new_id: str) -> None: ...

    async def reinstate(self, old: Record, current: Record) -> bool: ...

    async def archive(self, record_id: str, reason: str, at: str) -> bool: ...

    async def update_merged(self, record: Record, at: str) -> bool: ...

    async def set_content(self, record: Record, at: str) -> bool: ...

    async def rewrite_texts(self, record: Record) -> bool: ...

    async def set_vectors(self, items: Sequence[tuple[Record, Vector]], embedder: str) -> int: ...

    async def add_passages(self, record: Record, vectors: Vector, embedder: str) -> bool:
        """Give a record that holds its whole text's vector alone (from ``embedder``) the
        vectors of its other passages (``vectors``, in order): a store's deferred windows.
        False, writing nothing, if it holds anything else, or its texts changed since
        ``record`` was read."""
        ...

    async def mark_vectors_due(self, record_id: str) -> None:
        """The record holds its whole text's vector only: the rest of its passages are due
        (``needing_embedding`` lists it until ``set_vectors`` gives it all of them)."""
        ...

    async def restore(self, record_id: str, at: str) -> Record | None: ...

    async def reopen_conflict(self, conflict_id: int, record_id: str) -> bool: ...

    async def purge(self, record_ids: Sequence[str], archived_before: str, at: str) -> int: ...

    # conflicts
    async def add_conflict(
        self, scope_key: str, record_id: str, other_id: str, reason: str, at: str
    ) -> int: ...

    async def import_conflict(self, conflict: Conflict) -> bool: ...

    async def resolve_conflict(self, conflict_id: int, resolution: str, at: str) -> bool: ...

    # scope aliases
    async def add_alias(self, alias: str, key: str, at: str, *, replace: bool = True) -> bool:
        """Read ``alias`` as ``key`` from now on (attached anew if it was detached or
        named another key); with ``replace`` False, only if ``alias`` has no row at all.
        Whether anything changed."""
        ...

    async def remove_alias(self, alias: str, at: str) -> bool:
        """Detach an attached alias; its row stays, detached. Whether it was attached."""
        ...

    # leases
    async def claim(
        self, task: str, holder: str, now: str, until: str, cursor: dict[str, Any] | None = None
    ) -> bool:
        """Take, keep or renew ``task``'s lease until ``until``; False if another holds it."""
        ...

    async def release(self, task: str, holder: str) -> None: ...

    async def finish(self, state: TaskState, holder: str) -> bool: ...


# Admin and the whole store -------------------------------------------------------------


class Admin(Protocol):
    """What the store is, where, and keeping it healthy."""

    @property
    def backend(self) -> str:
        """The backend's name (``sqlite``)."""
        ...

    @property
    def location(self) -> str:
        """Where the data is (a file, or a URL without credentials)."""
        ...

    @property
    def details(self) -> str:
        """How the backend runs (driver, extensions), for ``status``."""
        ...

    @property
    def user(self) -> str:
        """Whom this store acts for when no request says otherwise: the database role it
        connects as, or the local login of a file on this machine (written on each record)."""
        ...

    @property
    def vectors_available(self) -> bool: ...

    def write(self) -> AbstractAsyncContextManager[WriteTransaction]: ...

    async def stats(self) -> StoreStats: ...

    async def doctor(self, *, repair: bool = False) -> Diagnosis:
        """Check the indexes against the records; with ``repair``, rebuild what disagrees."""
        ...

    async def backup(self, target: Path, *, force: bool = False) -> Path:
        """A consistent copy while writers go on (``target`` may be a folder); its path."""
        ...

    def scratch_copy(self) -> AbstractAsyncContextManager[Store]:
        """A copy of the store of this moment, opened, thrown away on exit (a dry run)."""
        ...

    async def prepare_team(self, embedder: str | None, dim: int | None) -> list[str]:
        """Make the store ready for members with roles of their own (``add_member``),
        and ``embedder``'s vector index; what was done. Only a shared database can.

        Raises:
            InvalidInput: this backend has no users of its own (a SQLite file).
            StorageError: this role may not (it is not the owner or an administrator).
        """
        ...

    async def add_member(self, name: str, password: str | None) -> str:
        """Give the user ``name`` a role of their own: "created", or "joined" (it existed)."""
        ...

    async def close(self) -> None: ...


class Store(
    RecordReads,
    SearchBranches,
    ScopeAliases,
    EmbeddingQueue,
    ConflictReads,
    Leases,
    Admin,
    Protocol,
):
    """A memory store: everything the engine asks of a database."""
