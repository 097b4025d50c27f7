"""What a person curating the memory reads: the projects at a glance, a project's
records page by page, a record's history. The viewer (``memory-mcp ui``) shows them.

Everything here reads as the engine's current user (``Engine.acting_as``): a
record another user keeps personal is neither counted nor listed nor shown.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from memory_mcp.brief import Brief, build_brief
from memory_mcp.conflicts import open_conflicts
from memory_mcp.embedders.runtime import EmbedderStatus
from memory_mcp.engine import Engine
from memory_mcp.errors import InvalidInput, NotFound
from memory_mcp.fusion import shown_record
from memory_mcp.records import CORPORA, CORPUS_OF_KIND, Conflict, Record
from memory_mcp.scope import GLOBAL_KEY
from memory_mcp.search import time_bound, time_window
from memory_mcp.secret_scan import redact_text
from memory_mcp.storage.base import Filters, TaskState

# How many older and newer values of a record ``history`` follows, at most.
CHAIN_MOST = 50


@dataclass
class ProjectSummary:
    """One scope of the store: what it holds, who wrote it, when, and its open conflicts."""

    key: str  # GLOBAL_KEY for the global scope
    records: int = 0
    embedded: int = 0
    by_corpus: dict[str, int] = field(default_factory=dict)
    by_agent: dict[str, int] = field(default_factory=dict)
    by_month: dict[str, int] = field(default_factory=dict)  # YYYY-MM, oldest first
    open_conflicts: int = 0
    aliases: list[str] = field(default_factory=list)  # attached earlier keys

    @property
    def is_global(self) -> bool:
        return self.key == GLOBAL_KEY


@dataclass
class History:
    """A record's past and future: the values it replaced and what replaced it."""

    older: list[Record]  # what it supersedes, newest first
    newer: list[Record]  # what replaced it, in order (empty: it is current)
    conflicts: list[Conflict]  # open conflicts it is in


@dataclass
class Upkeep:
    """What the maintenance page shows: cheap to read at any size (``status`` also
    counts every record and vector, half a second at 200,000 memories)."""

    backend: str
    database: str
    embedder: EmbedderStatus
    awaiting_embedding: int
    open_conflicts: int
    tasks: dict[str, TaskState]


async def upkeep(engine: Engine) -> Upkeep:
    """The maintenance page's figures; every task, those that never ran too."""
    from memory_mcp.maintenance.runner import TASKS

    store = engine.store
    ran = await store.tasks()
    return Upkeep(
        backend=store.backend,
        database=store.location,
        embedder=engine.embeddings.status(),
        awaiting_embedding=await store.count_needing_embedding(engine.embeddings.identity),
        open_conflicts=len(await open_conflicts(engine)),
        tasks={name: ran.get(name, TaskState(name)) for name in dict.fromkeys([*TASKS, *ran])},
    )


async def project_keys(engine: Engine, key: str) -> tuple[str, ...]:
    """A scope's key with the earlier keys attached to it (what its searches read).

    Raises:
        NotFound: nothing was ever stored under the key or a key attached to it.
    """
    if key == GLOBAL_KEY:
        return (GLOBAL_KEY,)
    attached = [a.alias for a in await engine.store.aliases(key) if a.detached_at is None]
    keys = (key, *attached)
    if not await engine.store.holds(keys):
        raise NotFound(f"no project {key!r} in this store (the projects page lists them)")
    return keys


async def conflicts_of(engine: Engine, record_ids: Sequence[str]) -> dict[str, int]:
    """The open conflict each of these records is in (its number), by record id."""
    found: dict[str, int] = {}
    for conflict in await engine.store.open_conflicts_of(list(record_ids)):
        for record_id in (conflict.record_id, conflict.other_id):
            found.setdefault(record_id, conflict.id)
    return found


async def projects(engine: Engine) -> list[ProjectSummary]:
    """Every scope holding records the user may read, the busiest first (global last)."""
    every = await engine.store.scope_keys()
    aliases = await engine.store.alias_of(every)
    summaries: dict[str, ProjectSummary] = {}
    for key in every:
        if key in aliases and aliases[key].detached_at is None:
            continue  # read as part of the project it is attached to
        keys = await project_keys(engine, key)
        filters = Filters(scope_keys=keys, corpora=CORPORA, viewer=engine.user)
        summary = ProjectSummary(key=key, aliases=list(keys[1:]))
        corpus: Counter[str] = Counter()
        agent: Counter[str] = Counter()
        month: Counter[str] = Counter()
        for count in await engine.store.record_counts(filters):
            summary.records += count.records
            summary.embedded += count.embedded
            corpus[count.corpus] += count.records
            agent[count.agent or "unknown"] += count.records
            month[count.month] += count.records
        if not summary.records:
            continue
        summary.by_corpus = dict(corpus.most_common())
        summary.by_agent = dict(agent.most_common())
        summary.by_month = dict(sorted(month.items()))
        summaries[key] = summary
    for view in await open_conflicts(engine):  # those the user may read
        owner = next((s for s in summaries.values() if view.conflict.scope_key in _keys(s)), None)
        if owner is not None:
            owner.open_conflicts += 1
    return sorted(summaries.values(), key=lambda s: (s.is_global, -s.records, s.key))


def _keys(summary: ProjectSummary) -> list[str]:
    return [summary.key, *summary.aliases]


