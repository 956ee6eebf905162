"""Websocket routes of every app, gathered for the ASGI router."""

from __future__ import annotations

from django.urls import path, re_path

from deployments.routing import websocket_urlpatterns as deployments_websockets
from nexus.ui.consumers import KitConsumer
from nexus.websockets import UnknownPath
from nodes.routing import websocket_urlpatterns as nodes_websockets
from pools.routing import websocket_urlpatterns as pools_websockets
from serving.routing import websocket_urlpatterns as serving_websockets

websocket_urlpatterns = [
    *pools_websockets,
    *nodes_websockets,
    *deployments_websockets,
    *serving_websockets,
    # Channels routes consumers with Django's path(); django-stubs types it as a view only.
    path("ws/ui/kit/", KitConsumer.as_asgi()),  # type: ignore[arg-type]
    # Last: any other path is closed cleanly instead of raising in the router.
    re_path(r"", UnknownPath.as_asgi()),  # type: ignore[arg-type]
]
