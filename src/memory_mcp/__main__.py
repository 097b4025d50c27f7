"""``python -m memory_mcp``: the same as the ``memory-mcp`` command."""

from memory_mcp.front import main

main()
