"""Websocket consumers of the Smart Balancer pages: authenticate, join a group, forward."""

from __future__ import annotations

from typing import Any

from nexus import live
from nexus.consumers import LiveConsumer
from pools import live as pools_live


class PoolsConsumer(LiveConsumer):
    """Forward the re-rendered pools table to a signed-in pools page."""

    def topic(self, user: Any, url: dict[str, Any]) -> str:
        return pools_live.POOLS_TOPIC

    def current(self, audience: live.Audience, url: dict[str, Any]) -> str:
        return pools_live.pools_table(audience)
