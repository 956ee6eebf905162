"""Websocket consumer of the deployment page: authenticate, join the deployment's group, forward."""

from __future__ import annotations

from channels.generic.websocket import AsyncWebsocketConsumer

from deployments.live import NodeChanged, group_name


class DeploymentConsumer(AsyncWebsocketConsumer):
    """Forward re-rendered node rows of one deployment to a signed-in detail page.

    Plain text frames, not JSON: the htmx websocket extension swaps the HTML in by its ids.
    """

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close()
            return
        self.group = group_name(self.scope["url_route"]["kwargs"]["pk"])
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def deployment_node_changed(self, message: NodeChanged) -> None:
        await self.send(text_data=message["html"])
