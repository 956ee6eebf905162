"""Websocket routes for the Smart Balancer pages."""

from __future__ import annotations

from django.urls import path

from pools.consumers import LivePageConsumer, PoolPageConsumer, PoolsConsumer, TrafficRunConsumer

# Channels routes consumers with Django's path(); django-stubs types its view as a view only.
websocket_urlpatterns = [
    path("ws/pools/", PoolsConsumer.as_asgi()),  # type: ignore[arg-type]
    path("ws/pools/<slug:slug>/", PoolPageConsumer.as_asgi()),  # type: ignore[arg-type]
    path("ws/pools/<slug:slug>/runs/<int:pk>/", TrafficRunConsumer.as_asgi()),  # type: ignore[arg-type]
    path("ws/live/", LivePageConsumer.as_asgi()),  # type: ignore[arg-type]
    path("ws/live/<slug:slug>/", LivePageConsumer.as_asgi()),  # type: ignore[arg-type]
]
