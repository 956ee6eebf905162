"""The base of every live page's websocket consumer (docs/ui.md, "Live pages")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, ClassVar

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from nexus import live

log = logging.getLogger(__name__)


class LiveConsumer(AsyncWebsocketConsumer):
    """Authenticate, check access, join the page's groups, send the current state, forward.

    A subclass says which topic a user may watch (`topic`, None to refuse) and what the page's
    live parts are now (`current`); both run in a thread with database access and get the URL's
    arguments (`url`, e.g. {"pk": 12}). Frames are plain text: the htmx websocket extension swaps
    the HTML in by its ids. Pushes arriving within `min_interval_s` of the previous frame wait
    and are merged by key.
    """

    min_interval_s: ClassVar[float] = 1.0

    def topic(self, user: Any, url: dict[str, Any]) -> str | None:
        """Return the topic the user may watch on this page, or None to refuse the socket."""
        raise NotImplementedError

    def current(self, audience: live.Audience, url: dict[str, Any]) -> str:
        """Return the page's live parts as they are now, rendered out of band."""
        raise NotImplementedError

    def hears_pushes(self, user: Any) -> bool:
        """Say whether the user's socket joins the topic's groups (else it gets only `current`)."""
        return True

    async def connect(self) -> None:
        self.joined: list[str] = []
        self.pending: dict[str, str] = {}
        self.last_sent = float("-inf")
        self.flush: asyncio.Task[None] | None = None
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close()
            return
        url = self.scope["url_route"]["kwargs"]
        topic = await database_sync_to_async(self.topic)(user, url)
        if topic is None:
            await self.close()
            return
        self.accepted_topic = topic
        audience = live.audience_of(user)
        # Joined before the current state is read: a change made meanwhile is pushed after it.
        if self.hears_pushes(user):
            self.joined = [live.group(topic), live.group(topic, audience)]
        for name in self.joined:
            await self.channel_layer.group_add(name, self.channel_name)
        await self.accept()
        # A page that reconnects catches up on whatever it missed while the socket was down.
        await self.live_fragments(
            {
                "type": "live.fragments",
                "key": "current",
                "html": await database_sync_to_async(self.current)(audience, url),
            }
        )

    async def disconnect(self, code: int) -> None:
        if self.flush is not None:
            self.flush.cancel()
        for name in self.joined:
            await self.channel_layer.group_discard(name, self.channel_name)

    async def live_fragments(self, message: live.Fragments) -> None:
        # Re-inserted, so that fragments go out in the order of their latest push.
        self.pending.pop(message["key"], None)
        self.pending[message["key"]] = message["html"]
        if self.flush is not None:
            return
        wait = self.last_sent + self.min_interval_s - asyncio.get_running_loop().time()
        if wait <= 0:
            await self.send_pending()
        else:
            self.flush = asyncio.create_task(self.send_pending(after_s=wait))

    async def send_pending(self, *, after_s: float = 0.0) -> None:
        if after_s:
            await asyncio.sleep(after_s)
        html = "".join(self.pending.values())
        self.pending.clear()
        self.flush = None
        self.last_sent = asyncio.get_running_loop().time()
        if html.strip():
            await self.send(text_data=html)


class TickingLiveConsumer(LiveConsumer):
    """A live page whose parts change all the time (traffic, in-flight counts, circuits): nothing
    announces those changes, so the socket renders `current()` again every `tick_s` instead of
    hearing pushes. One render per open page and tick: for pages of one object, not of the fleet.
    """

    tick_s: ClassVar[float] = 1.0

    def hears_pushes(self, user: Any) -> bool:
        return False

    async def connect(self) -> None:
        self.ticker: asyncio.Task[None] | None = None
        await super().connect()
        if getattr(self, "accepted_topic", None) is not None:  # a refused socket never ticks
            self.ticker = asyncio.create_task(self.tick_forever())

    async def disconnect(self, code: int) -> None:
        if self.ticker is not None:
            self.ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.ticker
        await super().disconnect(code)

    async def tick_forever(self) -> None:
        url = self.scope["url_route"]["kwargs"]
        audience = live.audience_of(self.scope["user"])
        render = database_sync_to_async(self.current)
        while True:
            await asyncio.sleep(self.tick_s)
            try:
                html = await render(audience, url)
            except Exception:
                # A failing read (database, Redis) skips a tick; the page keeps its last frame.
                log.exception("could not render a tick of %s", type(self).__name__)
                continue
            await self.live_fragments({"type": "live.fragments", "key": "tick", "html": html})
