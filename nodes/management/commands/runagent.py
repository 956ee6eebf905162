"""Run the Nexus agent on this machine: `manage.py runagent`, the same as `nexus-agent`."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from nodes.agent.config import add_options, config_from_options
from nodes.agent.server import run


class Command(BaseCommand):
    help = (
        "Run the Nexus agent: it reports this machine's identity, resources and models, runs "
        "processes and deploy jobs, and forwards inference to local runtimes. It needs no database."
    )
    # The agent touches no database and no Django model, so it needs no system checks.
    requires_system_checks: list[str] = []
    requires_migrations_checks = False

    def add_arguments(self, parser: ArgumentParser) -> None:
        add_options(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        """Serve until SIGTERM or SIGINT; the processes the agent started keep running."""
        run(config_from_options(options))
