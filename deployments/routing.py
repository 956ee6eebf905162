"""Websocket routes for the deployment pages."""

from __future__ import annotations

from django.urls import path

from deployments.consumers import DeploymentConsumer

# Channels routes consumers with Django's path(); django-stubs types its view as a view only.
websocket_urlpatterns = [
    path("ws/deployments/<int:pk>/", DeploymentConsumer.as_asgi()),  # type: ignore[arg-type]
]
