"""What the tests spell out once: the real model, worker processes, MCP tool calls, waits.

Test modules import from here (``from helpers.processes import ...``), never from
each other or from ``conftest``, which holds only fixtures and pytest hooks.
"""
