"""The write pipeline (SPEC §3): validate, sanitize, then decide and write atomically.

``prepare`` turns caller input into a ``Draft`` (or raises ``InvalidInput``):
size limits, control characters, secret redaction. Embedding happens between
the two steps, outside any lock (``store_many`` runs all three over an engine,
in batches). ``apply`` runs inside one write transaction:
it reads the nearest records of the same scope and corpus, decides what the
new text is to them, and writes the outcome - so two processes storing one
fact at once end with one canonical record. (A single fact's nearest records
are read before the lock, and used under it only if nothing was committed
since: ``Nearby``.)

Update rules per corpus (see ``records``): facts fold / supersede / conflict /
insert; journal entries append, folding exact repeats; a goal or plan replaces
the current one, which becomes history.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
import unicodedata
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from memory_mcp.config import FoldSettings, WriteSettings
from memory_mcp.errors import InvalidInput, SecretRejected
from memory_mcp.fold import judge
from memory_mcp.overlap import alongside
from memory_mcp.passages import split_passages
from memory_mcp.records import (
    CORPUS_OF_KIND,
    STORABLE_KINDS,
    Action,
    Corpus,
    MergedEntry,
    Record,
    Redaction,
    StoreResult,
    content_hash,
    format_time,
    normalized_text,
    without_surrogates,
)
from memory_mcp.scope import Scope
from memory_mcp.secret_scan import redact, redact_text
from memory_mcp.storage.base import (
    Filters,
    Neighbours,
    RecordReads,
    Scored,
    Vector,
    WriteTransaction,
)

if TYPE_CHECKING:
    from memory_mcp.engine import Engine

MAX_TAGS = 20
MAX_TAG_CHARS = 64
MAX_AGENT_CHARS = 64
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\u200b\u2028\u2029\ufeff]")
_ID_PREFIX: dict[Corpus, str] = {
    "facts": "f",
    "journal": "j",
    "docs": "d",
    "knowledge": "k",
    "insights": "i",
}
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_COMMIT_BATCH = 64  # writes per transaction in ``store_many``


_RANDOM_BITS = 80
_last_id = [0, 0]  # the millisecond and random part of this process's last id
_id_lock = threading.Lock()


def new_id(corpus: Corpus) -> str:
    """A time-ordered unique id (ULID layout), prefixed by corpus: ``f_01J...``.

    Monotonic in a process, as ULID's spec allows: an id made in the same millisecond
    as the one before (or after the clock stepped back) is that one plus one, so a
    process's ids sort in the order it made them. Results of equal score are ordered
    by id: with random ids, the records of one batch (the same millisecond) came out
    in another order on each run.
    """
    now = int(time.time() * 1000)
    with _id_lock:
        last, random_part = _last_id
        if now <= last and random_part + 1 < 1 << _RANDOM_BITS:
            now, random_part = last, random_part + 1
        else:
            now, random_part = max(now, last + 1), int.from_bytes(os.urandom(10), "big")
        _last_id[:] = [now, random_part]
    value = (now << _RANDOM_BITS) | random_part
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return f"{_ID_PREFIX[corpus]}_{''.join(reversed(chars))}"


def clean_text(text: str) -> str:
    """NFC text without control characters, invalid surrogates or trailing space."""
    text = without_surrogates(text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROL.sub("", unicodedata.normalize("NFC", text))
    return "\n".join(line.rstrip() for line in text.strip().split("\n"))


@dataclass
class Draft:
    """A validated write, before the fold decision."""

    record: Record
    redactions: list[Redaction] = field(default_factory=list)
    scanned: bool = True  # write.secrets is not "off": what the result shows is redacted too
    scope_keys: tuple[str, ...] = ()  # the keys of its scope: its own, then its aliases
    # Written with its whole text's vector only: the rest of its passages are due.
    vectors_due: bool = False

    @property
    def corpus(self) -> Corpus:
        return self.record.corpus

    @property
    def same_corpus(self) -> Filters:
        """The records it may fold into: its scope (aliases included) and corpus, read by
        the same people - a shared fact never folds into a private one (it would vanish
        for the team), a personal one never into another's."""
        record = self.record
        return Filters(
            scope_keys=self.scope_keys or (record.scope_key,),
            corpora=(record.corpus,),
            viewer=record.user,
            private=record.private,
        )


