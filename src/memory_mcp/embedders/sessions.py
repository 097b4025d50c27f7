"""The options every onnxruntime session of a model runs with (the product's, and the
sessions ``graph`` checks a streamlined copy in)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnxruntime as ort


def session_options(threads: int = 0) -> ort.SessionOptions:
    """The options a model's session runs with (``graph`` checks its copies with them)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_cpu_mem_arena = False
    quiet(options)
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = threads
    return options


def quiet(options: ort.SessionOptions) -> None:
    """Idle inference threads sleep instead of spinning.

    onnxruntime's threads spin-wait after each run by default, holding a core
    the vector search that follows a store's embedding wants: scoring 108,834
    rows on two threads took 13.7 ms right after an embedding instead of 7.4,
    and a query's embedding cost 57.8 ms of CPU time instead of 10.3 (on a
    machine that several agents' servers share). Embedding is as fast without
    it (12.3 vs 12.4 ms a passage). Spinning within a run only
    (``session.force_spinning_stop``) gave stores nothing either: p50 at 50,000
    memories 9.92 / 9.87 / 11.24 ms against 9.95 / 9.85 / 11.18 (three runs of
    400 stores, the two sessions alternating).
    """
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
