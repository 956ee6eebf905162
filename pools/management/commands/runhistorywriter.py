"""Write the gateways' routing history from the Redis stream until SIGTERM or Ctrl-C."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from pools import services


class Command(BaseCommand):
    help = (
        "Read the routing history the gateways ship to Redis and write it to the database in "
        "bulk. Run one beside every gateway (or more: they share the work). SIGTERM writes what "
        "is already on the stream, then exits."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--consumer",
            default=None,
            help="This writer's name in the consumer group (default: writer@<hostname>); a "
            "restarted writer of the same name writes what its predecessor left unfinished.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not logging.getLogger().handlers:
            logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        self.stdout.write("history writer: started", ending="\n")
        self.stdout.flush()
        written = services.run_history_writer(stop, consumer=options["consumer"])
        self.stdout.write(f"history writer: stopped after {written} records")
