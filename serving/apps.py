from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class ServingConfig(AppConfig):
    """Model services: definitions, replicas, health, revisions, tokens, the model store."""

    name = "serving"

    def ready(self) -> None:
        from serving.defaults import create_defaults
        from serving.store_seed import seed_store

        post_migrate.connect(create_defaults, sender=self)
        post_migrate.connect(seed_store, sender=self)
