"""The storage seam stays honest: nothing above ``storage/`` reaches a backend.

The engine, the adapters and the benchmarks are typed against
``storage.base.Store``; a backend is opened by ``storage.factory`` alone, and
lazily. These tests read the source with ``ast``, so an import inside a
function counts as much as one at the top.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "memory_mcp"
STORAGE = PACKAGE / "storage"

# The backends: each a subpackage of storage/ (and the one planned next).
BACKENDS = sorted({p.parent.name for p in STORAGE.glob("*/__init__.py")} | {"postgres"})
# Modules only a backend may import: its own package, database drivers, extensions.
BACKEND_MODULES = re.compile(
    rf"^(memory_mcp\.storage\.({'|'.join(BACKENDS)})|aiosqlite|sqlite3|sqlite_vec|sqlean|"
    r"pysqlite3|psycopg|psycopg2|asyncpg|pgvector)(\.|$)"
)
# Statements of a database's language (upper case, as every query in the code is written).
SQL = re.compile(
    r"\b(SELECT\b.+\bFROM|INSERT (OR \w+ )?INTO|UPDATE \w+ SET|DELETE FROM|"
    r"CREATE (VIRTUAL )?TABLE|PRAGMA \w+|BEGIN IMMEDIATE)\b|julianday\(|\bMATCH \?",
    re.DOTALL,
)
# A benchmark's own cache file of vectors (not the store): its SQLite is its business.
OWN_FILES = {"bench/vector_cache.py"}


def engine_modules() -> Iterator[tuple[str, ast.Module]]:
    """Every module above ``storage/``, by its path in the package, parsed."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if STORAGE in path.parents:
            continue
        name = path.relative_to(PACKAGE).as_posix()
        yield name, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def imported(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Each module an import statement names (``from a import b`` names ``a`` and ``a.b``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"


def texts(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Every string literal, the literal parts of f-strings included."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def leaks(
    found: Callable[[ast.Module], Iterator[tuple[int, str]]], pattern: re.Pattern[str]
) -> list[str]:
    """Where a module above storage/ has something ``pattern`` matches."""
    return [
        f"{name}:{line}: {text[:60]!r}"
        for name, tree in engine_modules()
        if name not in OWN_FILES
        for line, text in found(tree)
        if pattern.search(text)
    ]


def test_nothing_above_storage_imports_a_backend_or_its_driver() -> None:
    assert leaks(imported, BACKEND_MODULES) == []


def test_nothing_above_storage_holds_sql() -> None:
    assert leaks(texts, SQL) == []


def test_only_the_factory_opens_a_backend_and_only_when_asked() -> None:
    """``storage/__init__``, ``base`` and ``factory`` import no backend at import time;
    the factory imports one inside the function that opens it."""
    for name in ("__init__.py", "base.py", "factory.py"):
        tree = ast.parse((STORAGE / name).read_text(encoding="utf-8"))
        top = [
            module
            for node in tree.body
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            for _, module in imported(ast.Module(body=[node], type_ignores=[]))
            if BACKEND_MODULES.match(module)
        ]
        assert top == [], name
    factory = ast.parse((STORAGE / "factory.py").read_text(encoding="utf-8"))
    assert any(BACKEND_MODULES.match(module) for _, module in imported(factory))


def test_the_checks_see_what_they_are_meant_to_catch() -> None:
    """The two patterns match a backend import and a query, and not the seam."""
    leaky = ast.parse(
        "from memory_mcp.storage.sqlite import SqliteStore\n"
        "import sqlite3\n"
        "def f():\n"
        "    from memory_mcp.storage import base\n"
        "    q = f'SELECT id FROM records WHERE {w}'\n"
    )
    modules = [m for _, m in imported(leaky) if BACKEND_MODULES.match(m)]
    assert modules == [
        "memory_mcp.storage.sqlite",
        "memory_mcp.storage.sqlite.SqliteStore",
        "sqlite3",
    ]
    assert any(SQL.search(text) for _, text in texts(leaky))
    assert not SQL.search("Select the records you want from the list")
