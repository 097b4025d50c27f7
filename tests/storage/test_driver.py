"""A SQLite driver that loads sqlite-vec on every Python, including this one."""

from __future__ import annotations

import sqlite3

from memory_mcp.storage.driver import choose_driver


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
