"""Lossless export and import: JSONL, every field, archived records and history too.

    {"type": "header", "format": "memory-mcp-export", "version": 3, ...}
    {"type": "record", "id": "f_01...", "corpus": "facts", ... every Record field}
    {"type": "conflict", "id": 3, "record_id": "f_...", "other_id": "f_...", ...}
    {"type": "alias", "alias": "/home/me/app", "key": "github.com/org/app", ...}

Record lines carry who wrote each record and whether it is private (version 3;
an older file's records are shared and of no known user). Alias lines
(version 2) are the scope aliases of the keys the records are stored
under (``identity``): an import keeps them, detached ones detached, and never
changes an alias the store already has.

Vectors are not exported (they depend on the embedder, and can be rebuilt):
import writes each record exactly, then embeds the current ones with the
active embedder. Import is idempotent: a record whose id exists is skipped, so
an interrupted import can simply be run again.

An export is a backup, so it is lossless: its file, like the database, is
readable by its owner only. Import applies the current secret rules to what it
adds (unless ``write.secrets`` is off), as any write does: a file written
before a rule existed does not bring its secrets back into the store.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator, Callable, Collection, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TextIO

import anyio

from memory_mcp.engine import Engine
from memory_mcp.errors import InvalidInput
from memory_mcp.identity import identify
from memory_mcp.records import Conflict, Record, format_time, utcnow
from memory_mcp.scope import GLOBAL_KEY
from memory_mcp.secret_scan import redact_record
from memory_mcp.storage.base import ScopeAlias

EXPORT_FORMAT = "memory-mcp-export"
EXPORT_VERSION = 3  # 2: alias lines; 3: a record's user and private flag
_IMPORT_BATCH = 500

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportSummary:
    records: int
    conflicts: int
    aliases: int = 0


@dataclass(frozen=True)
class ImportSummary:
    records_added: int
    records_skipped: int
    conflicts_added: int
    embedded: int
    awaiting_embedding: int
    aliases_added: int = 0


def open_private(path: Path) -> TextIO:
    """Open ``path`` to write an export into, readable by its owner only (0600, whatever
    the umask, and also when the file was already there)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        return os.fdopen(fd, "w", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def header_line() -> str:
    """The first line of an export file."""
    header = {
        "type": "header",
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "exported_at": format_time(utcnow()),
    }
    return json.dumps(header)


def record_line(record: Record) -> str:
    """One record's line of an export file."""
    return json.dumps({"type": "record", **record.to_json()}, ensure_ascii=False)


async def export_jsonl(engine: Engine, out: TextIO) -> ExportSummary:
    """Write the whole store to ``out``."""
    out.write(header_line() + "\n")
    records = 0
    keys: set[str] = set()
    async for record in engine.store.iter_records():
        out.write(record_line(record) + "\n")
        records += 1
        keys.add(record.scope_key)
    conflicts = await engine.store.conflicts()
    for conflict in conflicts:
        out.write(json.dumps({"type": "conflict", **conflict.to_json()}, ensure_ascii=False) + "\n")
    aliases = await engine.store.alias_of(sorted(keys))
    for alias in aliases.values():
        out.write(json.dumps({"type": "alias", **asdict(alias)}, ensure_ascii=False) + "\n")
    return ExportSummary(records, len(conflicts), len(aliases))


def parse_export(lines: Iterable[str]) -> tuple[list[Record], list[Conflict], list[ScopeAlias]]:
    """Read an export completely before anything is written.

    Raises:
        InvalidInput: the file is not a memory-mcp export, or a line is malformed
            (the message names the line).
    """
    records: list[Record] = []
    conflicts: list[Conflict] = []
    aliases: list[ScopeAlias] = []
    seen_header = False
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data: Any = json.loads(line)
            kind = data.get("type") if isinstance(data, dict) else None
            if kind != "header" and not seen_header:
                raise InvalidInput(
                    f"line {number}: the file does not start with a memory-mcp header"
                )
            if kind == "header":
                if data.get("format") != EXPORT_FORMAT:
                    raise ValueError(f"format is {data.get('format')!r}, not {EXPORT_FORMAT}")
                if int(data.get("version", 0)) > EXPORT_VERSION:
                    raise ValueError(
                        f"version {data.get('version')} is newer than this memory-mcp reads "
                        f"({EXPORT_VERSION}); upgrade memory-mcp"
                    )
                seen_header = True
            elif kind == "record":
                records.append(Record.from_json(data))
            elif kind == "conflict":
                conflicts.append(Conflict.from_json(data))
            elif kind == "alias":
                aliases.append(_alias(data))
            else:
                raise ValueError(f"unknown line type {kind!r}")
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidInput(f"line {number}: not a memory-mcp export line ({exc})") from None
    if not seen_header:
        raise InvalidInput("the file is empty; it is not a memory-mcp export")
    return records, conflicts, aliases


def _alias(data: dict[str, Any]) -> ScopeAlias:
    fields = {k: data.get(k) for k in ("alias", "key", "attached_at", "detached_at")}
    if not all(isinstance(fields[k], str) for k in ("alias", "key", "attached_at")):
        raise ValueError("an alias line needs alias, key and attached_at")
    if fields["detached_at"] is not None and not isinstance(fields["detached_at"], str):
        raise ValueError("detached_at must be a time or null")
    return ScopeAlias(**fields)  # type: ignore[arg-type]


async def import_jsonl(
    engine: Engine,
    lines: Iterable[str],
    *,
    progress: Callable[[int, int], None] | None = None,
    embed_progress: Callable[[int, int], None] | None = None,
) -> ImportSummary:
    """Add an export's records, conflicts and aliases to the store, then embed what is
    current.

    Args:
        progress: called with (records written, records in the file).
        embed_progress: called with (records embedded, records to embed).
    """
    records, conflicts, aliases = parse_export(lines)
    batches = [records[i : i + _IMPORT_BATCH] for i in range(0, len(records), _IMPORT_BATCH)]
    return await _add(
        engine, _each(batches), conflicts, aliases, len(records), progress, embed_progress
    )


async def push(
    source: Engine,
    target: Engine,
    *,
    map_key: Callable[[str], str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    embed_progress: Callable[[int, int], None] | None = None,
) -> ImportSummary:
    """Copy every record, conflict and alias of ``source`` into ``target``, then embed there.

    Records keep their ids, so a push run again (or after an interruption) adds
    only what is missing. Each scope key goes to its portable key (``portable_keys``:
    a project's old path key becomes its identity, which another machine's
    clone of the project also has), or to what ``map_key`` says; aliases keep
    their names and point at the mapped keys. What the source's own user wrote (or
    no one known) is the target's user's there, so that the global scope of a local
    store becomes its pusher's personal scope in a team's store.

    Args:
        progress: called with (records copied, records in the source).
        embed_progress: called with (records embedded, records to embed).
    """
    total = sum((await source.store.stats()).records.values())
    mapped: dict[str, str] = {}

    async def known(keys: Collection[str]) -> None:
        fresh = [k for k in keys if k not in mapped]
        if map_key is not None:
            mapped.update((k, map_key(k)) for k in fresh)
        elif fresh:
            mapped.update(await portable_keys(source, fresh))

    async def batches() -> AsyncIterator[list[Record]]:
        batch: list[Record] = []
        async for record in source.store.iter_records():
            batch.append(record)
            if len(batch) == _IMPORT_BATCH:
                yield await moved(batch)
                batch = []
        if batch:
            yield await moved(batch)

    # What this machine's user wrote becomes the pusher's in the target (their role in a
    # team's database): their global memories land in their personal scope there. (A
    # record of unknown writer becomes theirs in ``_add``, as on import.)
    local = source.store.user

    def writer(record: Record) -> str:
        return target.user if record.user == local else record.user

    async def moved(batch: list[Record]) -> list[Record]:
        await known({r.scope_key for r in batch})
        return [replace(r, scope_key=mapped[r.scope_key], user=writer(r)) for r in batch]

    found = await source.store.conflicts()
    await known({c.scope_key for c in found})
    conflicts = [replace(c, scope_key=mapped[c.scope_key]) for c in found]
    summary = await _add(target, batches(), conflicts, [], total, progress, embed_progress)
    rows = (await source.store.alias_of(sorted(mapped))).values()
    await known({a.key for a in rows})
    aliases = [replace(a, key=mapped[a.key]) for a in rows if a.alias != mapped[a.key]]
    return replace(summary, aliases_added=await _add_aliases(target, aliases))


async def portable_keys(engine: Engine, keys: Collection[str]) -> dict[str, str]:
    """Each scope key and the key another machine knows its project by: the project it
    is an attached alias of, else the identity of the directory it names when that is a
    project on this machine (a key from before identities was its path), else itself."""
    aliases = await engine.store.alias_of(keys)
    attached = {k: a.key for k, a in aliases.items() if a.attached}
    rest = [k for k in keys if k not in attached]
    return {**attached, **await anyio.to_thread.run_sync(_identities, rest)}


def _identities(keys: list[str]) -> dict[str, str]:
    """Each key, or the identity of the project directory it names (off the event loop)."""
    out: dict[str, str] = {}
    for key in keys:
        if key != GLOBAL_KEY and os.path.isabs(key) and os.path.isdir(key):
            out[key] = identify(Path(os.path.realpath(key))).key
        else:
            out[key] = key
    return out


async def _each(batches: list[list[Record]]) -> AsyncIterator[list[Record]]:
    for batch in batches:
        yield batch


async def _add(
    engine: Engine,
    batches: AsyncIterator[list[Record]],
    conflicts: list[Conflict],
    aliases: list[ScopeAlias],
    total: int,
    progress: Callable[[int, int], None] | None,
    embed_progress: Callable[[int, int], None] | None,
) -> ImportSummary:
    """Write records exactly (an id already there is skipped), conflicts and aliases,
    then embed."""
    redacts = engine.settings.write.secrets != "off"
    added = skipped = done = 0
    async for batch in batches:
        async with engine.store.write() as tx:
            for record in batch:
                if redacts:
                    record = redact_record(record)[0]
                # The vectors are not carried over: the record waits for the re-embed. A
                # record of unknown writer becomes the importer's (a team's database lets
                # a member write only their own rows).
                copy = replace(record, embedder=None, user=record.user or engine.user)
                if await tx.insert_raw(copy):
                    added += 1
                else:
                    skipped += 1
        done += len(batch)
        if progress is not None:
            progress(done, total)
    conflicts_added = 0
    if conflicts:
        async with engine.store.write() as tx:
            for conflict in conflicts:
                conflicts_added += int(await tx.import_conflict(conflict))
    aliases_added = await _add_aliases(engine, aliases)
    embedded = 0
    await engine.embeddings.settle()
    if engine.embeddings.ready and added:
        embedded = (await engine.reembed(progress=embed_progress)).embedded
    if added:  # the planner's statistics, before the first search over them
        try:
            await engine.store.analyze()
        except Exception:  # the records are written: autovacuum will analyze them
            log.warning("could not analyze the store after the import", exc_info=True)
    awaiting = await engine.store.count_needing_embedding(engine.embeddings.identity)
    return ImportSummary(added, skipped, conflicts_added, embedded, awaiting, aliases_added)


async def _add_aliases(engine: Engine, aliases: list[ScopeAlias]) -> int:
    """Add the aliases the store has no row for (detached ones stay detached); how many."""
    added = 0
    if aliases:
        async with engine.store.write() as tx:
            for alias in aliases:
                if await tx.add_alias(alias.alias, alias.key, alias.attached_at, replace=False):
                    added += 1
                    if alias.detached_at is not None:
                        await tx.remove_alias(alias.alias, alias.detached_at)
    return added
