"""The maintenance tasks but insights (``maintenance.insights``), each a function of
its ``TaskRun``: secrets, reembed, consolidate, staleness, purge.

Each works in small transactions, renewing its lease between them, and returns
a ``TaskReport`` of counts (what a dry run would do, on a dry run).
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from memory_mcp.engine import EMBED_BATCH
from memory_mcp.errors import EmbedderError
from memory_mcp.fold import judge
from memory_mcp.llm import refine_prompt
from memory_mcp.maintenance.context import BATCH, TaskReport, TaskRun
from memory_mcp.records import CORPORA, Record, format_time
from memory_mcp.secret_scan import FINGERPRINT, redact_record
from memory_mcp.storage.base import Filters, TaskState
from memory_mcp.write import absorb, neighbours

_REEMBED_ROUND = 512  # records re-embedded between two lease renewals

# secrets ---------------------------------------------------------------------------


def secrets_not_due(secrets_setting: str, state: TaskState) -> str:
    """Why the secrets task is not due ('' when it is)."""
    if secrets_setting == "off":
        return "write.secrets is off"
    if state.cursor.get("rules") == FINGERPRINT:
        return "the stored texts were scanned with the current rules"
    return ""


async def secrets(run: TaskRun) -> TaskReport:
    """Scan every stored text again when the secret rules changed since the last scan.

    A record stored before a rule existed keeps its secret in the database, the
    full-text index and its vectors until then (searches and the brief redact what
    they show meanwhile). Counts are by kind; no secret goes to a log or summary.
    """
    if run.engine.settings.write.secrets == "off":
        return TaskReport("secrets", skipped="write.secrets is off")
    if run.cursor.get("rules") == FINGERPRINT:
        return TaskReport("secrets")
    resuming = run.cursor.get("scanning") == FINGERPRINT
    mark = run.position() if resuming else None
    scanned, changed = 0, 0
    kinds: Counter[str] = Counter()
    while batch := await run.store.after(CORPORA, mark, BATCH, current_only=False):
        holding = [record.id for _, record in batch if redact_record(record)[1]]
        if holding:
            async with run.store.write() as tx:
                for record_id in holding:
                    record = await tx.get(record_id)  # as it is now, not as it was read
                    if record is None:
                        continue
                    clean, found_kinds = redact_record(record)
                    if found_kinds and await tx.rewrite_texts(clean):
                        changed += 1
                        kinds.update(found_kinds)
        scanned += len(batch)
        mark = batch[-1][0]
        run.cursor = {"scanning": FINGERPRINT, "seq": mark}
        await run.renew()
    run.cursor = {"rules": FINGERPRINT}
    counts = {"scanned": scanned, "redacted": changed, **dict(sorted(kinds.items()))}
    return TaskReport("secrets", counts=counts)


# reembed ---------------------------------------------------------------------------


async def reembed(run: TaskRun) -> TaskReport:
    embeddings = run.engine.embeddings
    identity = embeddings.identity
    if identity is None:
        return TaskReport("reembed", skipped="no dense embedder (lexical search only)")
    pending = await run.store.count_needing_embedding(identity)
    if not pending:
        return TaskReport("reembed")
    if not embeddings.ready:
        raise EmbedderError(
            f"{pending} records await vectors from {identity}, which is not ready: "
            f"{embeddings.status().reason}"
        )
    done = 0
    while True:
        summary = await run.engine.reembed(batch_size=EMBED_BATCH, most=_REEMBED_ROUND)
        done += summary.embedded
        if not summary.remaining or not summary.embedded:
            break
        await run.renew()
    return TaskReport("reembed", counts={"embedded": done}, pending=summary.remaining)


# consolidate -----------------------------------------------------------------------


async def consolidate(run: TaskRun) -> TaskReport:
    """Compare each fact written since the last sweep with its nearest facts."""
    if not run.settings.consolidate:
        return TaskReport("consolidate", skipped="maintenance.consolidate is off")
    identity = run.dense()
    run.store.forget_word_counts()  # fresh, as on a dry run's copy: the same candidates
    mark = run.position() if run.cursor.get("embedder") == identity else None
    counts: Counter[str] = Counter()
    compared = 0
    while True:
        batch = await run.store.after(("facts",), mark, BATCH)
        if not batch:
            break
        for seq, listed in batch:
            if run.sweep_budget is not None and compared >= run.sweep_budget:
                run.cursor = {"embedder": identity, "seq": mark}
                left = await run.store.count_after(("facts",), mark)
                return TaskReport("consolidate", counts=dict(counts), pending=left)
            record = await run.store.get(listed.id)
            if record is None or not record.current:
                mark = seq
                continue
            if identity is not None and record.embedder != identity:
                # Awaiting its vectors: the next run resumes here, after re-embedding.
                pending = await run.store.count_needing_embedding(identity)
                run.cursor = {"embedder": identity, "seq": mark}
                return TaskReport("consolidate", counts=dict(counts), pending=pending)
            action = await _consolidate_one(run, record, identity)
            if action:
                counts[action] += 1
            mark = seq
            compared += 1
        run.cursor = {"embedder": identity, "seq": mark}
        await run.renew()
    return TaskReport("consolidate", counts=dict(counts))


async def _consolidate_one(run: TaskRun, record: Record, identity: str | None) -> str | None:
    vectors = await run.store.vectors_of(record.id, identity) if identity else None
    filters = Filters(  # the same readers only, as on the write path (``write.apply``)
        scope_keys=await run.engine.same_scope(record.scope_key),
        corpora=("facts",),
        viewer=record.user,
        private=record.private,
    )
    fold_settings = run.engine.settings.fold
    found = await neighbours(run.store, record, vectors, identity, filters, fold_settings)
    for other, similarity in found:
        old, new = sorted((record, other), key=lambda r: (r.created_at, r.id))
        decision = judge(old.content, new.content, similarity, fold_settings)
        if decision.action == "insert":
            continue
        if await run.store.conflict_between(old.id, new.id):
            continue  # in the inbox, or settled by a person (kept both, a fold undone)
        return await _apply(run, decision.action, decision.reason, old, new, identity)
    return None


async def _apply(
    run: TaskRun, action: str, reason: str, old: Record, new: Record, identity: str | None
) -> str | None:
    """Write one decision of the sweep, if both records are still as they were read."""
    at = format_time(run.engine.clock())
    async with run.store.write() as tx:
        old_now, new_now = await tx.get(old.id), await tx.get(new.id)
        if (
            old_now is None
            or new_now is None
            or not (old_now.current and new_now.current)
            or (old_now.content, new_now.content) != (old.content, new.content)
        ):
            return None
        if action == "fold":
            entry = absorb(new_now, old_now, at)
            await tx.update_merged(new_now, at)
            if identity is not None and old_now.embedder == new_now.embedder == identity:
                await tx.carry_vectors(old_now.id, new_now.id, identity)
            await tx.fold_into(old_now, new_now.id, entry, at)
        elif action == "supersede":
            history = [*old_now.supersedes, old_now.id]
            new_now.supersedes = list(dict.fromkeys([*history, *new_now.supersedes]))
            await tx.update_merged(new_now, at)
            await tx.replace(old_now, new_now.id)
        else:
            await tx.add_conflict(new_now.scope_key, new_now.id, old_now.id, reason, at)
    if action == "fold":
        await _refine(run, new_now)
    return {"fold": "folded", "supersede": "superseded", "conflict": "conflicts"}[action]


async def _refine(run: TaskRun, record: Record) -> None:
    """Let the LLM write a folded record's texts as one statement (if one is configured)."""
    if run.llm is None or run.dry_run:
        return
    texts = [record.content, *(m.content for m in record.merged_from)]
    text = await run.ask(refine_prompt(texts))
    if text is None or text == record.content:
        return
    at = format_time(run.engine.clock())
    previous = [*record.meta.get("previous_texts", [])]
    previous.append({"content": record.content, "replaced_at": at, "by": run.llm.name})
    record.meta = {**record.meta, "previous_texts": previous}
    record.content = text
    async with run.store.write() as tx:
        changed = await tx.set_content(record, at)
    if changed:
        await run.engine.embed_stored([record.id])


