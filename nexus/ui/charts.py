"""Chart data as pages send it (docs/ui.md, "Charts"). Pure Python, no Django.

Time series go to the browser as compact column arrays drawn by uPlot through
`static/nexus/charts.js`; bar charts (a share per target) are computed here and drawn as SVG by
`templates/ui/bar_chart.html`, so templates never do arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypedDict

from nexus.ui import format
from nexus.ui.badges import Tone

# Units charts.js knows how to write on axes and in legends, as nexus.ui.format does:
# "ms" and "s" durations, rates, "%" of a ratio (0.31 is 31 %), "B" binary sizes, "" counts.
UNITS = ("ms", "s", "req/s", "tok/s", "%", "B", "")
# Series colours follow the badges' palette, in this order unless a series names its tone.
SERIES_TONES = (Tone.INFO, Tone.OK, Tone.WARN, Tone.BAD, Tone.OFF)
# The SVG bar chart's layout: a row per bar; label, bar and value side by side (in % of width).
ROW_HEIGHT = 28  # px
BAR_THICKNESS = 14  # px
LABEL_AREA = 26.0
BAR_AREA = 54.0


class Series(TypedDict):
    label: str
    tone: str


class TimeSeries(TypedDict):
    """One chart: columns[0] holds Unix times in seconds, columns[i] the values of series[i-1]
    (None where there is no data: a gap, never a zero)."""

    id: str
    title: str
    unit: str
    series: list[Series]
    columns: list[list[float | None]]


def time_series(
    id: str,
    title: str,
    unit: str,
    times: Sequence[float],
    series: Sequence[tuple[str, Sequence[float | None]]],
    tones: Sequence[Tone] = (),
) -> TimeSeries:
    """Return a chart's data, checked: a known unit and one value per time in every series."""
    if unit not in UNITS:
        raise ValueError(f"unit {unit!r} is not one of {UNITS}")
    if not series:
        raise ValueError(f"chart {id!r} has no series")
    for label, values in series:
        if len(values) != len(times):
            raise ValueError(
                f"series {label!r} of chart {id!r} has {len(values)} values for {len(times)} times"
            )
    palette = list(tones) or [SERIES_TONES[i % len(SERIES_TONES)] for i in range(len(series))]
    return {
        "id": id,
        "title": title,
        "unit": unit,
        "series": [
            {"label": label, "tone": str(tone)}
            for (label, _), tone in zip(series, palette, strict=True)
        ],
        "columns": [list(times), *(list(values) for _, values in series)],
    }


@dataclass(frozen=True)
class Bar:
    label: str
    text: str  # the value as written beside the bar
    width: float  # percent of the bar area, 0 to 100
    row: int  # 0 for the first bar

    # Where templates/ui/bar_chart.html draws it: precomputed, templates do no arithmetic.
    area_x = LABEL_AREA
    area_width = BAR_AREA
    text_x = LABEL_AREA + BAR_AREA + 2
    bar_height = BAR_THICKNESS

    @property
    def svg_width(self) -> float:
        return round(self.width * BAR_AREA / 100, 2)

    @property
    def bar_y(self) -> int:
        return self.row * ROW_HEIGHT + (ROW_HEIGHT - BAR_THICKNESS) // 2

    @property
    def text_y(self) -> int:
        return self.row * ROW_HEIGHT + 19


@dataclass(frozen=True)
class BarChart:
    title: str
    tone: str
    bars: tuple[Bar, ...]
    height: int


def bar_chart(
    title: str,
    items: Sequence[tuple[str, float]],
    *,
    total: float | None = None,
    text: Callable[[float], str] = format.number,
    tone: Tone = Tone.INFO,
) -> BarChart:
    """Return a horizontal bar chart: each bar's width is its value's share of `total` (or of
    the largest value), each text the value as `text` writes it."""
    scale = total if total is not None else max((value for _, value in items), default=0)
    bars = tuple(
        Bar(
            label=label,
            text=text(value),
            width=round(value / scale * 100, 1) if scale else 0.0,
            row=index,
        )
        for index, (label, value) in enumerate(items)
    )
    return BarChart(title=title, tone=str(tone), bars=bars, height=len(bars) * ROW_HEIGHT)


def share_chart(title: str, counts: Sequence[tuple[str, int]]) -> BarChart:
    """Return each part's share of the whole, e.g. requests per target: "42 % · 84"."""
    total = sum(count for _, count in counts)
    return bar_chart(
        title,
        counts,
        total=total or None,
        text=lambda count: f"{format.percent(count, total)} · {format.number(count)}",
    )
