"""Hybrid retrieval: lexical and dense relevance, fused, then ranked once.

    relevance = a * bm25 / max_bm25 + (1 - a) * max(0, cosine)      both branches
    relevance = bm25 / max_bm25                                     lexical only
    relevance = max(0, cosine)                                      dense only

A record that has no vector from the query's embedder yet (written while the
model was away, waiting for maintenance to embed it) is scored by its words
alone: ``bm25 / max_bm25`` times the share of the query's words it holds.

``a`` is ``search.lexical_weight``; ``cosine`` is the best of a record's passage
vectors, and ``max_bm25`` the best BM25 score among this query's hits. Each branch
contributes its best ``search.candidates`` records; a record found by only one
branch is scored by the other too, so fusion sees both numbers. Filters
(scope, kind, tags, time) are applied inside both branches, before the limit;
hits below ``search.min_relevance`` are dropped, judged on their own text
and vectors. The candidates left are ranked with their cosines read in their
conversation and then with the query vector refined by pseudo-relevance
feedback (``read_around``), through the one ranker (``ranker.score``): both
re-order, neither admits. The hits returned show their text
through the current secret rules (``secret_scan``), so that a record stored
before a rule existed does not show its secret.

A search over several corpora (``project_search``, ``searchUnifiedMemory``)
gathers each corpus's ``candidates`` separately - concurrently, with one query
vector - and fuses them together in one ``fuse``: ``max_bm25`` is then the best
over every corpus, so every hit's relevance and score is on the same scale.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from memory_mcp import ranker
from memory_mcp.lexical import stems
from memory_mcp.records import Conflict, Hit, Record
from memory_mcp.secret_scan import redact_text
from memory_mcp.storage.base import IVF_PROBES, Around, Filters, Scored, Store, Vector


@dataclass(frozen=True)
class SearchPlan:
    candidates: int
    lexical_weight: float
    min_relevance: float
    ranking: ranker.RankerConfig
    redact: bool = True  # show hits through the current secret rules (write.secrets not off)
    context_seconds: float = 0.0  # neighbours in time read as one conversation (0: off)
    feedback_weight: float = 0.0  # pull of the best candidates on the query vector (0: off)


@dataclass
class Candidates:
    """What the branches found for one query: records with their raw scores."""

    records: dict[str, Record] = field(default_factory=dict)
    bm25: dict[str, float] = field(default_factory=dict)
    cosine: dict[str, float] = field(default_factory=dict)
    # Of a record with no vector yet: the share of the query's words it holds.
    coverage: dict[str, float] = field(default_factory=dict)
    # Of a record with neighbours in time: the query's cosine with it read together
    # with one of them (the best of the two).
    context: dict[str, float] = field(default_factory=dict)
    # The best cosine (own or in context) with the query refined by feedback.
    feedback: dict[str, float] = field(default_factory=dict)
    # What ``read_around`` reads: each record's vector with its neighbours', read in
    # the trip that found it (``Store.candidate_reads``), and which records were asked.
    around: dict[str, Around] = field(default_factory=dict)
    around_read: set[str] = field(default_factory=set)
    # The open conflicts of the records, read in that trip too, by id (a search notes
    # them on its hits), and which records they were read for.
    conflicts: dict[int, Conflict] = field(default_factory=dict)
    conflicts_read: set[str] = field(default_factory=set)

    def update(self, other: Candidates) -> None:
        """Add another branch's candidates (a record found twice keeps its best scores).

        ``context`` and ``feedback`` are not merged: ``read_around`` fills them once,
        on the merged candidates.
        """
        self.records.update(other.records)
        self.around.update(other.around)
        self.around_read.update(other.around_read)
        self.conflicts.update(other.conflicts)
        self.conflicts_read.update(other.conflicts_read)
        pairs = ((self.bm25, other.bm25), (self.cosine, other.cosine))
        for mine, theirs in (*pairs, (self.coverage, other.coverage)):
            for rid, value in theirs.items():
                mine[rid] = max(value, mine.get(rid, value))

    def open_conflicts(self, record_ids: Collection[str]) -> list[Conflict] | None:
        """The open conflicts any of ``record_ids`` is in, oldest first, as read with the
        candidates; None: not read for all of them."""
        ids = set(record_ids)
        if not ids <= self.conflicts_read:
            return None
        return [
            c for _, c in sorted(self.conflicts.items()) if c.record_id in ids or c.other_id in ids
        ]


async def candidates(
    store: Store,
    query: str,
    query_vector: Vector | None,
    embedder: str | None,
    filters: Filters,
    plan: SearchPlan,
    *,
    lexical: Sequence[Scored] | None = None,
    ahead: object | None = None,
    conflicts: bool = False,
) -> Candidates:
    """The best ``plan.candidates`` records of each branch, each scored by both branches
    (``lexical``: the lexical branch's, if read already; ``ahead``: the dense branch's
    ranking, if made already: ``Store.rank_ahead`` with ``IVF_PROBES``); and if
    ``conflicts``, their open conflicts where the store reads them with them
    (``Candidates.open_conflicts``)."""
    found = Candidates()
    if lexical is None:
        lexical = await store.lexical(query, filters, plan.candidates)
    for item in lexical:
        found.records[item.record.id] = item.record
        found.bm25[item.record.id] = item.score
    if query_vector is None or embedder is None:
        return found
    # The lexical candidates' cosines in the same read, what ``read_around`` reads of
    # every candidate with a vector, and the candidates' open conflicts: one trip to the
    # store where it can.
    read = await store.candidate_reads(
        query_vector,
        embedder,
        filters,
        plan.candidates,
        list(found.bm25),
        within_seconds=plan.context_seconds if _reads_around(plan) else None,
        conflicts=conflicts,
        probes=IVF_PROBES,
        ahead=ahead,
    )
    near, scores = read.near, read.scores
    if read.around is not None:
        found.around = read.around
        found.around_read = {item.record.id for item in near} | set(scores)
    if read.conflicts is not None:
        found.conflicts = {c.id: c for c in read.conflicts}
        found.conflicts_read = {item.record.id for item in near} | set(found.bm25)
    for item in near:
        found.records[item.record.id] = item.record
        found.cosine[item.record.id] = item.score
    for rid, score in scores.items():
        found.cosine.setdefault(rid, score)  # a record the dense branch found keeps its own
    asked = set(stems(query))
    for rid in found.bm25:
        if rid not in found.cosine and asked:  # no vector: its words are all there is
            held = asked & set(stems(found.records[rid].content))
            found.coverage[rid] = len(held) / len(asked)
    return found


FEEDBACK_RECORDS = 5  # the best candidates whose vectors refine the query


def _fusion(found: Candidates, *, dense: bool, plan: SearchPlan) -> tuple[float, float]:
    """``a`` (the lexical branch's weight: all of it without vectors, none without
    lexical hits) and ``max_bm25``, the scale of the BM25 scores."""
    a = plan.lexical_weight if dense else 1.0
    if dense and not found.bm25:
        a = 0.0
    return a, max(found.bm25.values(), default=0.0)


def _lexical(found: Candidates, rid: str, top_bm25: float) -> float:
    """The record's BM25 over the best of the query's (0 when the lexical branch missed it)."""
    return found.bm25[rid] / top_bm25 if rid in found.bm25 and top_bm25 > 0 else 0.0


async def read_around(
    store: Store,
    found: Candidates,
    query_vector: Vector | None,
    embedder: str | None,
    plan: SearchPlan,
) -> None:
    """Score the candidates in their conversation, then with the refined query.

    Both only re-order the candidates that are relevant enough on their own
    (``fuse``): a neighbour of a good hit, or a record like the best ones, is
    not a hit for that alone.

    **Conversation.** A reply rarely repeats what it answers ("Yes, twice - the
    second time with my sister"): its own vector misses the question's subject,
    which its neighbour in time holds. Each candidate is also read together with
    the record written just before and just after it (``in_conversation``; read in
    the trip that found the candidates where the backend can, ``candidate_reads``:
    0.23 ms of a search at 200,000 memories, 0.33 at 50,000), as the
    mean of the two whole-text vectors (``unit(v + w)``; mean pooling makes that
    close to embedding the two texts together, and no text is embedded twice).
    The best of its own cosine and these two counts (``found.context``).

    **Feedback.** The query vector moves toward the mean of the best
    ``FEEDBACK_RECORDS`` candidates' vectors (``q + feedback_weight * mean``,
    pseudo-relevance feedback): what the best hits share - the subject of a
    question asked in other words than the memories use - lifts the other
    records about it. Every candidate's whole text, alone and read with a
    neighbour, is scored again with that vector (``found.feedback``); ``fuse``
    keeps the better of that and the candidate's own best passage. On a query
    that nothing answers, the best candidates are noise, and so is what they
    share.

    Called once on all the candidates of a search (every corpus of a unified
    one): the same record must score the same whichever corpora were asked.
    """
    import numpy as np

    if query_vector is None or embedder is None or not found.cosine:
        return
    if not _reads_around(plan):
        return
    a, top_bm25 = _fusion(found, dense=True, plan=plan)

    def provisional(rid: str) -> float:
        cos = max(0.0, found.cosine[rid], found.context.get(rid, 0.0))
        return a * _lexical(found, rid, top_bm25) + (1 - a) * cos

    around = {rid: both for rid, both in found.around.items() if rid in found.cosine}
    unread = [rid for rid in found.cosine if rid not in found.around_read]
    if unread:
        around.update(await store.in_conversation(unread, plan.context_seconds, embedder))
    query = _unit(np.asarray(query_vector, dtype=np.float32))
    if query is None or not around:
        return
    names = list(around)
    whole = np.stack([around[rid].vector for rid in names])
    pairs = _pairs(names, around)
    found.context = _paired(query, pairs)
    if plan.feedback_weight <= 0:
        return
    best = sorted(range(len(names)), key=lambda i: (-provisional(names[i]), names[i]))
    mean = whole[best[:FEEDBACK_RECORDS]].mean(axis=0)
    refined = _unit(query + plan.feedback_weight * mean)
    if refined is None:
        return
    # The refined query's cosine with each candidate's whole text, alone and read
    # with a neighbour.
    cosines = (whole @ refined) / _lengths(whole)
    found.feedback = dict(zip(names, cosines.tolist(), strict=True))
    for rid, value in _paired(refined, pairs).items():
        found.feedback[rid] = max(value, found.feedback[rid])


def _reads_around(plan: SearchPlan) -> bool:
    """Whether ``read_around`` reads the candidates' vectors (conversation or feedback on)."""
    return plan.context_seconds > 0 or plan.feedback_weight > 0


