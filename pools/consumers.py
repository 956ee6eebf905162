"""Websocket consumers of the Smart Balancer pages: authenticate, join a group, forward."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, ClassVar

from channels.db import database_sync_to_async

from nexus import access, live
from nexus.consumers import LiveConsumer
from pools import live as pools_live
from pools import live_figures, live_views

log = logging.getLogger(__name__)


class PoolsConsumer(LiveConsumer):
    """Forward the re-rendered pools table to a staff member's pools page.

    The table is rendered once per change with every pool, so it goes to staff only; anyone
    else's page opens no socket (their table holds only their projects' pools) and is refused
    one.
    """

    def topic(self, user: Any, url: dict[str, Any]) -> str | None:
        return pools_live.POOLS_TOPIC if access.is_staff(user) else None

    def current(self, audience: live.Audience, url: dict[str, Any]) -> str:
        return pools_live.pools_table()


class LivePageConsumer(LiveConsumer):
    """Send the Live page's figures and charts about once a second, rendered for this user.

    Nothing announces traffic (it changes all the time), so this socket renders its page's
    partials on a clock instead of hearing pushes: each tick is `current()`, the same partials
    as the first render, for the pools this user sees (one render per open Live page; docs/live.md).
    """

    tick_s: ClassVar[float] = 1.0

    def topic(self, user: Any, url: dict[str, Any]) -> str | None:
        if live_views.watched_pools(user, url.get("slug")) is None:
            return None
        self.user = user
        return f"live.{url.get('slug') or ''}"

    def hears_pushes(self, user: Any) -> bool:
        return False

    def current(self, audience: live.Audience, url: dict[str, Any]) -> str:
        slug = url.get("slug")
        pools = live_views.pools_for_push(self.user, slug)
        if pools is None:  # the pool was deleted or moved out of reach since the socket opened
            return ""
        return live_views.live_fragments(pools, single=slug is not None, cache=self.buckets)

    async def connect(self) -> None:
        self.ticker: asyncio.Task[None] | None = None
        self.buckets = live_figures.BucketCache()
        await super().connect()
        if getattr(self, "user", None) is not None:  # accepted
            self.ticker = asyncio.create_task(self.tick_forever())

    async def disconnect(self, code: int) -> None:
        if self.ticker is not None:
            self.ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.ticker
        await super().disconnect(code)

    async def tick_forever(self) -> None:
        url = self.scope["url_route"]["kwargs"]
        audience = live.audience_of(self.user)
        render = database_sync_to_async(self.current)
        while True:
            await asyncio.sleep(self.tick_s)
            try:
                html = await render(audience, url)
            except Exception:
                # A failing read (database, Redis) skips a tick; the page keeps its last frame.
                log.exception("could not render the Live page's tick")
                continue
            await self.live_fragments({"type": "live.fragments", "key": "tick", "html": html})