# staleness -------------------------------------------------------------------------


async def staleness(run: TaskRun) -> TaskReport:
    days = run.settings.dormant_days
    if days < 0:
        return TaskReport("staleness", skipped="maintenance.dormant_days is negative (off)")
    now = run.engine.clock()
    quiet_since = format_time(now - timedelta(days=days))
    created_before = format_time(now - timedelta(days=run.settings.stale_days))
    at = format_time(now)
    counts: Counter[str] = Counter()
    activity = await run.store.project_activity()
    # A project is dormant when none of its keys (its own, its aliases') saw activity.
    for keys in (await run.engine.projects_of(sorted(activity))).values():
        if max(activity[k] for k in keys) >= quiet_since:
            continue
        archived = 0
        for scope_key in keys:
            while facts := await run.store.unused_facts(scope_key, created_before, BATCH):
                async with run.store.write() as tx:
                    for fact in facts:
                        archived += await tx.archive(fact.id, "dormant", at)
                await run.renew()
        if archived:
            counts["archived"] += archived
            counts["projects"] += 1
    return TaskReport("staleness", counts=dict(counts))


# purge -----------------------------------------------------------------------------


async def purge(run: TaskRun) -> TaskReport:
    now = run.engine.clock()
    before = format_time(now - timedelta(days=run.settings.grace_days))
    purged = 0
    while old := await run.store.archived(before=before, limit=BATCH):
        async with run.store.write() as tx:
            purged += await tx.purge([r.id for r in old], before, format_time(now))
        await run.renew()
    counts = {"purged": purged}
    if freed := await run.store.prune_caches():  # kept vectors of scopes now without any
        counts["MB of kept vectors freed"] = max(1, round(freed / 1e6))
    return TaskReport("purge", counts=counts)
