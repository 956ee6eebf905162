"""How every number and time on a page is written (docs/ui.md, "Numbers").

Pure Python, no Django: the template filters in `nexus/templatetags/ui.py` call these, views may
too, and `static/nexus/nexus.js` mirrors `ago` and the chart units (a browser test holds the two
to the same table). Templates never do arithmetic: whatever a page shows as a number goes
through one of these functions.

Missing values (None) read "—", never 0: no data is not zero.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

MISSING = "—"
_SIZE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
# Largest first; the last is one second, so every span of a second or more finds its unit.
_AGO_UNITS = ((86400, "d"), (3600, "h"), (60, "min"), (1, "s"))


# Halves round up, as JavaScript's Math.round does (Python's round() goes to the even one), so
# that nexus.js writes the same text.
def _whole(value: float) -> int:
    return math.floor(value + 0.5)


def _tenths(value: float) -> float:
    return math.floor(value * 10 + 0.5) / 10


def _fixed1(value: float) -> str:
    """Return the value with one decimal: 1.5, 2.0."""
    return f"{_tenths(value):.1f}"


def _one_decimal(value: float) -> str:
    """Return the value with one decimal, or none when that decimal is 0: 1.5, 256."""
    text = _fixed1(value)
    return text[:-2] if text.endswith(".0") else text


def number(value: float | None) -> str:
    """Return a whole number with thousands grouped: 1,204."""
    if value is None:
        return MISSING
    return f"{_whole(value):,}"


def duration(seconds: float | None) -> str:
    """Return a span of time: 38 ms below a second, 1.2 s below ten, 42 s, 3 min 5 s, 2 h 5 min,
    3 d 4 h. Each step keeps the precision an operator reads at that size."""
    if seconds is None or math.isnan(seconds):
        return MISSING
    if seconds < 0:
        return f"-{duration(-seconds)}"
    ms = seconds * 1000
    if ms < 1 and ms != 0:
        return f"{_fixed1(ms)} ms"
    if _whole(ms) < 1000:
        return f"{_whole(ms)} ms"
    if _tenths(seconds) < 10:
        return f"{_fixed1(seconds)} s"
    if _whole(seconds) < 60:
        return f"{_whole(seconds)} s"
    if _whole(seconds) < 3600:
        minutes, rest = divmod(_whole(seconds), 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    if _whole(seconds / 60) < 24 * 60:
        hours, minutes = divmod(_whole(seconds / 60), 60)
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(_whole(seconds / 3600), 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def duration_ms(milliseconds: float | None) -> str:
    """Return a span given in milliseconds (TTFT, queue wait), written as `duration` does."""
    return MISSING if milliseconds is None else duration(milliseconds / 1000)


def rate(per_second: float | None, unit: str) -> str:
    """Return a rate: 958 tok/s, 17 req/s, 2.5 req/s (one decimal below ten), 12,400 tok/s."""
    if per_second is None or math.isnan(per_second):
        return MISSING
    if per_second == 0:
        return f"0 {unit}/s"
    if abs(per_second) < 10:
        return f"{_fixed1(per_second)} {unit}/s"
    return f"{number(per_second)} {unit}/s"


def binary_size(size: float | None) -> str:
    """Return a size in binary units with at most one decimal: 512 B, 256 MiB, 1.5 GiB."""
    if size is None:
        return MISSING
    if size < 0:
        return f"-{binary_size(-size)}"
    if size < 1024:
        return f"{_whole(size)} B"
    exponent = min(int(math.log(size, 1024)), len(_SIZE_UNITS) - 1)
    value = size / 1024**exponent
    if _tenths(value) >= 1024 and exponent < len(_SIZE_UNITS) - 1:
        # 1023.97 MiB would read "1024 MiB": it is 1 GiB.
        exponent, value = exponent + 1, value / 1024
    return f"{_one_decimal(value)} {_SIZE_UNITS[exponent]}"


def plural(noun: str) -> str:
    """Return the noun's regular English plural: replicas, processes, entries."""
    if noun.endswith(("s", "x", "z", "ch", "sh")):
        return f"{noun}es"
    if noun.endswith("y") and len(noun) > 1 and noun[-2] not in "aeiou":
        return f"{noun[:-1]}ies"
    return f"{noun}s"


def count(value: int | None, noun: str, plural_form: str = "") -> str:
    """Return a count with its noun agreeing: 1 replica, 2 replicas, 0 entries, 1,204 requests."""
    if value is None:
        return MISSING
    word = noun if value == 1 else (plural_form or plural(noun))
    return f"{number(value)} {word}"


def percent(value: float | None, of: float = 1.0) -> str:
    """Return value / of as a percentage: 31 %, 9.5 % (one decimal below ten), 0 %."""
    if value is None or not of or math.isnan(value):
        return MISSING
    points = value / of * 100
    if points != 0 and abs(points) < 10:
        return f"{_one_decimal(points)} %"
    return f"{_whole(points)} %"


def absolute(when: datetime | None) -> str:
    """Return a moment in UTC to the second, as titles show it: 2025-01-02 13:04:05 UTC."""
    if when is None:
        return MISSING
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def ago(when: datetime | None, now: datetime) -> str:
    """Return a moment relative to now: just now, 42 s ago, 3 min ago, 2 h ago, 3 d ago, in 12 s.

    Whole units, rounded down (119 s is "1 min ago"); past 30 days, the date.
    """
    if when is None:
        return MISSING
    seconds = (now - when).total_seconds()
    future = seconds < 0
    seconds = abs(seconds)
    if seconds < 1:
        return "just now"
    if seconds >= 30 * 86400:
        return when.astimezone(UTC).strftime("%Y-%m-%d")
    size, unit = next((size, unit) for size, unit in _AGO_UNITS if seconds >= size)
    amount = f"{math.floor(seconds / size)} {unit}"
    return f"in {amount}" if future else f"{amount} ago"
