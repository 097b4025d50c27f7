"""The ``memory-mcp`` command line: argument parsing around one engine call each.

``app`` assembles the commands, one module per group: ``memories`` (store,
search, forget, brief), ``serve``, ``agents`` (inject, run, install), ``status``,
``transfer`` (export, import, ingest) and ``upkeep`` (maintain, conflicts,
restore, doctor, backup); ``base`` is what they share. The benchmarks are
``memory_mcp.bench.cli``.

Human-readable output by default, ``--json`` for scripts. Exit codes: 0 done,
1 unexpected error, 2 usage error, 65 bad input, 66 not found, 69 embedder
unavailable, 74 storage error, 78 configuration error.
"""
