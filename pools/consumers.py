"""Websocket consumers of the Smart Balancer pages: authenticate, join a group, forward."""

from __future__ import annotations

from channels.generic.websocket import AsyncWebsocketConsumer

from pools.live import POOLS_GROUP, PoolsChanged


class PoolsConsumer(AsyncWebsocketConsumer):
    """Forward the re-rendered pools table to a signed-in pools page."""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close()
            return
        await self.channel_layer.group_add(POOLS_GROUP, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(POOLS_GROUP, self.channel_name)

    async def pools_changed(self, message: PoolsChanged) -> None:
        await self.send(text_data=message["html"])