async def exact_repeat(reads: RecordReads | WriteTransaction, draft: Draft) -> Record | None:
    """The current record whose text the draft repeats exactly (normalized), if any."""
    found = await reads.find_by_hash(content_hash(draft.record.content), draft.same_corpus)
    if found and (draft.corpus != "docs" or found[0].kind == draft.record.kind):
        return found[0]
    return None


def prepare(
    content: object,
    *,
    kind: str,
    scope: Scope,
    importance: float | None,
    tags: Sequence[str],
    agent: str,
    at: datetime,
    pinned: bool = False,
    settings: WriteSettings,
    kinds: Sequence[str] = STORABLE_KINDS,
    user: str = "",
    private: bool = False,
) -> Draft:
    """Validate and sanitize one write (``user`` wrote it; ``private``: for them alone).

    Raises:
        InvalidInput: an argument is unusable; the message says what to change.
        SecretRejected: the content holds a secret and the policy is ``reject``.
    """
    if not isinstance(content, str):
        raise InvalidInput("content must be text")
    if len(content) > settings.max_chars:
        raise InvalidInput(
            f"content is {len(content):,} characters; the limit is {settings.max_chars:,} "
            "(write.max_chars). Store the durable point, not the whole text"
        )
    if kind not in kinds:
        raise InvalidInput(f"unknown kind {kind!r}; use one of: {', '.join(kinds)}")
    if importance is not None and (
        isinstance(importance, bool) or not math.isfinite(importance) or not 0 <= importance <= 1
    ):
        raise InvalidInput(f"importance must be a number from 0 to 1, got {importance!r}")
    text = clean_text(content)
    if not text:
        raise InvalidInput("content is empty; pass the text to remember")

    redactions: list[Redaction] = []
    if settings.secrets != "off":
        scan = redact(text)
        if scan.found and settings.secrets == "reject":
            kinds_found = ", ".join(r.kind for r in scan.redactions)
            raise SecretRejected(
                f"content holds what looks like a secret ({kinds_found}); remove it and store "
                "where the secret lives instead (write.secrets = reject)"
            )
        text, redactions = scan.text, scan.redactions

    corpus = CORPUS_OF_KIND[kind]
    stamp = format_time(at)
    record = Record(
        id=new_id(corpus),
        corpus=corpus,
        kind=kind,
        scope=scope.name,
        scope_key=scope.key,
        content=text,
        agent=_agent(agent),
        created_at=stamp,
        updated_at=stamp,
        tags=_tags(tags),
        importance=importance,
        pinned=pinned,
        user=user,
        private=bool(private),
    )
    return Draft(record, redactions, scanned=settings.secrets != "off", scope_keys=scope.keys)


def _tags(tags: Sequence[str]) -> list[str]:
    if isinstance(tags, str):
        tags = [tags]
    out: list[str] = []
    for tag in tags:
        if not isinstance(tag, str):
            raise InvalidInput("tags must be a list of short strings")
        clean = clean_text(tag).casefold()
        if not clean:
            continue
        if len(clean) > MAX_TAG_CHARS or "\n" in clean:
            raise InvalidInput(
                f"tag {clean[:20]!r}... is too long; keep tags under {MAX_TAG_CHARS} characters"
            )
        if clean not in out:
            out.append(clean)
    if len(out) > MAX_TAGS:
        raise InvalidInput(f"{len(out)} tags given; the limit is {MAX_TAGS}")
    return out