_Pairs = tuple[list[str], Vector, Vector]


def _pairs(names: list[str], around: dict[str, Around]) -> _Pairs:
    """Each record with a neighbour, the two read together (the sum of their vectors),
    and that sum's length.

    A record appears once per neighbour it has (before, after).
    """
    import numpy as np

    owners = [rid for rid in names for _ in around[rid].neighbours]
    if not owners:
        return [], np.zeros((0, 0), np.float32), np.zeros(0, np.float32)
    joint = np.stack(
        [around[rid].vector + other for rid in names for other in around[rid].neighbours.values()]
    )
    return owners, joint, _lengths(joint)


def _lengths(rows: Vector) -> Vector:
    """Each row's length (1 for a zero row), without a temporary the size of ``rows``:
    an array of 256 KB or more is a fresh mapping, faulted in page by page, and a
    search's pairs are about 360 KB."""
    import numpy as np

    lengths: Vector = np.sqrt(np.einsum("ij,ij->i", rows, rows))
    lengths[lengths == 0] = 1.0
    return lengths


def _paired(query: Vector, pairs: _Pairs) -> dict[str, float]:
    """The query's cosine with each record read with its closest neighbour."""
    owners, joint, lengths = pairs
    found: dict[str, float] = {}
    if not owners:
        return found
    for rid, value in zip(owners, ((joint @ query) / lengths).tolist(), strict=True):
        found[rid] = max(value, found.get(rid, value))
    return found


