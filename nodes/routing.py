"""Websocket routes for the nodes pages."""

from __future__ import annotations

from django.urls import path

from nodes.consumers import NodesConsumer

websocket_urlpatterns = [
    path("ws/nodes/", NodesConsumer.as_asgi()),
]
