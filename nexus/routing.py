"""Websocket routes of every app, gathered for the ASGI router."""

from __future__ import annotations

from deployments.routing import websocket_urlpatterns as deployments_websockets
from pools.routing import websocket_urlpatterns as pools_websockets

websocket_urlpatterns = [*pools_websockets, *deployments_websockets]
