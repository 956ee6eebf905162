"""Websocket routes for the nodes pages."""

from __future__ import annotations

from django.urls import path

from nodes.consumers import NodesConsumer

# Channels routes consumers with Django's path(); django-stubs types its view as a view only.
websocket_urlpatterns = [
    path("ws/nodes/", NodesConsumer.as_asgi()),  # type: ignore[arg-type]
]