def _agent(agent: str) -> str:
    clean = clean_text(agent or "unknown").replace("\n", " ")
    return clean[:MAX_AGENT_CHARS] or "unknown"


async def apply(
    tx: WriteTransaction,
    draft: Draft,
    vectors: Vector | None,
    *,
    embedder: str | None,
    fold_settings: FoldSettings,
    now: str,
    embed_late: Callable[[str], Awaitable[list[Vector] | None]] | None = None,
    nearby: Nearby | None = None,
) -> StoreResult:
    """Decide what the draft is to the records already there, and write it.

    ``embed_late`` embeds a draft that was not embedded because it repeated a stored
    text exactly, when under the lock it no longer does (another process changed
    that record meanwhile): rare, and the one embedding done inside the lock.
    ``nearby``: the draft's neighbours read before the lock, and the mark taken
    before the draft was found to repeat no stored text: both stand if nothing has
    been committed since (else they are read again).
    """
    record = draft.record
    # A duplicate stored under one of the project's aliases folds like any other.
    same_corpus = draft.same_corpus
    # Nothing committed since the mark taken before the draft was found to repeat no
    # stored text: it still repeats none, and its neighbours read then stand.
    unchanged = nearby is not None and await tx.unchanged_since(nearby.mark)
    exact = None if unchanged else await exact_repeat(tx, draft)
    if exact is None and vectors is None and embed_late is not None:
        late = await embed_late(record.content)
        vectors = late[0] if late else None
    if vectors is not None and embedder is not None:
        record.embedder = embedder
    result = StoreResult(
        id=record.id,
        action="inserted",
        kind=record.kind,
        scope=record.scope,
        scope_key=record.scope_key,
        redactions=draft.redactions,
        embedded=record.embedder is not None,
    )
    if exact is not None:
        return await _fold(tx, draft, exact, vectors, result, now, "exact repeat")

    if record.corpus == "journal":
        await _insert(tx, draft, vectors)
        return replace(result, action="appended")

    if record.corpus == "docs":
        kind_only = replace(same_corpus, kinds=(record.kind,))
        previous = await tx.current(kind_only, limit=10)
        if previous:
            record.supersedes = _history(previous[0], previous[1:])
        await _insert(tx, draft, vectors)
        for old in previous:
            await tx.replace(old, record.id)
        if not previous:
            return result
        return _related(
            draft, result, "replaced", previous[0], f"replaces the previous {record.kind}"
        )

    # Facts: compare with the nearest records, most similar first.
    if nearby is not None and unchanged:
        candidates = nearby.candidates
    else:
        candidates = await neighbours(tx, record, vectors, embedder, same_corpus, fold_settings)
    for old, similarity in candidates:
        decision = judge(old.content, record.content, similarity, fold_settings)
        if decision.action == "fold":
            return await _fold(tx, draft, old, vectors, result, now, decision.reason)
        if decision.action == "supersede":
            record.supersedes = _history(old)
            await _insert(tx, draft, vectors)
            await tx.replace(old, record.id)
            return _related(draft, result, "superseded", old, decision.reason)
        if decision.action == "conflict":
            await _insert(tx, draft, vectors)
            conflict = await tx.add_conflict(
                record.scope_key, record.id, old.id, decision.reason, now
            )
            return _related(draft, result, "conflict", old, decision.reason, conflict_id=conflict)
    await _insert(tx, draft, vectors)
    return result


async def _insert(tx: WriteTransaction, draft: Draft, vectors: Vector | None) -> None:
    """Insert the draft's record; with its whole text's vector only, its other passages
    are due (``Engine.complete_later``)."""
    record = draft.record
    draft.vectors_due = bool(
        vectors is not None
        and record.embedder
        and len(vectors) < len(split_passages(record.content))
    )
    await tx.insert(record, vectors, vectors_due=draft.vectors_due)


