"""Websocket consumers of the Smart Balancer pages: authenticate, join a group, forward."""

from __future__ import annotations

from typing import Any

from nexus import access, live
from nexus.consumers import LiveConsumer
from pools import live as pools_live


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
