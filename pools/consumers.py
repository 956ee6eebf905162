"""Websocket consumers of the Smart Balancer pages: authenticate, join a group, forward."""

from __future__ import annotations

from typing import Any

from nexus import access, live
from nexus.consumers import LiveConsumer, TickingLiveConsumer
from pools import live as pools_live
from pools import pool_views


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


class PoolPageConsumer(TickingLiveConsumer):
    """Send one pool page's live card (targets' states, health, load; the queue) every second.

    Rendered for this socket's user, who may see the pool: whether it shows the drain and resume
    buttons is their role's, not their audience's.
    """

    def topic(self, user: Any, url: dict[str, Any]) -> str | None:
        pool = pool_views.visible_pools(user).filter(slug=url["slug"]).first()
        if pool is None:
            return None
        self.can_manage = pool_views.may_operate(user, pool)
        return f"pool-{pool.slug}"

    def current(self, audience: live.Audience, url: dict[str, Any]) -> str:
        return pool_views.pool_live(url["slug"], can_manage=self.can_manage)


class TrafficRunConsumer(TickingLiveConsumer):
    """Send a Try traffic or drill run's live card every second while its page is open."""

    def topic(self, user: Any, url: dict[str, Any]) -> str | None:
        pool = pool_views.visible_pools(user).filter(slug=url["slug"]).first()
        if pool is None or not pool.traffic_runs.filter(pk=url["pk"]).exists():
            return None
        return f"pool-{pool.slug}-run-{url['pk']}"

    def current(self, audience: live.Audience, url: dict[str, Any]) -> str:
        return pool_views.run_live(url["slug"], url["pk"])