def _history(old: Record, more: Sequence[Record] = ()) -> list[str]:
    """Ids of what a new record replaces: the old record's history, then the old record."""
    history = list(old.supersedes)
    for extra in more:
        history.extend(i for i in [*extra.supersedes, extra.id] if i not in history)
    history.append(old.id)
    return history


@dataclass
class Nearby:
    """A fact's neighbours, read before the write lock (``neighbours``), and the store's
    ``write_mark`` taken before they were read."""

    mark: object
    candidates: list[tuple[Record, float | None]]


async def neighbours(
    reads: Neighbours,
    record: Record,
    vectors: Vector | None,
    embedder: str | None,
    filters: Filters,
    settings: FoldSettings,
    *,
    lexical: Sequence[Scored] | None = None,
) -> list[tuple[Record, float | None]]:
    """The nearest current records, with dense similarity where both have vectors.

    The write path asks before its transaction and again inside it if something
    was committed meanwhile; the consolidation sweep (``maintenance``) asks the
    store, for records already stored. ``lexical``: the records its rarest words
    find (``rare_lexical``), if read already.
    """
    if lexical is None:
        lexical = await rare_lexical(reads, record, filters, settings)
    found: dict[str, tuple[Record, float | None]] = {}
    scores: dict[str, float] = {}
    if vectors is not None and embedder is not None:
        ids = [item.record.id for item in lexical if item.record.id != record.id]
        near, scores = await reads.nearest_with_scores(
            vectors[0], embedder, filters, settings.candidates, ids
        )
        found = {item.record.id: (item.record, item.score) for item in near}
    found.pop(record.id, None)
    lexical_only = [
        item.record
        for item in lexical
        if item.record.id not in found and item.record.id != record.id
    ]
    ordered = sorted(found.values(), key=lambda pair: -(pair[1] or 0.0))
    # Lexical-only candidates follow in BM25 order, with their dense similarity if any.
    return ordered + [(old, scores.get(old.id)) for old in lexical_only]


async def rare_lexical(
    reads: Neighbours, record: Record, filters: Filters, settings: FoldSettings
) -> list[Scored]:
    """The records that a fact's rarest words find (what ``neighbours`` reads lexically)."""
    return await reads.lexical(record.content, filters, settings.candidates, rare_words=True)


async def _fold(
    tx: WriteTransaction,
    draft: Draft,
    old: Record,
    vectors: Vector | None,
    result: StoreResult,
    now: str,
    reason: str,
) -> StoreResult:
    """The new text becomes canonical; the old record's id and text go to ``merged_from``.

    The folded texts stay findable: their vectors move to the canonical record. An
    exact repeat is not embedded at all: the old record's vectors are its own.
    """
    record = draft.record
    entry = absorb(record, old, now)
    await _insert(tx, draft, vectors)
    if old.embedder is not None and record.embedder in (None, old.embedder):
        own = record.embedder is not None or normalized_text(old.content) == normalized_text(
            record.content
        )
        if await tx.carry_vectors(old.id, record.id, old.embedder):
            record.embedder = old.embedder
            result = replace(result, embedded=True)
            if not own:
                await tx.mark_vectors_due(record.id)  # its own text awaits its vectors
                draft.vectors_due = True
    await tx.fold_into(old, record.id, entry, now)
    return _related(draft, result, "folded", old, reason)


def absorb(keep: Record, old: Record, now: str) -> MergedEntry:
    """Fold ``old`` into ``keep`` (in memory): its text, id, history, use and tags.

    Nothing of ``old`` is lost: its text and id, and everything it had folded,
    join ``keep.merged_from``. Returns the entry that records ``old`` itself.
    """
    entry = MergedEntry(old.id, old.content, old.created_at, old.agent, now)
    keep.merged_from = [*keep.merged_from, *old.merged_from, entry]
    keep.fold_count += old.fold_count + 1
    keep.access_count += old.access_count
    accessed = [t for t in (keep.last_access_at, old.last_access_at) if t is not None]
    keep.last_access_at = max(accessed) if accessed else None
    keep.supersedes = list(dict.fromkeys([*old.supersedes, *keep.supersedes]))
    keep.pinned = keep.pinned or old.pinned
    keep.tags = list(dict.fromkeys([*old.tags, *keep.tags]))
    if old.importance is not None or keep.importance is not None:
        keep.importance = max(x for x in (old.importance, keep.importance) if x is not None)
    keep.meta = {**old.meta, **keep.meta}
    return entry


