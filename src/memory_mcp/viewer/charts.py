"""The small charts of the projects page, as numbers an SVG template draws: no script."""

from __future__ import annotations

from dataclasses import dataclass

MONTHS_SHOWN = 24  # the most recent months a chart shows
HEIGHT = 40  # pixels of the tallest bar
BAR = 6  # pixels per month (bar and gap)


@dataclass(frozen=True)
class Bar:
    month: str  # YYYY-MM
    count: int
    x: int
    y: int
    height: int


def month_bars(by_month: dict[str, int]) -> list[Bar]:
    """A bar per month from the first month with records to the last (empty months
    included, so the axis is time), the last ``MONTHS_SHOWN`` of them."""
    known = sorted(m for m in by_month if _month(m) is not None)
    if not known:
        return []
    months: list[str] = []
    year, month = _month(known[0]) or (0, 0)
    last = _month(known[-1]) or (0, 0)
    while (year, month) <= last:
        months.append(f"{year:04d}-{month:02d}")
        year, month = (year + 1, 1) if month == 12 else (year, month + 1)
    months = months[-MONTHS_SHOWN:]
    peak = max(by_month.get(m, 0) for m in months) or 1
    first = MONTHS_SHOWN - len(months)  # the latest month at the right edge
    bars = []
    for i, name in enumerate(months):
        count = by_month.get(name, 0)
        height = max(1, round(HEIGHT * count / peak)) if count else 0
        bars.append(Bar(name, count, (first + i) * BAR, HEIGHT - height, height))
    return bars


WIDTH = MONTHS_SHOWN * BAR  # the chart's width, whatever months it has


def _month(text: str) -> tuple[int, int] | None:
    year, _, month = text.partition("-")
    if not (year.isdigit() and month.isdigit() and 1 <= int(month) <= 12):
        return None
    return int(year), int(month)
