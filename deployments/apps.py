from __future__ import annotations

from django.apps import AppConfig


class DeploymentsConfig(AppConfig):
    """Runtimes and models put on many nodes, with per-node progress."""

    name = "deployments"
