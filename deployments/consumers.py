"""Websocket consumer of the deployment page: authenticate, join the deployment's group, forward."""

from __future__ import annotations

from typing import Any

from deployments import live as deployments_live
from deployments.models import Deployment
from nexus import live
from nexus.consumers import LiveConsumer


class DeploymentConsumer(LiveConsumer):
    """Forward re-rendered node rows of one deployment to a signed-in detail page."""

    def topic(self, user: Any, url: dict[str, Any]) -> str | None:
        if not Deployment.objects.filter(pk=url["pk"]).exists():
            return None
        return deployments_live.topic(url["pk"])

    def current(self, audience: live.Audience, url: dict[str, Any]) -> str:
        return deployments_live.current(url["pk"], audience)
