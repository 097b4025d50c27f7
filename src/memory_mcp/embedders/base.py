"""The embedder seam, and a deterministic fake beside it.

An embedder turns texts into unit-length float32 vectors. Its ``name`` is the
identity stored with every vector: vectors of different names (or dimensions)
never share an index, and a record whose vector has another name is re-embedded.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, TypeAlias

from memory_mcp.lexical import stems, words

if TYPE_CHECKING:  # numpy loads with the first vector, not with the engine
    import numpy as np
    import numpy.typing as npt

Matrix: TypeAlias = "npt.NDArray[np.float32]"
# Ends the name of an embedder that runs a model's int8 copy (``embedder.quantize``).
INT8_MARK = ":int8"


class Embedder(Protocol):
    """Makes vectors. ``load`` may block (call it in a thread); ``embed`` too."""

    @property
    def name(self) -> str: ...

    @property
    def dim(self) -> int | None: ...

    def locate(self) -> str:
        """Where it would load from (a folder, a URL), without loading; cheap.

        Raises ``ModelNotLocal`` when the model is not on this machine, or
        ``EmbedderError`` when it cannot be used as configured.
        """
        ...

    def can_download(self) -> str | None:
        """Why a download of a model that is not local cannot work now, or None."""
        ...

    def load(self, *, download: bool = False) -> None:
        """Make the embedder ready.

        Without ``download`` only local files are used (fast); ``ModelNotLocal``
        says a download could help. Raises ``EmbedderError`` when it cannot be.
        """
        ...

    def embed(self, texts: Sequence[str]) -> Matrix:
        """One unit vector per text, in order."""
        ...


def normalize_rows(matrix: npt.NDArray[np.floating]) -> Matrix:
    """Scale each row to unit length (zero rows stay zero)."""
    import numpy as np

    out = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    normalized: Matrix = (out / norms).astype(np.float32, copy=False)
    return normalized


def length_batches(texts: Sequence[str], batch_size: int) -> list[list[int]]:
    """Indices of ``texts`` grouped by similar length.

    A batch is padded to its longest text, so batching texts of similar length
    avoids embedding padding.
    """
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


class FakeEmbedder:
    """Deterministic hashed bag of stems and character trigrams.

    For fast tests: texts that share words are close, paraphrases with other
    words are not; no model, no threads.
    """

    def __init__(self, dim: int = 256, name: str = "fake:hash-256") -> None:
        self._dim = dim
        self._name = name
        self.calls = 0

    @property
    def name(self) -> str:
        return self._name

    @property
    def dim(self) -> int:
        return self._dim

    def locate(self) -> str:
        return "built in"

    def can_download(self) -> str | None:
        return None

    def load(self, *, download: bool = False) -> None:
        return None

    def embed(self, texts: Sequence[str]) -> Matrix:
        import numpy as np

        self.calls += 1
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for row, text in enumerate(texts):
            features = stems(text) * 2
            for word in words(text):
                padded = f" {word} "
                features.extend(padded[i : i + 3] for i in range(len(padded) - 2))
            for feature in features:
                digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest()
                bucket = int.from_bytes(digest[:4], "little") % self._dim
                sign = 1.0 if digest[4] & 1 else -1.0
                out[row, bucket] += sign
        return normalize_rows(out)
