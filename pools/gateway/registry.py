"""Keep each gateway process's snapshot fresh, off the request path."""

from __future__ import annotations

import asyncio
import logging
import time

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.utils import timezone

from nexus.models import ApiToken
from pools.gateway.snapshot import EMPTY, Snapshot, current_version, load_snapshot

log = logging.getLogger(__name__)


def _touch_tokens(token_ids: list[int]) -> None:
    ApiToken.objects.filter(pk__in=token_ids).update(last_used_at=timezone.now())


def _guarded(function, *args):  # type: ignore[no-untyped-def]
    try:
        return function(*args)
    except Exception:
        # A dropped database connection must not stick: the next call reconnects.
        close_old_connections()
        raise


class Registry:
    """The current snapshot, checked against the configuration version about once a second."""

    def __init__(self, refresh_interval_s: float = 1.0, usage_flush_interval_s: float = 30.0):
        self.snapshot: Snapshot = EMPTY
        self.refresh_interval_s = refresh_interval_s
        self.usage_flush_interval_s = usage_flush_interval_s
        self._used_tokens: set[int] = set()
        self._lock: asyncio.Lock | None = None
        self._refresher: asyncio.Task[None] | None = None

    async def ready(self) -> Snapshot:
        """Return the snapshot, loading it on the process's first request."""
        if self.snapshot is not EMPTY:
            return self.snapshot
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.snapshot is EMPTY:
                self.snapshot = await sync_to_async(_guarded)(load_snapshot)
                self._refresher = asyncio.create_task(self._refresh_forever())
        return self.snapshot

    async def aclose(self) -> None:
        """Stop refreshing and write the pending token usage."""
        if self._refresher is not None:
            self._refresher.cancel()
            self._refresher = None
        await self.flush_token_usage()

    def note_token_used(self, token_id: int) -> None:
        self._used_tokens.add(token_id)

    async def refresh(self) -> None:
        """Reload the snapshot if the configuration changed since it was built."""
        version = await sync_to_async(_guarded)(current_version)
        if version != self.snapshot.version:
            self.snapshot = await sync_to_async(_guarded)(load_snapshot)

    async def flush_token_usage(self) -> None:
        if not self._used_tokens:
            return
        used, self._used_tokens = sorted(self._used_tokens), set()
        await sync_to_async(_guarded)(_touch_tokens, used)

    async def _refresh_forever(self) -> None:
        last_flush = time.monotonic()
        while True:
            await asyncio.sleep(self.refresh_interval_s)
            try:
                await self.refresh()
                if time.monotonic() - last_flush >= self.usage_flush_interval_s:
                    last_flush = time.monotonic()
                    await self.flush_token_usage()
            except Exception:
                log.exception("gateway snapshot refresh failed; keeping the previous snapshot")
