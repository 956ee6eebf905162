"""Websocket routes for the serving pages."""

from __future__ import annotations

from django.urls import path

from serving.consumers import ServiceConsumer, ServicesConsumer, TrialConsumer

# Channels routes consumers with Django's path(); django-stubs types its view as a view only.
websocket_urlpatterns = [
    path("ws/serving/services/", ServicesConsumer.as_asgi()),  # type: ignore[arg-type]
    path("ws/serving/services/<int:pk>/", ServiceConsumer.as_asgi()),  # type: ignore[arg-type]
    path("ws/serving/trials/<int:pk>/", TrialConsumer.as_asgi()),  # type: ignore[arg-type]
]
