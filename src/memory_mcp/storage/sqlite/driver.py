"""Which SQLite module to use, so that sqlite-vec loads on every Python.

Python's own ``sqlite3`` can load extensions only when Python was built to
allow it; pyenv's default builds and macOS's system Python cannot. There the
``sqlean.py`` wheel (Linux, macOS, Windows), or ``pysqlite3-binary`` (Linux),
is a drop-in ``sqlite3`` module that can. ``auto`` takes the first that loads
sqlite-vec and has FTS5; if none can, the store still works on the lexical
floor and ``status`` says why.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import math
import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

import anyio

if TYPE_CHECKING:
    import aiosqlite

log = logging.getLogger(__name__)

DriverName = Literal["auto", "sqlite3", "sqlean", "pysqlite3"]
_MODULES: dict[str, str] = {
    "sqlite3": "sqlite3",
    "sqlean": "sqlean",
    "pysqlite3": "pysqlite3.dbapi2",
}
_AUTO_ORDER = ("sqlite3", "sqlean", "pysqlite3")


@dataclass(frozen=True)
class Driver:
    """A usable SQLite module and what it can do."""

    name: str
    module: ModuleType
    sqlite_version: str
    vectors: bool
    vec_version: str | None
    note: str = ""

    def describe(self) -> str:
        vec = f"sqlite-vec {self.vec_version}" if self.vectors else "no sqlite-vec"
        text = f"{self.name} (SQLite {self.sqlite_version}, {vec})"
        return f"{text}: {self.note}" if self.note else text

    def connect(self, path: str, *, busy_timeout_ms: int) -> sqlite3.Connection:
        """Open a connection in autocommit mode with sqlite-vec loaded when available."""
        conn: sqlite3.Connection = self.module.connect(
            path,
            timeout=busy_timeout_ms / 1000,
            isolation_level=None,
            check_same_thread=False,
        )
        if self.vectors:
            _load_vec(conn)
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        _ensure_exp(conn)
        return conn


def _ensure_exp(conn: sqlite3.Connection) -> None:
    """SQL ``exp()`` for the ranker's prior (``ranker.sql_prior``), on builds without math."""
    try:
        conn.execute("SELECT exp(0)").fetchone()
    except Exception:  # the module's own OperationalError: no math functions compiled in
        conn.create_function("exp", 1, math.exp, deterministic=True)


def _vec_path() -> str:
    """Where the sqlite-vec package keeps its loadable extension (``vec0``).

    The same path ``sqlite_vec.loadable_path()`` gives, found without importing
    the package, which imports numpy (0.15 s) for helpers the store does not use.
    """
    spec = importlib.util.find_spec("sqlite_vec")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the sqlite-vec package is not installed")
    return os.path.join(next(iter(spec.submodule_search_locations)), "vec0")


def _load_vec(conn: Any) -> str:
    conn.enable_load_extension(True)
    try:
        conn.load_extension(_vec_path())
    finally:
        conn.enable_load_extension(False)
    return str(conn.execute("SELECT vec_version()").fetchone()[0])


def _probe(name: str) -> Driver | str:
    """A Driver for ``name``, or why it cannot be used."""
    try:
        module = importlib.import_module(_MODULES[name])
    except ImportError:
        return f"{name}: not installed"
    conn = module.connect(":memory:")
    try:
        try:
            conn.execute("CREATE VIRTUAL TABLE t USING fts5(x)")
        except Exception as exc:  # the module's own OperationalError
            return f"{name}: no FTS5 ({exc})"
        version = str(module.sqlite_version)
        if not hasattr(conn, "enable_load_extension"):
            return f"{name}: this build cannot load SQLite extensions"
        try:
            vec_version = _load_vec(conn)
        except Exception as exc:
            return f"{name}: sqlite-vec did not load ({exc})"
        return Driver(name, module, version, True, vec_version)
    finally:
        conn.close()


def choose_driver(preference: DriverName = "auto") -> Driver:
    """The SQLite module to use: the preferred one, or the first that loads sqlite-vec."""
    names = _AUTO_ORDER if preference == "auto" else (preference,)
    reasons: list[str] = []
    for name in names:
        found = _probe(name)
        if isinstance(found, Driver):
            if reasons:
                log.info("SQLite driver %s chosen; skipped: %s", name, "; ".join(reasons))
            return found
        reasons.append(found)
    note = "vectors off, lexical search only (" + "; ".join(reasons) + ")"
    log.warning("no SQLite driver can load sqlite-vec: %s", note)
    return Driver("sqlite3", sqlite3, sqlite3.sqlite_version, False, None, note)


def _error_classes(name: str) -> tuple[type[Exception], ...]:
    """``name`` (OperationalError, DatabaseError, Error) of every SQLite module there is.

    sqlean's and pysqlite3's exceptions do not derive from ``sqlite3``'s, so
    catching ``sqlite3.OperationalError`` alone misses them.
    """
    classes: list[type[Exception]] = [getattr(sqlite3, name)]
    for module_name in ("sqlean", "pysqlite3.dbapi2"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        found = getattr(module, name, None)
        if isinstance(found, type) and issubclass(found, Exception) and found not in classes:
            classes.append(found)
    return tuple(classes)


OPERATIONAL_ERRORS = _error_classes("OperationalError")
DATABASE_ERRORS = _error_classes("DatabaseError")
ERRORS = _error_classes("Error")


_DRIVERS: dict[str, Driver] = {}
T = TypeVar("T")


async def on_thread(conn: aiosqlite.Connection, routine: Callable[..., T], *args: Any) -> T:
    """``routine(connection, *args)`` on ``conn``'s own thread, with its sqlite3 connection.

    Each statement sent through aiosqlite is a round trip between the event loop
    and the connection's thread (25-75 us, more while the model holds both cores);
    a routine of several statements whose each step needs no ``await`` (a record's
    insert with its vectors, the end of a write transaction) runs as one. aiosqlite
    has no public call for this: its queue's ``_execute`` is the one every public
    method goes through (``tests/storage/test_sqlite_thread.py`` checks it is there).
    """
    return cast(T, await conn._execute(lambda: routine(conn._conn, *args)))  # type: ignore[no-untyped-call]


async def cached_driver(preference: DriverName) -> Driver:
    if preference not in _DRIVERS:
        _DRIVERS[preference] = await anyio.to_thread.run_sync(choose_driver, preference)
    return _DRIVERS[preference]
