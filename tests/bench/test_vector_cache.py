"""``bench retrieval --vector-cache``: vectors made once, read back in later runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from memory_mcp.bench.vector_cache import CachedEmbedder
from memory_mcp.embedders.base import FakeEmbedder


def test_a_text_is_embedded_once_across_runs_and_never_for_another_model(
    tmp_path: Path,
) -> None:
    path = tmp_path / "cache" / "vectors.db"
    inner = FakeEmbedder()
    first = CachedEmbedder(inner, path)
    made = first.embed(["alpha beta", "gamma"])
    first.close()
    again = CachedEmbedder(inner, path)
    calls = inner.calls
    read = again.embed(["gamma", "alpha beta", "delta"])
    assert inner.calls == calls + 1  # for "delta" alone
    assert (again.hits, again.misses) == (2, 1)
    np.testing.assert_array_equal(read[0], made[1])
    np.testing.assert_array_equal(read[1], made[0])
    np.testing.assert_array_equal(read[2], FakeEmbedder().embed(["delta"])[0])
    assert again.embed([]).shape == (0, inner.dim)
    again.close()
    other = CachedEmbedder(FakeEmbedder(name="fake:other"), path)
    other.embed(["gamma"])
    assert (other.hits, other.misses) == (0, 1)
    other.close()