def _unit(vector: Vector) -> Vector | None:
    import numpy as np

    flat = vector.reshape(-1)
    norm = float(np.linalg.norm(flat))
    return flat / norm if norm > 0 else None


def fuse(
    found: Candidates,
    *,
    dense: bool,
    limit: int,
    now: datetime,
    plan: SearchPlan,
    min_relevance: float | None = None,
    redact: bool | None = None,
) -> list[Hit]:
    """Fused relevance, ranked by the one ranker: the ``limit`` best hits, best first.

    BM25 is normalised by the best BM25 among all the candidates, so hits from
    several branches (corpora) are scored on one scale.

    Args:
        dense: whether the query had a vector (else relevance is lexical only).
        min_relevance: overrides ``plan.min_relevance`` (0 keeps every candidate,
            for a full ranking).
        redact: overrides ``plan.redact`` (False: the caller keeps a few of the hits
            and shows those through ``shown``).
    """
    min_relevance = plan.min_relevance if min_relevance is None else min_relevance
    a, top_bm25 = _fusion(found, dense=dense, plan=plan)
    hits: list[Hit] = []
    for rid, record in found.records.items():
        lex = _lexical(found, rid, top_bm25)
        cos = max(0.0, found.cosine.get(rid, 0.0))
        if dense and rid not in found.cosine:
            # No vector yet (stored while the model was away): its words are all there
            # is, weighed by how much of the question they cover, so that one shared
            # word with the best BM25 of the query does not make it fully relevant.
            relevance = lex * found.coverage.get(rid, 1.0)
        else:
            relevance = a * lex + (1 - a) * cos
        if relevance < min_relevance:
            continue
        prior = ranker.prior(record, now, plan.ranking)
        own_score = ranker.score(relevance, prior, plan.ranking)
        # Conversation and feedback re-order what is relevant enough on its own: a
        # memory written next to a good hit is not made a hit by it (see read_around).
        if rid in found.feedback:
            # The refined query reads whole texts; a long memory's best passage for
            # the question itself still counts.
            cos = max(cos, found.feedback[rid])
        elif rid in found.context:
            cos = max(cos, found.context[rid])
        if rid in found.cosine:
            relevance = a * lex + (1 - a) * cos
        hits.append(
            Hit(
                record=record,
                score=ranker.score(relevance, prior, plan.ranking),
                relevance=relevance,
                lexical=lex if rid in found.bm25 else None,
                dense=cos if rid in found.cosine else None,
                own_score=own_score,
            )
        )
    hits.sort(key=lambda h: (-h.score, h.record.id))
    if plan.redact if redact is None else redact:
        return [shown(hit) for hit in hits[:limit]]
    return hits[:limit]


def shown(hit: Hit) -> Hit:
    """The hit with its text through the current secret rules: a record stored before
    a rule existed must not show its secret."""
    record = shown_record(hit.record)
    return hit if record is hit.record else replace(hit, record=record)


def shown_record(record: Record) -> Record:
    """A record as it may be shown: its text through the current secret rules."""
    content = redact_text(record.content)
    return record if content == record.content else replace(record, content=content)


async def hybrid(
    store: Store,
    query: str,
    query_vector: Vector | None,
    embedder: str | None,
    filters: Filters,
    *,
    limit: int,
    now: datetime,
    plan: SearchPlan,
    min_relevance: float | None = None,
) -> list[Hit]:
    """The ``limit`` best records for ``query`` under ``filters``, best first."""
    found = await candidates(store, query, query_vector, embedder, filters, plan)
    await read_around(store, found, query_vector, embedder, plan)
    dense = query_vector is not None and embedder is not None
    return fuse(found, dense=dense, limit=limit, now=now, plan=plan, min_relevance=min_relevance)
