"""Every number and time a page shows is written one way (nexus.ui.format, UI.md "Numbers")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from nexus.ui import format

NOW = datetime(2025, 1, 2, 13, 4, 5, tzinfo=UTC)


@pytest.mark.parametrize(
    ("seconds", "written"),
    [
        (None, "—"),
        (0, "0 ms"),
        (0.0004, "0.4 ms"),
        (0.0025, "3 ms"),  # halves round up, as in the browser
        (0.038, "38 ms"),
        (0.9994, "999 ms"),
        (0.9996, "1.0 s"),  # never "1000 ms"
        (1.234, "1.2 s"),
        (9.96, "10 s"),
        (42.5, "43 s"),
        (59.6, "1 min"),
        (60, "1 min"),
        (185, "3 min 5 s"),
        (3599.6, "1 h"),
        (5700, "1 h 35 min"),
        (86400, "1 d"),
        (90061, "1 d 1 h"),
        (-2.5, "-2.5 s"),
    ],
)
def test_a_duration_keeps_the_precision_its_size_needs(seconds: float | None, written: str) -> None:
    assert format.duration(seconds) == written


def test_milliseconds_are_written_as_durations() -> None:
    assert [format.duration_ms(v) for v in (None, 38, 1234, 185_000)] == [
        "—", "38 ms", "1.2 s", "3 min 5 s"
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("per_second", "unit", "written"),
    [
        (None, "tok", "—"),
        (0, "req", "0 req/s"),
        (0.25, "req", "0.3 req/s"),
        (2.5, "req", "2.5 req/s"),
        (17.2, "req", "17 req/s"),
        (958.3, "tok", "958 tok/s"),
        (12400, "tok", "12,400 tok/s"),
    ],
)
def test_a_rate_is_per_second_with_its_unit(
    per_second: float | None, unit: str, written: str
) -> None:
    assert format.rate(per_second, unit) == written


@pytest.mark.parametrize(
    ("size", "written"),
    [
        (None, "—"),
        (0, "0 B"),
        (512, "512 B"),
        (1536, "1.5 KiB"),
        (256 * 1024**2, "256 MiB"),  # not "0.2 GiB"
        (1.5 * 1024**3, "1.5 GiB"),
        (1024**3 - 1, "1 GiB"),  # not "1024 MiB"
        (143771 * 1024**2, "140.4 GiB"),
        (5 * 1024**4, "5 TiB"),
    ],
)
def test_a_size_is_binary_with_one_decimal_at_most(size: float | None, written: str) -> None:
    assert format.binary_size(size) == written


@pytest.mark.parametrize(
    ("value", "noun", "plural_form", "written"),
    [
        (1, "replica", "", "1 replica"),
        (2, "replica", "", "2 replicas"),
        (0, "replica", "", "0 replicas"),
        (3, "process", "", "3 processes"),
        (2, "entry", "", "2 entries"),
        (2, "day", "", "2 days"),
        (1204, "request", "", "1,204 requests"),
        (2, "person", "people", "2 people"),
        (None, "replica", "", "—"),
    ],
)
def test_a_count_agrees_with_its_noun(
    value: int | None, noun: str, plural_form: str, written: str
) -> None:
    assert format.count(value, noun, plural_form) == written


@pytest.mark.parametrize(
    ("value", "of", "written"),
    [(0.312, 1.0, "31 %"), (0.095, 1.0, "9.5 %"), (0.005, 1.0, "0.5 %"), (0, 1.0, "0 %"),
     (1, 1.0, "100 %"), (37.5, 100, "38 %"), (84, 140, "60 %"), (None, 1.0, "—"),
     (3, 0, "—")],
)  # fmt: skip
def test_a_percentage_has_one_decimal_below_ten(
    value: float | None, of: float, written: str
) -> None:
    assert format.percent(value, of) == written


@pytest.mark.parametrize(
    ("when", "written"),
    [
        (None, "—"),
        (NOW - timedelta(milliseconds=400), "just now"),
        (NOW - timedelta(seconds=42), "42 s ago"),
        (NOW - timedelta(seconds=119), "1 min ago"),
        (NOW - timedelta(minutes=3), "3 min ago"),
        (NOW - timedelta(hours=2, minutes=5), "2 h ago"),
        (NOW - timedelta(days=3), "3 d ago"),
        (NOW - timedelta(days=45), "2024-11-18"),
        (NOW + timedelta(seconds=12), "in 12 s"),
    ],
)
def test_a_moment_is_written_relative_to_now(when: datetime | None, written: str) -> None:
    assert format.ago(when, NOW) == written


def test_the_absolute_time_is_utc_to_the_second() -> None:
    in_seoul = datetime(2025, 1, 3, 7, 4, 5, tzinfo=timezone(timedelta(hours=9)))

    assert format.absolute(in_seoul) == "2025-01-02 22:04:05 UTC"
    assert format.absolute(None) == "—"


def test_numbers_group_thousands() -> None:
    assert [format.number(v) for v in (None, 0, 999, 1204, 1_000_000.4)] == [
        "—", "0", "999", "1,204", "1,000,000"
    ]  # fmt: skip
