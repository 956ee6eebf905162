from __future__ import annotations

from django.apps import AppConfig


class PoolsConfig(AppConfig):
    """Pools, targets, the balancer and the gateway."""

    name = "pools"
    verbose_name = "Smart Balancer"

    def ready(self) -> None:
        from nexus import scopes
        from pools import services, signals  # noqa: F401  (signals announce changes)

        scopes.provide_pool_slugs(services.pool_slugs)
