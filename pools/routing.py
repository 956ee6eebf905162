"""Websocket routes for the Smart Balancer pages."""

from __future__ import annotations

from django.urls import path

from pools.consumers import PoolsConsumer

websocket_urlpatterns = [
    path("ws/pools/", PoolsConsumer.as_asgi()),
]
