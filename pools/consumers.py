"""Websocket consumers of the Smart Balancer pages: authenticate, join a group, forward."""

from __future__ import annotations

from typing import Any

from nexus import access, live
from nexus.consumers import LiveConsumer, TickingLiveConsumer
from pools import live as pools_live
from pools import live_figures, live_views, pool_views


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


class LivePageConsumer(TickingLiveConsumer):
    """Send the Live page's figures and charts about once a second, rendered for this user.

    Nothing announces traffic (it changes all the time), so this socket renders its page's
    partials on a clock instead of hearing pushes: each tick is `current()`, the same partials
    as the first render, for the pools this user sees (one render per open Live page; docs/live.md).
    """

    def topic(self, user: Any, url: dict[str, Any]) -> str | None:
        if live_views.watched_pools(user, url.get("slug")) is None:
            return None
        self.user = user
        return f"live.{url.get('slug') or ''}"

    def current(self, audience: live.Audience, url: dict[str, Any]) -> str:
        slug = url.get("slug")
        pools = live_views.pools_for_push(self.user, slug)
        if pools is None:  # the pool was deleted or moved out of reach since the socket opened
            return ""
        return live_views.live_fragments(pools, single=slug is not None, cache=self.buckets)

    async def connect(self) -> None:
        self.buckets = live_figures.BucketCache()
        await super().connect()


class PoolPageConsumer(TickingLiveConsumer):
    """Send one pool page's live card (targets' states, health, load; the queue) every second.

    Rendered for this socket's user, who may see the pool: whether it shows the drain and resume
    buttons is their role's, not their audience's.
    """

    def topic(self, user: Any, url: dict[str, Any]) -> str | None:
        pool = pool_views.seen_pools(user).filter(slug=url["slug"]).first()
        if pool is None:
            return None
        self.can_manage = pool_views.may_operate(user, pool)
        return f"pool-{pool.slug}"

    def current(self, audience: live.Audience, url: dict[str, Any]) -> str:
        return pool_views.pool_live(url["slug"], can_manage=self.can_manage)


class TrafficRunConsumer(TickingLiveConsumer):
    """Send a Try traffic or drill run's live card every second while its page is open."""

    def topic(self, user: Any, url: dict[str, Any]) -> str | None:
        pool = pool_views.seen_pools(user).filter(slug=url["slug"]).first()
        if pool is None or not pool.traffic_runs.filter(pk=url["pk"]).exists():
            return None
        return f"pool-{pool.slug}-run-{url['pk']}"

    def current(self, audience: live.Audience, url: dict[str, Any]) -> str:
        return pool_views.run_live(url["slug"], url["pk"])
