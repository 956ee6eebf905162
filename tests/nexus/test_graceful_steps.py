"""A shutdown step that hangs is named in the log and left behind; the next steps still run."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import pytest

from nexus import graceful


async def test_a_hanging_step_is_logged_by_name_and_the_shutdown_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    done: list[str] = []

    async def finishes() -> None:
        await asyncio.sleep(0)
        done.append("flushed")

    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="nexus.graceful"):
        await graceful.bounded("closing a listener", asyncio.Event().wait(), timeout_s=0.2)
        await graceful.bounded("flushing history", finishes(), timeout_s=0.2)

    assert time.monotonic() - started < 1.0
    assert done == ["flushed"]
    assert [r.getMessage() for r in caplog.records] == [
        "shutdown: closing a listener still running after 0.2 s; going on without it"
    ]


async def test_a_step_that_ignores_its_cancelling_does_not_hold_the_shutdown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    released = asyncio.Event()

    async def deaf() -> None:
        # What a stuck close looks like: it swallows the cancel and goes on waiting.
        while not released.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.05)

    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="nexus.graceful"):
        await graceful.bounded("withdrawing the live state", deaf(), timeout_s=0.2)

    assert time.monotonic() - started < 1.0
    assert "withdrawing the live state still running after 0.2 s" in caplog.text
    released.set()
    await asyncio.sleep(0.1)  # the deaf step ends: nothing left running after the test


async def test_a_step_that_fails_raises_its_error() -> None:
    async def fails() -> None:
        raise ConnectionError("refused")

    with pytest.raises(ConnectionError, match="refused"):
        await graceful.bounded("closing the load ledger", fails(), timeout_s=0.2)
