"""Two awaitables at once, for work that waits on different threads.

The model (onnxruntime) and SQLite each release the GIL while they work, so on
two cores a store or a search that needs both waits for the slower instead of
their sum.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.lowlevel

log = logging.getLogger(__name__)

A = TypeVar("A")
M = TypeVar("M")


async def alongside(
    aside: Callable[[], Awaitable[A]], main: Callable[[], Awaitable[M]]
) -> tuple[A, M]:
    """``aside()`` and ``main()`` run concurrently; both results.

    An exception of either is raised as itself once both have ended (``main``'s
    first), not in an exception group, so callers catch what they always caught.
    """
    outcomes: dict[str, tuple[bool, Any]] = {}

    async def run(name: str, work: Callable[[], Awaitable[Any]]) -> None:
        try:
            outcomes[name] = (True, await work())
        except Exception as exc:
            outcomes[name] = (False, exc)

    async with anyio.create_task_group() as group:
        group.start_soon(run, "aside", aside)
        await run("main", main)
    if len(outcomes) < 2:  # cancelled from outside: the one cut short has no outcome
        await anyio.lowlevel.checkpoint_if_cancelled()
        raise anyio.get_cancelled_exc_class()()
    (main_ok, main_value), (aside_ok, aside_value) = outcomes["main"], outcomes["aside"]
    if not main_ok:
        if not aside_ok:  # what is raised is main's: say what the other one was
            log.warning("work beside a failed one failed too: %r", aside_value)
        raise main_value
    if not aside_ok:
        raise aside_value
    return aside_value, main_value
