"""Websocket consumers of the Smart Balancer pages: authenticate, join a group, forward."""

from __future__ import annotations

from typing import Any

from nexus import access, live
from nexus.consumers import LiveConsumer
from pools import live as pools_live


class PoolsConsumer(LiveConsumer):
    """Send a signed-in pools page its table; forward the changes pushed to staff's pages.

    Pushes are rendered once, with every pool, so only staff sockets join the groups; any
    other user's socket gets their own projects' table when it (re)connects, and no pushes.
    """

    def topic(self, user: Any, url: dict[str, Any]) -> str:
        return pools_live.POOLS_TOPIC

    def hears_pushes(self, user: Any) -> bool:
        return access.is_staff(user)

    def current(self, audience: live.Audience, url: dict[str, Any]) -> str:
        return pools_live.pools_table_of(self.scope["user"])
