from __future__ import annotations

from django.apps import AppConfig


class PoolsConfig(AppConfig):
    """Pools, targets, the balancer and the gateway."""

    name = "pools"
    verbose_name = "Smart Balancer"

    def ready(self) -> None:
        from pools import signals  # noqa: F401  (announces changes to the gateway)
