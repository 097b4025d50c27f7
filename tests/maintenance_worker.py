"""A separate process that runs the consolidation sweep, as a second server would.

Usage: python maintenance_worker.py STORAGE_URL SECONDS LLM_COMMAND.  It prints "ready",
waits for a line on stdin (the go signal), then runs the sweep again and again
for SECONDS, and prints each attempt (wall-clock start and end, report) as JSON.
"""

from __future__ import annotations

import json
import sys
import time

import anyio

from helpers.processes import wait_for_go
from helpers.storage import open_url
from memory_mcp.llm import Command
from memory_mcp.maintenance import Maintenance


async def main(url: str, seconds: str, llm: str) -> None:
    async with open_url(url) as memory:
        worker = Maintenance(memory.engine, llm=Command(llm))
        wait_for_go()
        attempts = []
        deadline = time.time() + float(seconds)
        while time.time() < deadline:
            start = time.time()
            [report] = await worker.run(["consolidate"])
            attempts.append({"start": start, "end": time.time(), "report": report.to_json()})
            await anyio.sleep(0.01)
        print(json.dumps(attempts), flush=True)


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:4])
