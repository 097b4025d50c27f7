"""The package's layers: no module imports, however indirectly, one that imports it back.

Every import counts, at module level or inside a function (a lazy import still
ties the two modules together); only ``if TYPE_CHECKING:`` blocks are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import memory_mcp

PACKAGE = Path(memory_mcp.__file__).parent


def _module_name(path: Path) -> str:
    parts = ["memory_mcp", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The package's modules that ``module`` imports (``from a import b`` counts ``a.b``
    when that is a module, else ``a``)."""
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in known else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    result: set[str] = set()
    for name in found:
        # ``memory_mcp.a.b`` counts as that module only, not as its package's
        # __init__: a package that re-exports its own modules (storage, embedders)
        # is not a dependency of those modules. Names that are not modules (a
        # function imported from a module) count as the module.
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != module:
            result.add(name)
    return result


def import_graph() -> dict[str, set[str]]:
    """Each module of ``memory_mcp`` and the package's modules it imports."""
    paths = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    known = set(paths)
    return {
        name: _imported(
            ast.parse(path.read_text(encoding="utf-8")), name, path.name == "__init__.py", known
        )
        for name, path in paths.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle in ``graph`` (first module repeated at the end), or None."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path: list[str] = []
        on_path: set[str] = set()
        stack: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        path.append(start)
        on_path.add(start)
        while stack:
            node, todo = stack[-1]
            if not todo:
                stack.pop()
                path.pop()
                on_path.discard(node)
                done.add(node)
                continue
            nxt = todo.pop(0)
            if nxt in on_path:
                return [*path[path.index(nxt) :], nxt]
            if nxt in done:
                continue
            stack.append((nxt, sorted(graph.get(nxt, ()))))
            path.append(nxt)
            on_path.add(nxt)
    return None


def test_imports_inside_functions_count_and_type_checking_ones_do_not() -> None:
    source = """
from typing import TYPE_CHECKING
from memory_mcp import errors
if TYPE_CHECKING:
    from memory_mcp.service import MemoryService
def f():
    from memory_mcp.config import load_settings
    from . import scope
"""
    known = {"memory_mcp.cli", "memory_mcp.config", "memory_mcp.errors", "memory_mcp.scope"}
    known |= {"memory_mcp.service"}
    found = _imported(ast.parse(source), "memory_mcp.cli", False, known)
    assert found == {"memory_mcp.config", "memory_mcp.errors", "memory_mcp.scope"}


def test_find_cycle_names_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circle_in_the_package() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


# The adapters: what parses input from a person or an agent CLI and formats the answer.
ADAPTERS = (
    "memory_mcp.__main__",
    "memory_mcp.cli",
    "memory_mcp.mcp",
    "memory_mcp.agents",
    "memory_mcp.viewer",
)


def _is_adapter(module: str) -> bool:
    return any(module == a or module.startswith(a + ".") for a in ADAPTERS)


def test_the_engine_imports_no_adapter() -> None:
    # The bench drives the product as a user would (it spawns the server and
    # injects briefs), so it sits beside the adapters, not under them.
    engine = {
        name: deps
        for name, deps in import_graph().items()
        if not _is_adapter(name) and not name.startswith("memory_mcp.bench")
    }
    crossing = sorted(
        f"{name} -> {dep}" for name, deps in engine.items() for dep in deps if _is_adapter(dep)
    )
    assert not crossing, "engine modules import adapters: " + ", ".join(crossing)


# What an adapter may import from below it: the facade and the words it speaks in
# (settings, errors, records, scopes, result views, terminal output, platform
# directories, the managed-block format, atomic file writes), never a feature module or
# the store.
FACADE = frozenset(
    {
        "memory_mcp",  # the version
        "memory_mcp.service",
        "memory_mcp.config",
        "memory_mcp.errors",
        "memory_mcp.records",
        "memory_mcp.scope",
        "memory_mcp.views",
        "memory_mcp.terminal",
        "memory_mcp.dirs",
        "memory_mcp.blocks",
        "memory_mcp.files",  # writing a file atomically
        "memory_mcp.bench.cli",  # the CLI mounts the bench's sub-app
    }
)
# The stdio front starts loading the model before it imports the MCP SDK, so the
# two overlap (about half a second at start); it must not wait for the service.
FACADE_EXCEPTIONS = frozenset({("memory_mcp.mcp.front", "memory_mcp.embedders.runtime")})


def test_adapters_reach_the_engine_only_through_the_facade() -> None:
    crossing = sorted(
        f"{name} -> {dep}"
        for name, deps in import_graph().items()
        if _is_adapter(name)
        for dep in deps
        if not _is_adapter(dep) and dep not in FACADE and (name, dep) not in FACADE_EXCEPTIONS
    )
    assert not crossing, "adapters import the engine past MemoryService: " + ", ".join(crossing)


def test_the_command_line_loads_no_numpy_until_something_is_embedded() -> None:
    # `brief --hook` runs at the start of every agent session: numpy's ~0.1 s load
    # belongs to the commands that embed or score vectors, not to the CLI's import.
    import subprocess
    import sys

    code = "import sys, memory_mcp.cli.app; print('numpy' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_no_file_holds_a_merge_conflict_left_unresolved() -> None:
    import re
    import subprocess

    root = PACKAGE.parent.parent
    listed = subprocess.run(
        ["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split()
    marker = re.compile(r"^(<{7}|>{7}) ", re.M)
    left = [
        name
        for name in listed
        if name.endswith((".py", ".md", ".toml", ".txt", ".yml", ".yaml", ".json"))
        and marker.search((root / name).read_text(encoding="utf-8", errors="replace"))
    ]
    assert not left, f"conflict markers in: {left}"
