"""Two awaitables at once: both results, and each error as itself."""

from __future__ import annotations

import anyio
import pytest

from memory_mcp.overlap import alongside

pytestmark = pytest.mark.anyio


async def test_both_run_at_once_and_give_their_results() -> None:
    order: list[str] = []

    async def aside() -> str:
        order.append("aside starts")
        await anyio.sleep(0.05)
        order.append("aside ends")
        return "a"

    async def main() -> int:
        order.append("main starts")
        await anyio.sleep(0.05)
        order.append("main ends")
        return 1

    assert await alongside(aside, main) == ("a", 1)
    assert order.index("aside starts") < order.index("main ends")
    assert order.index("main starts") < order.index("aside ends")


async def test_an_error_of_either_is_raised_as_itself() -> None:
    async def fails() -> None:
        raise LookupError("gone")

    async def fine() -> int:
        return 1

    with pytest.raises(LookupError, match="gone"):
        await alongside(fails, fine)
    with pytest.raises(LookupError, match="gone"):
        await alongside(fine, fails)


async def test_a_cancellation_from_outside_is_raised_as_itself() -> None:
    """Cancelled while ``main`` is shielded (a transaction's BEGIN) and ``aside`` runs:
    ``aside`` ends without an outcome, and the cancellation goes on to the scope that
    asked for it."""
    ended: list[str] = []

    async def aside() -> str:
        await anyio.sleep(1)
        return "a"

    async def main() -> int:
        with anyio.CancelScope(shield=True):
            await anyio.sleep(0.1)
        ended.append("main")
        return 1

    with anyio.move_on_after(0.05) as scope:
        await alongside(aside, main)
    assert scope.cancelled_caught and ended == ["main"]
