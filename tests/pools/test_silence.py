"""The silence timer ends an attempt whose target stays quiet past the current limit."""

from __future__ import annotations

import asyncio
import time

import pytest

from pools.gateway.silence import SilenceTimer


async def test_it_cancels_the_task_when_the_first_wait_passes_and_says_which() -> None:
    timer = SilenceTimer(0.05, "first-byte timeout (0.05 s)", idle_s=10)
    started = time.monotonic()

    with pytest.raises(asyncio.CancelledError):
        await asyncio.sleep(5)

    assert timer.absorb()
    assert timer.expired == "first-byte timeout (0.05 s)"
    assert time.monotonic() - started < 1


async def test_output_heard_in_time_keeps_it_quiet_then_the_idle_limit_applies() -> None:
    # Output every 0.1 s against an idle limit of 0.5 s: make test runs the unit tests at the
    # lowest priority beside the serial tests, where a sleep of 0.05 s once outlasted a 0.1 s limit.
    timer = SilenceTimer(1.0, "first-byte timeout", idle_s=0.5)
    for _ in range(5):
        await asyncio.sleep(0.1)
        timer.heard()
    started = time.monotonic()

    with pytest.raises(asyncio.CancelledError):
        await asyncio.sleep(5)

    assert timer.absorb()
    assert timer.expired == "stream idle timeout (0.5 s)"
    assert 0.4 < time.monotonic() - started < 2


async def test_a_shorter_idle_limit_brings_a_far_check_forward() -> None:
    timer = SilenceTimer(60, "first-token timeout (60 s)", idle_s=0.05)
    timer.heard()
    started = time.monotonic()

    with pytest.raises(asyncio.CancelledError):
        await asyncio.sleep(5)

    assert timer.absorb()
    assert time.monotonic() - started < 1


async def test_a_stopped_timer_never_fires_and_another_cancellation_is_not_absorbed() -> None:
    timer = SilenceTimer(0.05, "first-byte timeout", idle_s=0.05)
    timer.stop()
    await asyncio.sleep(0.1)

    assert timer.expired is None
    assert not timer.absorb()
