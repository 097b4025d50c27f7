"""A separate process that stores memories, as a second agent's server would.

Usage: python concurrency_worker.py DB CWD TEXT...  It prints "ready", waits for a
line on stdin (the go signal), stores every TEXT, and prints the results as JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio

from helpers.processes import wait_for_go
from memory_mcp.config import Settings
from memory_mcp.embedders.base import FakeEmbedder
from memory_mcp.service import MemoryService, StoreRequest


async def main(db: str, cwd: str, texts: list[str]) -> None:
    async with MemoryService.open(
        Settings(), database=Path(db), embedder=FakeEmbedder(), wait_for_embedder=10
    ) as memory:
        wait_for_go()
        results = []
        for text in texts:
            result = (await memory.store_many([StoreRequest(text, cwd=cwd, agent="worker")]))[0]
            results.append({"id": result.id, "action": result.action, "related": result.related_id})
        print(json.dumps(results), flush=True)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], sys.argv[3:])
