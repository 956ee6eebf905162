"""Websocket consumer of the nodes page: authenticate, join the fleet's group, forward."""

from __future__ import annotations

from typing import Any

from nexus import live
from nexus.consumers import LiveConsumer
from nodes import live as nodes_live


class NodesConsumer(LiveConsumer):
    """Forward the re-rendered nodes table to a signed-in nodes page."""

    def topic(self, user: Any, url: dict[str, Any]) -> str:
        return nodes_live.NODES_TOPIC

    def current(self, audience: live.Audience, url: dict[str, Any]) -> str:
        return nodes_live.nodes_table(audience)
