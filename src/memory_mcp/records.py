"""Records, kinds and corpora: the engine's vocabulary.

A record belongs to one corpus, which fixes how a new write treats the records
already there (SPEC §1):

========== ================================================ =========================
corpus     kinds                                            update rule
========== ================================================ =========================
facts      fact, decision, preference, procedure, gotcha    fold / supersede / conflict
journal    journal                                          append; exact repeats fold
docs       goal, plan                                       replace; old one kept as history
knowledge  chunk                                            re-chunk on change (ingest)
insights   insight                                          regenerated (maintenance)
========== ================================================ =========================

A record is *current* when it is neither archived nor replaced. Replaced
records (superseded facts, older goals and plans) are history: kept, visible
through the record that replaced them, never purged. Archived records (folded
into another, forgotten, dormant) are hidden and purged after the grace window.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from memory_mcp.lexical import Caseless

Corpus = Literal["facts", "journal", "docs", "knowledge", "insights"]
Action = Literal["inserted", "folded", "superseded", "conflict", "replaced", "appended"]

CORPUS_OF_KIND: dict[str, Corpus] = {
    "fact": "facts",
    "decision": "facts",
    "preference": "facts",
    "procedure": "facts",
    "gotcha": "facts",
    "journal": "journal",
    "goal": "docs",
    "plan": "docs",
    "chunk": "knowledge",
    "insight": "insights",
}
CORPORA: tuple[Corpus, ...] = ("facts", "journal", "docs", "knowledge", "insights")
# Kinds an agent or the CLI may store directly; chunks and insights are made by
# ingest and maintenance.
STORABLE_KINDS: tuple[str, ...] = (
    "fact",
    "decision",
    "preference",
    "procedure",
    "gotcha",
    "journal",
    "goal",
    "plan",
)


def utcnow() -> datetime:
    return datetime.now(UTC)


def format_time(value: datetime) -> str:
    """Timestamps are stored as sortable ISO-8601 UTC text with microseconds."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: str) -> datetime:
    """Parse an ISO-8601 time; a time without zone is taken as UTC."""
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    parsed = datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def age(created_at: str, now: datetime) -> str:
    """A short age: now, 5m, 3h, 2d, 5w, 4mo, 2y."""
    seconds = max(0.0, (now - parse_time(created_at)).total_seconds())
    for unit, size in (("y", 365 * 86400), ("mo", 30 * 86400), ("w", 7 * 86400)):
        if seconds >= 2 * size or (unit == "w" and seconds >= size):
            return f"{int(seconds // size)}{unit}"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return "now"


def _stamp(value: object) -> str:
    """A timestamp from outside (an import) in the stored form, so it sorts and SQL reads it."""
    return format_time(parse_time(str(value)))


def _stamp_or_none(value: object) -> str | None:
    return None if value is None or value == "" else _stamp(value)


