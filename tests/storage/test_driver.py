"""A SQLite driver that loads sqlite-vec on every Python, including this one."""

from __future__ import annotations

import sqlite3

import pytest

from memory_mcp.storage.sqlite.driver import choose_driver

pytestmark = pytest.mark.sqlite_only


def test_auto_finds_a_driver_with_vectors_and_fts5() -> None:
    driver = choose_driver("auto")
    assert driver.vectors, driver.describe()
    conn = driver.connect(":memory:", busy_timeout_ms=1000)
    assert conn.execute("SELECT vec_version()").fetchone()[0].startswith("v")
    conn.execute("CREATE VIRTUAL TABLE t USING fts5(x)")


def test_auto_prefers_pythons_own_sqlite3_only_when_it_can_load_extensions() -> None:
    driver = choose_driver("auto")
    if hasattr(sqlite3.Connection, "enable_load_extension"):
        assert driver.name == "sqlite3"
    else:
        assert driver.name in ("sqlean", "pysqlite3")


def test_forcing_a_driver_that_cannot_load_extensions_falls_back_to_no_vectors() -> None:
    driver = choose_driver("sqlite3")
    if hasattr(sqlite3.Connection, "enable_load_extension"):
        assert driver.vectors
    else:
        assert not driver.vectors
        assert "cannot load SQLite extensions" in driver.describe()
        assert "lexical search only" in driver.describe()


def test_exp_is_there_for_the_ranker_even_without_math_functions() -> None:
    import sqlite3

    from memory_mcp.storage.sqlite.driver import _ensure_exp

    class NoMath:
        """A connection whose SQL has no exp(), as some SQLite builds."""

        def __init__(self) -> None:
            self.conn = sqlite3.connect(":memory:")
            self.added = False

        def execute(self, sql: str) -> sqlite3.Cursor:
            if "exp(" in sql and not self.added:
                raise sqlite3.OperationalError("no such function: exp")
            return self.conn.execute(sql)

        def create_function(self, name: str, narg: int, fn: object, **kw: object) -> None:
            self.conn.create_function(name, narg, fn, **kw)  # type: ignore[arg-type]
            self.added = True

    fake = NoMath()
    _ensure_exp(fake)  # type: ignore[arg-type]
    assert fake.added
    assert fake.execute("SELECT round(exp(1), 6)").fetchone() == (2.718282,)
