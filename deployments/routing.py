"""Websocket routes for the deployment pages."""

from __future__ import annotations

from django.urls import path

from deployments.consumers import DeploymentConsumer

websocket_urlpatterns = [
    path("ws/deployments/<int:pk>/", DeploymentConsumer.as_asgi()),
]