_NORMALIZE_DROP = re.compile(r"[^\w]+", re.UNICODE)
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def without_surrogates(text: str) -> str:
    """Lone UTF-16 surrogates (which no UTF-8 store can hold) replaced by U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)


def normalized_text(text: str) -> str:
    """Case-, accent-, punctuation- and space-insensitive form for exact-repeat detection."""
    folded = text.casefold()
    if not folded.isascii():
        folded = unicodedata.normalize("NFKD", folded)
        folded = "".join(ch for ch in folded if not unicodedata.combining(ch))
    return " ".join(_NORMALIZE_DROP.sub(" ", folded).split())


def content_hash(text: str) -> str:
    return hashlib.sha256(normalized_text(text).encode("utf-8")).hexdigest()[:32]


_EMPHATIC = Caseless(
    r"\b(?:never|always|must|decided|decision|deadline|bug|breaking|critical|important|"
    r"security|warning|do not|don't|careful)\b"
)


def emphasis(text: str) -> int:
    """How many emphatic words (never, always, must, bug, ...) the text has, at most 3
    (a search's ranker asks it of each of its hundred or so candidates)."""
    return min(3, len(_EMPHATIC.findall(text)))


def merged_text(record: Record) -> str:
    """The texts a record absorbed by folds, one a line (searched with its own text)."""
    return "\n".join(m.content for m in record.merged_from)


@dataclass(frozen=True)
class Derived:
    """What a backend stores beside a record, computed from it (one place for every backend).

    ``content_hash`` finds exact repeats, ``merged_text`` makes folded texts findable,
    ``emphasis`` lets a backend compute ``ranker.prior`` without reading the text.
    """

    content_hash: str
    merged_text: str
    emphasis: int


def derived(record: Record) -> Derived:
    """The derived columns of ``record``."""
    return Derived(content_hash(record.content), merged_text(record), emphasis(record.content))


@dataclass
class MergedEntry:
    """A record absorbed by a fold: its id and text, kept for audit and undo."""

    id: str
    content: str
    created_at: str
    agent: str
    folded_at: str

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "content": self.content,
            "created_at": self.created_at,
            "agent": self.agent,
            "folded_at": self.folded_at,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MergedEntry:
        return cls(
            id=str(data["id"]),
            content=str(data["content"]),
            created_at=str(data["created_at"]),
            agent=str(data.get("agent", "")),
            folded_at=str(data.get("folded_at", "")),
        )


@dataclass
class Record:
    """One stored record, every field (what ``export`` writes)."""

    id: str
    corpus: Corpus
    kind: str
    scope: Literal["project", "global"]
    scope_key: str
    content: str
    agent: str
    created_at: str
    updated_at: str
    tags: list[str] = field(default_factory=list)
    importance: float | None = None
    pinned: bool = False
    access_count: int = 0
    last_access_at: str | None = None
    fold_count: int = 0
    merged_from: list[MergedEntry] = field(default_factory=list)
    supersedes: list[str] = field(default_factory=list)
    replaced_by: str | None = None
    embedder: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    archived_at: str | None = None
    archived_reason: str | None = None
    user: str = ""  # who wrote it: the database role, or the local login ("": unknown)
    private: bool = False  # only its writer may read it

    @property
    def current(self) -> bool:
        return self.archived_at is None and self.replaced_by is None

    @property
    def personal(self) -> bool:
        """Whether it is its writer's alone: private, or in the (personal) global scope."""
        return self.private or self.scope == "global"

    def visible_to(self, user: str) -> bool:
        """Whether ``user`` may read it: a project's shared records are everyone's; a
        personal one is its writer's (and a record of unknown writer, anyone's). The
        stores' filters (``Filters.viewer``) and Postgres's row-level security say
        the same."""
        return not self.personal or self.user in (user, "")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        """The inverse of ``to_json``; raises KeyError, TypeError or ValueError on bad data."""
        corpus = data["corpus"]
        if corpus not in CORPORA:
            raise ValueError(f"unknown corpus {corpus!r}")
        if data["kind"] not in CORPUS_OF_KIND or CORPUS_OF_KIND[data["kind"]] != corpus:
            raise ValueError(f"kind {data['kind']!r} does not belong to corpus {corpus!r}")
        if data["scope"] not in ("project", "global"):
            raise ValueError(f"unknown scope {data['scope']!r}")
        importance = data.get("importance")
        return cls(
            id=str(data["id"]),
            corpus=corpus,
            kind=str(data["kind"]),
            scope=data["scope"],
            scope_key=str(data["scope_key"]),
            content=str(data["content"]),
            agent=str(data["agent"]),
            created_at=_stamp(data["created_at"]),
            updated_at=_stamp(data["updated_at"]),
            tags=[str(t) for t in data.get("tags", [])],
            importance=None if importance is None else float(importance),
            pinned=bool(data.get("pinned", False)),
            access_count=int(data.get("access_count", 0)),
            last_access_at=_stamp_or_none(data.get("last_access_at")),
            fold_count=int(data.get("fold_count", 0)),
            merged_from=[MergedEntry.from_json(m) for m in data.get("merged_from", [])],
            supersedes=[str(i) for i in data.get("supersedes", [])],
            replaced_by=data.get("replaced_by"),
            embedder=data.get("embedder"),
            meta=dict(data.get("meta", {})),
            archived_at=_stamp_or_none(data.get("archived_at")),
            archived_reason=data.get("archived_reason"),
            user=str(data.get("user", "")),
            private=bool(data.get("private", False)),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "corpus": self.corpus,
            "kind": self.kind,
            "scope": self.scope,
            "scope_key": self.scope_key,
            "content": self.content,
            "agent": self.agent,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "tags": list(self.tags),
            "importance": self.importance,
            "pinned": self.pinned,
            "access_count": self.access_count,
            "last_access_at": self.last_access_at,
            "fold_count": self.fold_count,
            "merged_from": [m.to_json() for m in self.merged_from],
            "supersedes": list(self.supersedes),
            "replaced_by": self.replaced_by,
            "embedder": self.embedder,
            "meta": dict(self.meta),
            "archived_at": self.archived_at,
            "archived_reason": self.archived_reason,
            "user": self.user,
            "private": self.private,
        }


_SET_ASIDE = re.compile(r"conflict-(\d+)")


def set_aside_reason(conflict_id: int) -> str:
    """The archive reason of the record a conflict's resolution set aside (keep old)."""
    return f"conflict-{conflict_id}"


def set_aside_by(reason: str | None) -> int | None:
    """The conflict whose resolution archived a record, from its archive reason (None:
    archived for another reason, or not archived)."""
    found = _SET_ASIDE.fullmatch(reason or "")
    return int(found.group(1)) if found else None


@dataclass
class Conflict:
    """Two current records that contradict each other: the operator's inbox."""

    id: int
    scope_key: str
    record_id: str  # the newer record
    other_id: str  # the record it contradicts
    reason: str
    created_at: str
    resolved_at: str | None = None
    resolution: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "scope_key": self.scope_key,
            "record_id": self.record_id,
            "other_id": self.other_id,
            "reason": self.reason,
            "created_at": self.created_at,
            "resolved_at": self.resolved_at,
            "resolution": self.resolution,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Conflict:
        return cls(
            id=int(data["id"]),
            scope_key=str(data["scope_key"]),
            record_id=str(data["record_id"]),
            other_id=str(data["other_id"]),
            reason=str(data["reason"]),
            created_at=str(data["created_at"]),
            resolved_at=data.get("resolved_at"),
            resolution=data.get("resolution"),
        )


@dataclass(frozen=True)
class Redaction:
    """One kind of secret found in stored content."""

    kind: str
    count: int


@dataclass
class StoreResult:
    """What a write did."""

    id: str
    action: Action
    kind: str
    scope: Literal["project", "global"]
    scope_key: str
    related_id: str | None = None
    related_content: str | None = None
    conflict_id: int | None = None
    redactions: list[Redaction] = field(default_factory=list)
    embedded: bool = False
    reason: str = ""


@dataclass
class Hit:
    """A search result: the record, its relevance and the ranked score."""

    record: Record
    score: float
    relevance: float
    lexical: float | None = None
    dense: float | None = None
    # The score on the record's own text and vectors, before its conversation and
    # feedback re-ordered it (fusion.read_around): what a threshold admits by.
    own_score: float | None = None
    # What a reader should know besides the text: "supersedes" (the older value it
    # replaced) and "conflict" (an open contradiction it is part of); see views.py.
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass
class SearchResult:
    hits: list[Hit]
    mode: Literal["hybrid", "lexical", "dense"]
    warnings: list[str] = field(default_factory=list)
