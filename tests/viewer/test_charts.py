"""The projects page's month bars: time on the axis, the latest month at the right."""

from __future__ import annotations

from memory_mcp.viewer.charts import BAR, HEIGHT, MONTHS_SHOWN, WIDTH, month_bars


def test_months_without_records_keep_their_place_and_the_tallest_bar_fills_the_height() -> None:
    bars = month_bars({"2025-11": 4, "2026-02": 8, "bad": 3})
    assert [b.month for b in bars] == ["2025-11", "2025-12", "2026-01", "2026-02"]
    assert [b.count for b in bars] == [4, 0, 0, 8]
    assert [b.height for b in bars] == [HEIGHT // 2, 0, 0, HEIGHT]
    assert bars[-1].x == WIDTH - BAR and bars[-1].y == 0


def test_only_the_latest_months_are_drawn() -> None:
    bars = month_bars({f"{2020 + m // 12}-{m % 12 + 1:02d}": 1 for m in range(40)})
    assert len(bars) == MONTHS_SHOWN and bars[0].x == 0 and bars[-1].month == "2023-04"
    assert month_bars({}) == []
