"""The insights task: summaries of groups of related facts, each listing its sources.

Per scope, the best ``INSIGHT_POOL`` facts by prior are grouped (pairs joined
most similar first, by vectors, else by word overlap, up to
``insight_max_facts`` per group); each group gets one insight (the LLM's
summary, else highlights and keywords). An insight is rewritten when its group
changes: it is keyed by a fingerprint of its sources, and the old one archived.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from typing import Any

import anyio
import numpy as np

from memory_mcp import ranker
from memory_mcp.brief import top_by_prior
from memory_mcp.lexical import content_words, stems
from memory_mcp.llm import insight_prompt
from memory_mcp.maintenance.context import BATCH, TaskReport, TaskRun
from memory_mcp.records import Record, format_time
from memory_mcp.storage.base import Filters, Vector
from memory_mcp.write import new_id

INSIGHT_POOL = 1000  # facts of a scope, best by prior, that insights group
LEXICAL_INSIGHT_SIMILARITY = 0.3  # word overlap that relates two facts without vectors
_HIGHLIGHTS = 5
_HIGHLIGHT_CHARS = 180
_KEYWORDS = 12

Matrix = np.ndarray[Any, np.dtype[np.float32]]


async def insights(run: TaskRun) -> TaskReport:
    if not run.settings.insights:
        return TaskReport("insights", skipped="maintenance.insights is off")
    identity = run.dense()
    counts: Counter[str] = Counter()
    # A project's aliases are one scope with it: its insights go under its own key.
    for scope_key, keys in (await run.engine.projects_of(await run.store.scope_keys())).items():
        written, retired = await _scope_insights(run, scope_key, (scope_key, *keys), identity)
        counts["written"] += written
        counts["retired"] += retired
    return TaskReport("insights", counts=dict(counts))


async def _scope_insights(
    run: TaskRun, scope_key: str, keys: tuple[str, ...], identity: str | None
) -> tuple[int, int]:
    now = run.engine.clock()
    keys = tuple(dict.fromkeys(keys))
    facts = await top_by_prior(
        run.engine, Filters(scope_keys=keys, corpora=("facts",)), now, INSIGHT_POOL
    )
    groups = [g for same in _by_readers(facts) for g in await _groups(run, same, identity)]
    wanted = {_fingerprint(group): group for group in groups}
    existing = await run.store.current(Filters(scope_keys=keys, corpora=("insights",)), 100_000)
    have = {str(r.meta.get("fingerprint", "")): r for r in existing}
    stale = [r for fp, r in have.items() if fp not in wanted]
    stale += [r for r in existing if have.get(str(r.meta.get("fingerprint", ""))) is not r]
    fresh = [(fp, group) for fp, group in wanted.items() if fp not in have]
    at = format_time(now)
    records = [await _insight(run, group, fp, at, scope_key) for fp, group in fresh]
    for start in range(0, max(len(records), len(stale)), BATCH):
        async with run.store.write() as tx:
            for record in records[start : start + BATCH]:
                await tx.insert(record, None)
            for old in stale[start : start + BATCH]:
                await tx.archive(old.id, "regenerated", at)
        await run.renew()
    if records and not run.dry_run:
        await run.engine.embed_stored([r.id for r in records])
    return len(records), len(stale)


def _by_readers(facts: list[Record]) -> list[list[Record]]:
    """The facts split by who may read them (``Record.visible_to``): the shared ones
    together, each writer's personal ones apart, so that no insight tells one user
    what another kept to themselves. Each part keeps the facts' order."""
    parts: dict[tuple[str, bool], list[Record]] = {}
    for fact in facts:
        readers = (fact.user, fact.private) if fact.personal else ("", False)
        parts.setdefault(readers, []).append(fact)
    return list(parts.values())


async def _groups(run: TaskRun, facts: list[Record], identity: str | None) -> list[list[Record]]:
    """Facts related closely enough to summarize together, each group best first.

    Pairs are joined most similar first; a join that would make a group larger
    than ``insight_max_facts`` is left out, so that groups stay topics.
    """
    settings = run.settings
    if len(facts) < settings.insight_min_facts:
        return []
    similarity, threshold = await _similarities(run, facts, identity)
    labels = await anyio.to_thread.run_sync(
        _join, similarity, threshold, settings.insight_max_facts
    )
    members: dict[int, list[Record]] = {}
    for label, fact in zip(labels, facts, strict=True):  # best first: so are the members
        members.setdefault(label, []).append(fact)
    return [g for g in members.values() if len(g) >= settings.insight_min_facts]


