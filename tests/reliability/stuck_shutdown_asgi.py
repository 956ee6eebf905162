"""An application whose graceful shutdown never ends, for daphne in test_shutdown.py: the process
must stop anyway, `overrun_s` (1 s) past the grace, though the shutdown ignores being cancelled.
Not imported by the tests: importing it installs the signal handling in the importing process."""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "nexus.settings")
django.setup()

from nexus import graceful  # noqa: E402  (needs Django set up first)


async def never_done(grace_s: float) -> None:
    # Deaf to cancelling too, as a close stuck on a dead connection can be.
    while True:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()


graceful.install_in_daphne(never_done, overrun_s=1.0)


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answer every HTTP request with 200."""
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
