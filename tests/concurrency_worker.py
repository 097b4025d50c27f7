"""A separate process that stores memories, as a second agent's server would.

Usage: python concurrency_worker.py STORAGE_URL CWD TEXT...  It prints "ready", waits
for a line on stdin (the go signal), stores every TEXT, and prints the results as JSON.
"""

from __future__ import annotations

import json
import sys

import anyio

from helpers.processes import wait_for_go
from helpers.storage import open_url
from memory_mcp.service import StoreRequest


async def main(url: str, cwd: str, texts: list[str]) -> None:
    async with open_url(url) as memory:
        wait_for_go()
        results = []
        for text in texts:
            result = (await memory.store_many([StoreRequest(text, cwd=cwd, agent="worker")]))[0]
            results.append({"id": result.id, "action": result.action, "related": result.related_id})
        print(json.dumps(results), flush=True)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], sys.argv[3:])