async def _similarities(
    run: TaskRun, facts: list[Record], identity: str | None
) -> tuple[Matrix, float]:
    """Pairwise similarity of the facts and the threshold that relates two of them."""
    if identity is not None:
        vectors: list[Vector | None] = [await run.store.vectors_of(f.id, identity) for f in facts]
        if all(v is not None for v in vectors):
            matrix = np.stack([v[0] for v in vectors if v is not None]).astype(np.float32)
            matrix /= np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
            return matrix @ matrix.T, run.settings.insight_similarity
    texts = [f.content for f in facts]
    return await anyio.to_thread.run_sync(_overlaps, texts), LEXICAL_INSIGHT_SIMILARITY


async def _insight(
    run: TaskRun, group: list[Record], fingerprint: str, at: str, scope_key: str
) -> Record:
    """The insight record of a group: an LLM summary, else highlights and keywords."""
    keywords = _keywords([f.content for f in group])
    content = await run.ask(insight_prompt([f.content for f in group]))
    method = run.llm.name if content and run.llm else "rules"
    if not content:
        content = _rule_summary(group, keywords)
    first = group[0]
    return Record(
        id=new_id("insights"),
        corpus="insights",
        kind="insight",
        scope=first.scope,
        scope_key=scope_key,
        content=content,
        agent="memory-mcp",
        created_at=at,
        updated_at=at,
        tags=list(dict.fromkeys(t for f in group for t in f.tags))[:20],
        importance=0.75,
        user=first.user if first.personal else run.engine.user,
        private=first.private,
        meta={
            "sources": [f.id for f in group],
            "keywords": keywords,
            "fingerprint": fingerprint,
            "method": method,
        },
    )


def _join(similarity: Matrix, threshold: float, most: int) -> list[int]:
    """A group label per item (off the event loop).

    Pairs at or above ``threshold`` are joined most similar first, unless the
    joined group would hold more than ``most``.
    """
    n = similarity.shape[0]
    first, second = np.triu_indices(n, k=1)
    values = similarity[first, second]
    keep = np.flatnonzero(values >= threshold)
    order = keep[np.lexsort((second[keep], first[keep], -values[keep]))]
    parent = list(range(n))
    size = [1] * n

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for k in order.tolist():
        a, b = root(int(first[k])), root(int(second[k]))
        if a != b and size[a] + size[b] <= most:
            parent[b] = a
            size[a] += size[b]
    return [root(i) for i in range(n)]


def _overlaps(texts: Sequence[str]) -> Matrix:
    """Pairwise word overlap (Jaccard of stems), upper triangle; off the event loop."""
    words = [frozenset(stems(t)) for t in texts]
    n = len(texts)
    out = np.zeros((n, n), dtype=np.float32)
    for i in range(n):
        for j in range(i + 1, n):
            union = len(words[i] | words[j])
            out[i, j] = len(words[i] & words[j]) / union if union else 0.0
    return out


def _fingerprint(group: Sequence[Record]) -> str:
    """What an insight was made from: its sources and their texts."""
    parts = sorted(f"{r.id}:{hashlib.sha256(r.content.encode()).hexdigest()[:16]}" for r in group)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _keywords(texts: Sequence[str]) -> list[str]:
    """Up to 12 words that most of the texts use (stop words left out), ties by first use."""
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update({w for w in content_words(text) if len(w) > 2 and not w.isdigit()})
    return [w for w, n in counts.most_common() if n > 1][:_KEYWORDS]


def _rule_summary(group: Sequence[Record], keywords: Sequence[str]) -> str:
    """Highlights (the group's best facts, shortened) and keywords."""
    topic = ", ".join(keywords[:4]) or "one topic"
    lines = [f"{len(group)} related memories about {topic}:"]
    ranked = sorted(group, key=lambda r: (-ranker.importance(r), -r.access_count, r.id))
    for record in ranked[:_HIGHLIGHTS]:
        flat = " ".join(record.content.split())
        if len(flat) > _HIGHLIGHT_CHARS:
            flat = flat[: _HIGHLIGHT_CHARS - 1].rstrip() + "…"
        lines.append(f"- {flat}")
    if keywords:
        lines.append("Keywords: " + ", ".join(keywords))
    return "\n".join(lines)
