"""Waiting for a condition instead of sleeping: a test that orders events waits on the event.

A fixed sleep is either too short on a loaded machine (the test fails) or too long on an idle
one (the suite crawls); polling a condition is as fast as the system under test allows.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
POLL_S = 0.05


def wait_until(
    probe: Callable[[], T], *, timeout_s: float = 10.0, what: Callable[[], str] | str = ""
) -> T:
    """Return probe()'s first truthy result, polling for at most timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met in {timeout_s} s. {_detail(what)}")
        time.sleep(POLL_S)


async def eventually(
    probe: Callable[[], T | Awaitable[T]],
    *,
    timeout_s: float = 10.0,
    what: Callable[[], str] | str = "",
) -> T:
    """Return probe()'s first truthy result (awaited if it is awaitable), polling for at most
    timeout_s without blocking the event loop."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = probe()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met in {timeout_s} s. {_detail(what)}")
        await asyncio.sleep(POLL_S)


def _detail(what: Callable[[], str] | str) -> str:
    return what() if callable(what) else what
