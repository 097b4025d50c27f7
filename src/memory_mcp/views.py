"""What results look like outside the engine: one shape for the MCP tools and ``--json``.

The MCP server's result models (``mcp/tools.py``) are built from these dicts, and
the CLI prints them, so a script that reads ``memory-mcp search --json`` and an
agent that reads ``memory_search`` see the same field names.

A hit's ``meta`` holds what only some hits have: a document chunk's ``path``
and ``heading``, ``tags``, the value it ``supersedes`` (the older record it
replaced: that one is history, not current), and the open ``conflict`` it is
in (the record it contradicts and the conflict's number in the inbox).
"""

from __future__ import annotations

from typing import Any

from memory_mcp.records import Hit, Record, SearchResult, StoreResult
from memory_mcp.scope import Project

# Characters of a related record's text a hit's meta carries.
RELATED_CHARS = 300


def stored(result: StoreResult) -> dict[str, Any]:
    """``memory_store``'s answer."""
    return {
        "id": result.id,
        "action": result.action,
        "related_id": result.related_id or "",
        "related_content": result.related_content or "",
        "conflict_id": result.conflict_id or 0,
        "redacted": [f"{r.kind} x{r.count}" for r in result.redactions],
        "reason": result.reason,
    }


def found(hit: Hit) -> dict[str, Any]:
    """One search result."""
    record = hit.record
    meta: dict[str, Any] = {k: record.meta[k] for k in ("path", "heading") if k in record.meta}
    if record.tags:
        meta["tags"] = list(record.tags)
    meta.update(hit.notes)
    return {
        "id": record.id,
        "content": record.content,
        "corpus": record.corpus,
        "kind": record.kind,
        "score": round(hit.score, 4),
        "agent": record.agent,
        "created_at": record.created_at,
        "meta": meta,
    }


def results(result: SearchResult) -> dict[str, Any]:
    """``memory_search`` / ``project_search``'s answer."""
    return {
        "results": [found(h) for h in result.hits],
        "mode": result.mode,
        "warnings": list(result.warnings),
    }


def related(record: Record) -> dict[str, Any]:
    """Another record, briefly: what a hit supersedes or contradicts."""
    text = record.content
    if len(text) > RELATED_CHARS:
        text = text[: RELATED_CHARS - 1] + "…"
    return {"id": record.id, "content": text, "created_at": record.created_at}


def forgotten(record: Record) -> dict[str, Any]:
    """``memory_forget``'s answer."""
    return {
        "id": record.id,
        "archived_at": record.archived_at or "",
        "reason": record.archived_reason or "",
    }


def project(found: Project) -> dict[str, Any]:
    """A project's identity: its key, which rule found it from what, its root on disk,
    and its aliases (detached ones stay listed, with when)."""
    identity = found.identity
    return {
        "key": identity.key,
        "how": identity.how,
        "source": identity.source,
        "root": str(identity.root),
        "aliases": [
            {"alias": a.alias, "attached_at": a.attached_at, "detached_at": a.detached_at}
            for a in found.aliases
        ],
    }
