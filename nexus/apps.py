from __future__ import annotations

from django.apps import AppConfig


class NexusConfig(AppConfig):
    """Shared models (client tokens, configuration version), settings checks and wiring."""

    name = "nexus"
    verbose_name = "Nexus"

    def ready(self) -> None:
        from nexus import checks, signals  # noqa: F401  (registers checks)

        signals.connect_config_inputs()
