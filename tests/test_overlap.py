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
