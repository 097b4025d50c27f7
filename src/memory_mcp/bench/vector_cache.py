"""``bench retrieval --vector-cache FILE``: vectors kept between benchmark runs.

A LongMemEval-S run embeds about 65,000 passages (an hour on two cores) and a
change to search re-embeds none of them: the texts and the model are the same.
``CachedEmbedder`` wraps the configured embedder and keeps every vector it
makes in an SQLite file, keyed by the embedder's name and the text; a later
run with the same file embeds only texts it has not seen. A cache made by one
model never answers for another (the name is part of the key).
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

from memory_mcp.embedders.base import Embedder, Matrix


class CachedEmbedder:
    """An embedder whose vectors are kept in (and read back from) a file."""

    def __init__(self, inner: Embedder, path: Path) -> None:
        self._inner = inner
        path.parent.mkdir(parents=True, exist_ok=True)
        # embed() runs in worker threads: one connection, used under a lock.
        self._db = sqlite3.connect(path, check_same_thread=False)
        self._lock = threading.Lock()
        self._db.execute("CREATE TABLE IF NOT EXISTS vectors (key BLOB PRIMARY KEY, v BLOB)")
        self.hits = 0
        self.misses = 0

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def dim(self) -> int | None:
        return self._inner.dim

    def locate(self) -> str:
        return self._inner.locate()

    def can_download(self) -> str | None:
        return self._inner.can_download()

    def load(self, *, download: bool = False) -> None:
        self._inner.load(download=download)

    def _key(self, text: str) -> bytes:
        return hashlib.sha256(f"{self.name}\0{text}".encode()).digest()

    def embed(self, texts: Sequence[str]) -> Matrix:
        import numpy as np

        keys = [self._key(t) for t in texts]
        with self._lock:
            found = self._read(keys)
        missing = [i for i, key in enumerate(keys) if key not in found]
        self.hits += len(texts) - len(missing)
        self.misses += len(missing)
        if missing:
            made = self._inner.embed([texts[i] for i in missing]).astype(np.float32)
            with self._lock, self._db:
                self._db.executemany(
                    "INSERT OR REPLACE INTO vectors VALUES (?, ?)",
                    [(keys[i], made[n].tobytes()) for n, i in enumerate(missing)],
                )
            for n, i in enumerate(missing):
                found[keys[i]] = made[n]
        if not texts:
            return np.zeros((0, self.dim or 0), np.float32)
        return np.stack([found[key] for key in keys])

    def _read(self, keys: Sequence[bytes]) -> dict[bytes, Matrix]:
        import numpy as np

        found: dict[bytes, Matrix] = {}
        for start in range(0, len(keys), 500):
            part = keys[start : start + 500]
            marks = ",".join("?" * len(part))
            for key, blob in self._db.execute(
                f"SELECT key, v FROM vectors WHERE key IN ({marks})", part
            ):
                found[key] = np.frombuffer(blob, dtype=np.float32)
        return found

    def close(self) -> None:
        self._db.close()
