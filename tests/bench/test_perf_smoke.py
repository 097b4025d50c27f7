"""A tiny run of bench perf: it works end to end (no timing is checked)."""

from __future__ import annotations

import pytest

from memory_mcp.bench.perf import generate, run_perf
from memory_mcp.config import Settings
from memory_mcp.embedders.base import FakeEmbedder

pytestmark = pytest.mark.anyio


def test_the_generator_is_seeded_varied_and_has_near_duplicates() -> None:
    first = generate(400, seed=9)
    assert first == generate(400, seed=9)
    kinds = {kind for kind, _, _ in first}
    assert {"fact", "decision", "procedure", "gotcha", "journal"} <= kinds
    lengths = sorted(len(text) for _, text, _ in first)
    assert lengths[-1] > 2 * lengths[0]
    assert sum(text.endswith("(again).") for _, text, _ in first) >= 5


async def test_a_tiny_perf_run_reports_every_figure() -> None:
    report = await run_perf([30], Settings(), samples=5, embedder=FakeEmbedder())
    (point,) = report.points
    assert point.memories == 30
    for value in (
        point.import_per_s,
        point.import_embedded_per_s,
        point.store_p50_ms,
        point.store_p95_ms,
        point.search_p50_ms,
        point.search_p95_ms,
        point.brief_inject_ms,
        point.bytes_per_memory,
        point.rss_mb,
    ):
        assert value > 0
    assert point.store_p95_ms >= point.store_p50_ms
    assert report.to_json()["points"][0]["embedder"] == "fake:hash-256"
