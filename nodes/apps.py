from __future__ import annotations

from django.apps import AppConfig


class NodesConfig(AppConfig):
    """Nexus agents and compatible endpoints that lend their models (the fleet)."""

    name = "nodes"

    def ready(self) -> None:
        from nodes import signals  # noqa: F401  (signals push changes to the pages)
