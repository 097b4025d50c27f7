"""The ``memory-mcp`` command (and ``python -m memory_mcp``).

Standard library only until it knows what to run: ``--version`` and stdio
``serve`` (what an agent CLI spawns at every session start) must not pay for
importing the full command line, the MCP SDK or the engine.
"""

from __future__ import annotations

import sys

_FAST_FLAGS = ("--cwd", "--transport", "-t")


def fast_serve_args(argv: list[str]) -> tuple[bool, str | None]:
    """Whether the front serves these arguments (``serve`` over stdio, at most ``--cwd``).

    Returns:
        (True, the --cwd value or None), or (False, None) when the full command
        line must handle them (other options, help, another transport).
    """
    if not argv or argv[0] != "serve":
        return False, None
    cwd: str | None = None
    rest = argv[1:]
    while rest:
        arg = rest.pop(0)
        name, _, inline = arg.partition("=")
        if name not in _FAST_FLAGS:
            return False, None
        value = inline if inline else (rest.pop(0) if rest else None)
        if value is None:
            return False, None
        if name == "--cwd":
            cwd = value
        elif value != "stdio":
            return False, None
    return True, cwd


def main() -> None:
    """The ``memory-mcp`` command: the front for stdio ``serve``, else the full CLI."""
    if sys.argv[1:] == ["--version"]:
        from memory_mcp import __version__

        print(__version__)
        return
    fast, cwd = fast_serve_args(sys.argv[1:])
    if fast:
        from memory_mcp.mcp.front import run

        run(cwd)
    from memory_mcp.cli.app import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
