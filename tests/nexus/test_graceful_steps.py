"""A shutdown step that hangs is named in the log and left behind; the next steps still run."""

from __future__ import annotations

import asyncio
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
