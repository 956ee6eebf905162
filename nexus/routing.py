"""Websocket routes of every app, gathered for the ASGI router."""

from __future__ import annotations

from django.urls import path

from deployments.routing import websocket_urlpatterns as deployments_websockets
from nexus.ui.consumers import KitConsumer
from nodes.routing import websocket_urlpatterns as nodes_websockets
from pools.routing import websocket_urlpatterns as pools_websockets

websocket_urlpatterns = [
    *pools_websockets,
    *nodes_websockets,
    *deployments_websockets,
    # Channels routes consumers with Django's path(); django-stubs types it as a view only.
    path("ws/ui/kit/", KitConsumer.as_asgi()),  # type: ignore[arg-type]
]
