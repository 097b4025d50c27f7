"""Maintenance (SPEC §7): upkeep that needs no human, and that can be undone.

One run does these tasks, in this order:

============ =====================================================================
secrets      when the secret rules changed since the stored texts were last scanned,
             every record (current, history, archived; folded texts and earlier LLM
             texts too) is scanned again and redacted; its vectors are made again
reembed      current records without a vector from the active embedder get one
consolidate  duplicates the write-time fold missed are folded with the same rules
             (``write.neighbours``, ``fold.decide``), across each whole scope;
             contradictions become conflicts. An LLM may then rewrite the text of
             a fold as one statement; the previous text is kept in ``meta``.
insights     summaries of groups of related facts (rules, or the LLM), each listing
             its sources; rewritten when the group changes, the old one archived
staleness    facts never returned by a search, in projects without activity for
             ``dormant_days``, are archived (reason ``dormant``)
purge        records archived longer than ``grace_days`` are deleted: the only
             hard delete there is
============ =====================================================================

Every destructive step is a soft archive first (``memory-mcp restore`` undoes
it until the purge). Each task holds a lease in the database while it runs, so
that of several server processes on one store only one runs it; a running task
renews the lease and saves its cursor between small transactions. A failing
task (an embedder outage) backs off, doubling its wait.

``--dry-run`` runs the same code on a private copy of the database (the
store's ``scratch_copy``: SQLite's online backup) and throws the copy away, so
the counts it reports are what a real run would do, task after task. It calls
no LLM (counts do not depend on its answers); records awaiting vectors are
embedded on the copy, as the real run would, so that the later tasks see what
they will see.

``runner`` decides what is due and holds the leases; ``context`` is what a
running task holds (lease, cursor, LLM); ``tasks`` and ``insights`` do the work.
"""

from memory_mcp.maintenance.context import LeaseLost, TaskReport
from memory_mcp.maintenance.runner import TASKS, Maintenance, dry_run, holder_name, loop

__all__ = ["TASKS", "LeaseLost", "Maintenance", "TaskReport", "dry_run", "holder_name", "loop"]