async def listing(
    engine: Engine,
    keys: Sequence[str],
    *,
    kind: str = "",
    agent: str = "",
    tag: str = "",
    since: str = "",
    until: str = "",
    limit: int,
    before: str = "",
    seen: Sequence[str] = (),
) -> list[Record]:
    """Current records of these scopes, newest first, ``limit`` of them: of one kind
    (else every corpus), one agent, one tag, written in ``[since, until)``.

    A page starts after the last one: ``before`` is the creation time of the last
    record shown, ``seen`` the ids shown that were created at that very time. Each
    corpus is read from its own index in time order and the reads are merged
    (newest first, then corpus, then the index's order), so a page costs the same
    at the hundredth page as at the first: 2-5 ms at 200,000 memories, where one
    read over every corpus sorted them all (300-440 ms).

    Raises:
        InvalidInput: an unknown kind, a time that is not one, or ``since`` not
            before ``until``.
    """
    if kind and kind not in CORPUS_OF_KIND:
        raise InvalidInput(f"unknown kind {kind!r}; use one of: {', '.join(CORPUS_OF_KIND)}")
    after, up_to = time_window(since.strip(), until.strip())
    base = Filters(
        scope_keys=tuple(keys),
        corpora=CORPORA,
        kinds=(kind,) if kind else (),
        tags=(tag.strip().casefold(),) if tag.strip() else (),
        agents=(agent.strip(),) if agent.strip() else (),
        since=after,
        until=up_to,
        through=time_bound(before.strip(), "before"),
        viewer=engine.user,
    )
    skip = set(seen) if before else set()
    merged: list[tuple[str, int, int, Record]] = []
    for place, corpus in enumerate((CORPUS_OF_KIND[kind],) if kind else CORPORA):
        found = await engine.store.current(replace(base, corpora=(corpus,)), limit + len(skip))
        kept = [r for r in found if r.id not in skip]
        merged.extend((r.created_at, -place, -i, r) for i, r in enumerate(kept))
    merged.sort(key=lambda row: row[:3], reverse=True)
    return [shown(engine, record) for *_, record in merged[:limit]]


async def readable(engine: Engine, record_id: str) -> Record:
    """A record the user may read, current or not.

    Raises:
        NotFound: no such record, or another user's personal one.
    """
    record = await engine.store.get(record_id)
    if record is None or not record.visible_to(engine.user):
        raise NotFound(f"no record with id {record_id!r}")
    return shown(engine, record)


async def history(engine: Engine, record: Record) -> History:
    """The supersede chain through ``record``, both ways, and its open conflicts.

    What replaced it is read first, by following ``replaced_by``: after an older
    value was made current again, the record it replaced still lists it among
    the values it superseded, and it is the newer value now.
    """
    seen = {record.id}
    newer: list[Record] = []
    # A fold is no step of the chain: the record holding the text is not a newer value.
    following = None if record.archived_reason == "folded" else record.replaced_by
    while following and following not in seen and len(newer) < CHAIN_MOST:
        seen.add(following)
        later = await engine.store.get(following)
        if later is None or not later.visible_to(engine.user):
            break
        newer.append(later)
        following = later.replaced_by
    older: list[Record] = []
    wanted = [i for i in reversed(record.supersedes) if i not in seen]
    while wanted and len(older) < CHAIN_MOST:
        found = {r.id: r for r in await engine.store.get_many(wanted)}
        step = [found[i] for i in wanted if i in found and i not in seen]
        older.extend(r for r in step if r.visible_to(engine.user))
        seen.update(r.id for r in step)
        wanted = [i for r in step for i in reversed(r.supersedes) if i not in seen]
    conflicts = await engine.store.open_conflicts_of([record.id])
    return History(
        older=[shown(engine, r) for r in older],
        newer=[shown(engine, r) for r in newer],
        conflicts=conflicts,
    )


async def reinstate(engine: Engine, record_id: str) -> Record:
    """Make an older value of a supersede chain the current one again; the record that
    was current becomes its history (nothing is lost: it can be chosen back the same
    way). The reinstated record gets its vectors again.

    Raises:
        NotFound: no such record the user may read.
        InvalidInput: it is not an older value (current, archived), or its chain
            ends in an archived record.
    """
    async with engine.store.write() as tx:
        old = await tx.get(record_id)
        if old is None or not old.visible_to(engine.user):
            raise NotFound(f"no record with id {record_id!r}")
        if old.archived_at is not None or old.replaced_by is None:
            state = "archived: restore it instead" if old.archived_at else "already current"
            raise InvalidInput(f"record {record_id} is {state}")
        current: Record | None = old
        seen = {old.id}
        while current is not None and current.replaced_by is not None:
            following = current.replaced_by
            if following in seen or len(seen) > CHAIN_MOST:
                raise InvalidInput(f"the chain of record {record_id} loops")
            seen.add(following)
            current = await tx.get(following)
        if current is None or current.archived_at is not None:
            raise InvalidInput(
                f"the newest value after record {record_id} is archived or gone: restore that"
            )
        if not await tx.reinstate(old, current):
            raise InvalidInput(f"record {record_id} changed meanwhile; look again")
    await engine.embed_stored([old.id])
    return await readable(engine, old.id)


async def project_brief(engine: Engine, key: str, *, budget: int | None = None) -> Brief:
    """The spawn brief of the project stored under ``key`` (as ``brief`` builds it for
    a directory of that project)."""
    return await build_brief(engine, keys=await project_keys(engine, key), budget=budget)


def shown(engine: Engine, record: Record) -> Record:
    """A record as a page may show it: its text and the texts it folded through the
    current secret rules (a secret stored before a rule existed stays hidden), unless
    ``write.secrets`` is off."""
    if not engine.redacts:
        return record
    folded = [replace(m, content=redact_text(m.content)) for m in record.merged_from]
    changed = any(a.content != b.content for a, b in zip(folded, record.merged_from, strict=True))
    record = shown_record(record)
    return replace(record, merged_from=folded) if changed else record
