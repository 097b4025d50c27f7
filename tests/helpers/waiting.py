"""Waiting for what another thread or process does: a bounded poll that says what it awaited."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

T = TypeVar("T")
INTERVAL = 0.05


def wait_until(check: Callable[[], T], *, within: float, what: str) -> T:
    """Call ``check`` until it returns something true, and return that; fail after ``within`` s."""
    deadline = time.monotonic() + within
    while not (found := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {within} s for {what}")
        time.sleep(INTERVAL)
    return found


async def eventually(check: Callable[[], Awaitable[T]], *, within: float, what: str) -> T:
    """``wait_until`` for a check that is a coroutine: it may read the store meanwhile."""
    deadline = time.monotonic() + within
    while not (found := await check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {within} s for {what}")
        await anyio.sleep(INTERVAL)
    return found
