from __future__ import annotations

from django.apps import AppConfig


class ServingConfig(AppConfig):
    """Model services: definitions, replicas, health, revisions, tokens, the model store."""

    name = "serving"
