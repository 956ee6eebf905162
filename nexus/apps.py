from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class NexusConfig(AppConfig):
    """Shared models (client tokens, configuration version), settings checks and wiring."""

    name = "nexus"
    verbose_name = "Nexus"

    def ready(self) -> None:
        from nexus import checks, signals  # noqa: F401  (registers checks)
        from nexus.models import create_default_project

        signals.connect_config_inputs()
        post_migrate.connect(create_default_project, sender=self)