def _related(
    draft: Draft,
    result: StoreResult,
    action: Action,
    old: Record,
    reason: str,
    *,
    conflict_id: int | None = None,
) -> StoreResult:
    """The result of a write that concerns an existing record: which, and why.

    The record's text is shown through the current secret rules: it may have been
    stored before one of them existed.
    """
    return replace(
        result,
        action=action,
        related_id=old.id,
        related_content=redact_text(old.content) if draft.scanned else old.content,
        conflict_id=conflict_id,
        reason=reason,
    )


# Over an engine: prepare, embed, apply ------------------------------------------------


@dataclass
class StoreRequest:
    """One write, as given to ``store_many``."""

    content: str
    kind: str = "fact"
    scope: Literal["project", "global"] = "project"
    cwd: str | Path | None = None
    importance: float | None = None
    tags: Sequence[str] = ()
    agent: str = "cli"
    created_at: datetime | None = None
    pinned: bool = False
    private: bool = False  # for its writer alone (in a team's store)


async def store_many(
    engine: Engine,
    requests: Sequence[StoreRequest],
    *,
    progress: Callable[[int], None] | None = None,
) -> list[StoreResult]:
    """Store several memories in order, embedding them in length-sorted batches.

    Each write is decided against everything stored before it, earlier items
    of the same call included. Validation happens first, for all of them:
    one bad item fails the call before anything is written.

    Raises:
        InvalidInput: an item is unusable (nothing was written).
    """
    scopes = _Scopes(engine)
    drafts = [await _draft(engine, request, engine.clock(), scopes) for request in requests]
    results = await _store_drafts(engine, drafts, progress)
    return [r for r in results if isinstance(r, StoreResult)]


async def store_valid(
    engine: Engine,
    requests: Sequence[StoreRequest],
    *,
    progress: Callable[[int], None] | None = None,
) -> list[StoreResult | InvalidInput]:
    """Like ``store_many``, but an unusable item is skipped: its place holds the error."""
    drafts: list[Draft | InvalidInput] = []
    now = engine.clock()
    scopes = _Scopes(engine)
    for request in requests:
        try:
            drafts.append(await _draft(engine, request, now, scopes))
        except InvalidInput as exc:
            drafts.append(exc)
    return await _store_drafts(engine, drafts, progress)


