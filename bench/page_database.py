"""A throwaway PostgreSQL database for the page benchmarks, and their timing loop.

`on_throwaway_database` creates a database on the server DATABASE_URL names (default: the local
one), points Django at it, runs the benchmark (which sets Django up and migrates) and drops the
database whatever happened. `timed` calls a page a few times and returns the median and the
slowest, in ms.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

SERVER_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")


def on_throwaway_database(prefix: str, run: Callable[[], None]) -> None:
    """Run `run` with Django's settings pointing at a new database named <prefix>_<random>."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(SERVER_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        os.environ["DATABASE_URL"] = urlunsplit(urlsplit(SERVER_URL)._replace(path=f"/{name}"))
        os.environ["DJANGO_SETTINGS_MODULE"] = "nexus.settings"
        os.environ.setdefault("NEXUS_DATA_DIR", f"/tmp/{name}")
        os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/15")
        os.environ.setdefault("NEXUS_REDIS_PREFIX", name)
        run()
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(SERVER_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def timed(call: Callable[[], Any], runs: int, check: Callable[[Any], None]) -> tuple[float, float]:
    """Call `call` `runs` times, checking each answer; return the median and the max, in ms."""
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        answer = call()
        times.append((time.perf_counter() - began) * 1000)
        check(answer)
    return statistics.median(times), max(times)
