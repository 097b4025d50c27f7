"""A separate process for the reliability tests: a server's writes, searches, a migration.

Usage: python worker.py MODE STORE CWD [ARGS...]; it prints "ready", waits for a line
on stdin (the go signal), then (STORE is a storage URL, for ``migrate`` a SQLite file):

- ``crash``: stores numbered facts forever, printing each acknowledged id at once
  (the parent kills it with SIGKILL at some point);
- ``deferred``: the same with facts of several sentences, whose other passages are
  embedded after the acknowledgement - here never, so that the kill lands between
  the two;
- ``soak SECONDS NAME [USER]``: stores shared facts (in several wordings) and facts of
  its own, and searches, for SECONDS; prints a JSON summary (acknowledged ids,
  errors, latencies); as USER, some of its own facts are personal, and a search
  hit USER may not read is reported as a leak;
- ``migrate``: applies the migrations plus a slow extra one, printing "inside"
  half-way (the parent kills it there).
"""

from __future__ import annotations

import json
import random
import sqlite3
import sys
import time
import traceback
from pathlib import Path

import anyio

from helpers.processes import wait_for_go
from helpers.storage import open_url
from memory_mcp import engine as engine_module
from memory_mcp.service import MemoryService
from memory_mcp.storage.sqlite.driver import choose_driver
from memory_mcp.storage.sqlite.migrations import MIGRATIONS, Migration, migrate

# Facts every soak process stores, each in wordings that fold into one record.
SHARED = [  # rewordings (folded by comparison), and repeats (folded by their normal form)
    ["Run the linter with make lint before pushing", "Run the linter with make lint before a push"],
    ["The API server listens on port 8080", "The API server is listening on port 8080",
     "the API server listens on port 8080."],
    ["Deploys go through GitHub Actions to Fly.io",
     "Deployment goes through GitHub Actions to Fly.io"],
    ["Never commit .env files", "Never commit the .env files", "Never commit .env files!"],
    ["Use uv for installs", "Use uv for all installs", "use UV for installs."],
    ["Integration tests need Docker running",
     "The integration tests need Docker to be running"],
    ["Database migrations use Alembic", "Database migrations are done with Alembic"],
]  # fmt: skip


async def crash(url: str, cwd: str) -> None:
    async with open_url(url) as memory:
        wait_for_go()
        n = int(time.time() * 1000) % 1_000_000
        while True:
            n += 1
            result = await memory.store(
                f"Crash fact {n}: module m{n} belongs to team t{n % 7}", cwd=cwd
            )
            print(result.id, flush=True)


DEFERRED_FACT = (
    "Deferred fact {n}: module m{n} belongs to team t{n}. Its owners review every change "
    "to the billing rules before a release. The nightly job for m{n} runs at two in the "
    "morning and pages the on-call engineer when it fails."
)


async def deferred(url: str, cwd: str) -> None:
    engine_module._QUIET_S = engine_module._DUE_WAIT_S = 3600.0  # never quiet enough
    async with open_url(url) as memory:
        wait_for_go()
        n = int(time.time() * 1000) % 1_000_000
        while True:
            n += 1
            print((await memory.store(DEFERRED_FACT.format(n=n), cwd=cwd)).id, flush=True)


async def soak(url: str, cwd: str, seconds: str, name: str, user: str = "") -> None:
    """Store and search for ``seconds``. With ``user`` (team mode), as that user: some
    writes personal (global, or private), and every search hit checked to be one the
    user may read (what was not is reported under "leaks")."""
    rng = random.Random(name)
    acked: list[str] = []
    personal: list[str] = []
    leaks: list[str] = []
    errors: list[str] = []
    store_ms: list[float] = []
    search_ms: list[float] = []
    async with open_url(url) as memory:
        wait_for_go()
        with MemoryService.acting_as(user or None):
            me = memory.engine.user
            deadline = time.monotonic() + float(seconds)
            n = 0
            while time.monotonic() < deadline:
                n += 1
                roll = rng.random()
                started = time.perf_counter()
                try:
                    if roll < 0.4:
                        text = rng.choice(rng.choice(SHARED))
                        acked.append((await memory.store(text, cwd=cwd, agent=name)).id)
                        store_ms.append((time.perf_counter() - started) * 1000)
                    elif roll < 0.7:
                        text = f"{name} note {n}: job {n} of {name} runs at {n % 24}:00"
                        mine = user and roll < 0.55
                        where = {"scope": "global"} if mine and roll < 0.5 else {"cwd": cwd}
                        result = await memory.store(
                            text, agent=name, private=bool(mine and roll >= 0.5), **where
                        )
                        acked.append(result.id)
                        if mine:
                            personal.append(result.id)
                        store_ms.append((time.perf_counter() - started) * 1000)
                    else:
                        query = rng.choice(["lint before push", "installs", "port", "deploy", name])
                        found = await memory.search(query, cwd=cwd)
                        leaks += [h.record.id for h in found.hits if not h.record.visible_to(me)]
                        search_ms.append((time.perf_counter() - started) * 1000)
                except Exception:
                    errors.append(traceback.format_exc(limit=3))
    print(
        json.dumps(
            {
                "user": me,
                "acked": acked,
                "personal": personal,
                "leaks": leaks,
                "errors": errors,
                "store_ms": store_ms,
                "search_ms": search_ms,
            }
        ),
        flush=True,
    )


def slow_migration(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE half_done (x INTEGER)")
    conn.execute("INSERT INTO half_done VALUES (1)")
    print("inside", flush=True)
    time.sleep(60)  # killed here
    conn.execute("CREATE TABLE never_reached (x INTEGER)")


def migrate_slowly(db: str) -> None:
    driver = choose_driver("auto")
    conn = driver.connect(db, busy_timeout_ms=15000)
    wait_for_go()
    migrate(
        conn,
        db_path=Path(db),
        connect=lambda path: driver.connect(path, busy_timeout_ms=15000),
        migrations=(*MIGRATIONS, Migration("m999_slow", slow_migration)),
    )


if __name__ == "__main__":
    mode, store, *rest = sys.argv[1:]
    if mode == "crash":
        anyio.run(crash, store, rest[0])
    elif mode == "deferred":
        anyio.run(deferred, store, rest[0])
    elif mode == "soak":
        anyio.run(soak, store, *rest[:4])
    elif mode == "migrate":
        migrate_slowly(store)
    else:
        raise SystemExit(f"unknown mode {mode}")