async def _store_drafts(
    engine: Engine,
    items: Sequence[Draft | InvalidInput],
    progress: Callable[[int], None] | None,
) -> list[StoreResult | InvalidInput]:
    drafts = [d for d in items if isinstance(d, Draft)]
    engine.note_activity()
    # What this process's searches returned meanwhile is counted first: a fold carries
    # the counts of the record it absorbs (seconds between an agent's calls: none wait).
    await engine.write_accesses()
    # One write's reads before the lock stand under it if nothing is committed meanwhile.
    mark = await engine.store.write_mark() if len(drafts) == 1 else None
    # What repeats a stored text exactly is not embedded: it folds into that record and
    # takes its vectors (the decision is made again under the write lock).
    repeats = {id(d) for d in drafts if await exact_repeat(engine.store, d) is not None}
    fresh = [d for d in drafts if id(d) not in repeats]
    # One write (an agent's store) embeds its whole text only and defers its other
    # passages; a batch embeds them all at once, in the same batched calls.
    defer = len(fresh) == 1
    scope_keys = {k for d in drafts for k in d.scope_keys}
    one_fact = defer and fresh[0].corpus == "facts"
    nearby: Nearby | None = None
    if one_fact:  # it loads the scopes' vectors itself, beside the model
        vectors, nearby = await _one_fact(engine, fresh[0], scope_keys, mark)
    else:
        vectors = await engine.embed_records([d.record.content for d in fresh], whole_only=defer)
    vector_of = dict(zip((id(d) for d in fresh), vectors or [], strict=False))
    identity = engine.embeddings.identity
    if vectors is None and fresh:
        identity = None
    if identity is not None and not one_fact:  # load the scopes' vectors before the lock
        await engine.store.load_vectors(identity, scope_keys)
    stamp = format_time(engine.clock())

    async def late(text: str) -> list[Vector] | None:
        return await engine.embed_records([text], whole_only=True)

    results: list[StoreResult | InvalidInput] = []
    for start in range(0, len(items), _COMMIT_BATCH):
        batch = items[start : start + _COMMIT_BATCH]
        async with engine.store.write() as tx:
            for item in batch:
                if isinstance(item, InvalidInput):
                    results.append(item)
                    continue
                results.append(
                    await apply(
                        tx,
                        item,
                        vector_of.get(id(item)),
                        embedder=identity,
                        fold_settings=engine.settings.fold,
                        now=stamp,
                        embed_late=late if id(item) in repeats else None,
                        nearby=nearby if id(item) not in repeats else None,
                    )
                )
        if progress is not None:
            progress(len(batch))
    engine.complete_later([d.record.id for d in drafts if d.vectors_due])
    return results


async def _one_fact(
    engine: Engine, draft: Draft, scope_keys: set[str], mark: object | None
) -> tuple[list[Vector] | None, Nearby | None]:
    """One fact's whole-text vector, and its neighbours read before the write lock.

    Its rarest words are looked up, and the scopes' vectors loaded, while the model
    embeds it (the database and the model each release the GIL); then its nearest
    records by that vector. ``apply`` uses them if nothing was committed since the
    store's ``mark``, taken before the exact-repeat check, and reads them again under
    the lock otherwise: at 50,000 memories they are a few ms of a store, and the lock
    is held for less.
    """
    store, settings = engine.store, engine.settings.fold
    identity = engine.embeddings.identity
    filters = draft.same_corpus

    async def read_first() -> list[Scored]:
        if identity is not None:
            await store.load_vectors(identity, scope_keys)
        if mark is None:
            return []
        return await rare_lexical(store, draft.record, filters, settings)

    lexical, vectors = await alongside(
        read_first, lambda: engine.embed_records([draft.record.content], whole_only=True)
    )
    if mark is None:
        return vectors, None
    embedder = engine.embeddings.identity if vectors is not None else None
    own = vectors[0] if vectors is not None else None  # its passages' vectors (whole text)
    candidates = await neighbours(
        store, draft.record, own, embedder, filters, settings, lexical=lexical
    )
    return vectors, Nearby(mark, candidates)


class _Scopes:
    """The project scope of each working directory of one call, resolved once."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.known: dict[str | Path | None, Scope] = {}

    async def of(self, cwd: str | Path | None) -> Scope:
        if cwd not in self.known:
            self.known[cwd] = (await self.engine.project(cwd)).scope
        return self.known[cwd]


async def _draft(engine: Engine, request: StoreRequest, now: datetime, scopes: _Scopes) -> Draft:
    if request.scope not in ("project", "global"):
        raise InvalidInput(f"scope must be 'project' or 'global', got {request.scope!r}")
    scope = Scope.global_() if request.scope == "global" else await scopes.of(request.cwd)
    return prepare(
        request.content,
        kind=request.kind,
        scope=scope,
        importance=request.importance,
        tags=request.tags,
        agent=request.agent,
        at=request.created_at or now,
        pinned=request.pinned,
        settings=engine.settings.write,
        user=engine.user,
        private=request.private,
    )
