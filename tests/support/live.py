"""A real Nexus server process (daphne, or uvicorn) on a free loopback port, sharing the test
database."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx
from django.conf import settings
from django.db import connection

from tests.support import processes
from tests.support.ports import free_port
from tests.support.waiting import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def test_database_url() -> str:
    """Return a DATABASE_URL naming the test database pytest-django created."""
    db = connection.settings_dict
    if db["ENGINE"] == "django.db.backends.sqlite3":
        return f"sqlite:///{db['NAME']}"
    auth = db["USER"] or ""
    if db["PASSWORD"]:
        auth += f":{db['PASSWORD']}"
    host = db["HOST"] or "127.0.0.1"
    port = db["PORT"] or 5432
    return f"postgres://{auth}@{host}:{port}/{db['NAME']}"


def server_environment(**extra: str) -> dict[str, str]:
    """Return the environment for a Nexus process that sees what the tests see."""
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="nexus.settings",
        DATABASE_URL=test_database_url(),
        REDIS_URL=settings.REDIS_URL,
        NEXUS_DATA_DIR=str(settings.DATA_DIR),
        NEXUS_SECRET_KEY=settings.SECRET_KEY,
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


@dataclass
class LiveServer:
    """A running Nexus server."""

    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        processes.stop(self.process, timeout_s=10)


def server_argv(server: str, port: int) -> list[str]:
    """Return the command that serves Nexus's ASGI app: daphne, or uvicorn as documented
    ("uvicorn"), or uvicorn with its other HTTP protocol ("uvicorn-h11")."""
    if server in ("uvicorn", "uvicorn-h11"):
        http = "h11" if server == "uvicorn-h11" else "httptools"
        return [sys.executable, "-m", "uvicorn", "nexus.asgi:application", "--host", "127.0.0.1",
                "--port", str(port), "--loop", "uvloop", "--http", http, "--lifespan",
                "off", "--no-access-log"]  # fmt: skip
    return [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
            "nexus.asgi:application"]  # fmt: skip


@contextmanager
def running_nexus(tmp_dir: Path, server: str = "daphne", **extra_env: str) -> Iterator[LiveServer]:
    """Run daphne (or uvicorn) with Nexus's ASGI app until the block ends."""
    port = free_port()
    log_path = tmp_dir / f"{server}-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            server_argv(server, port),
            cwd=REPO_ROOT,
            env=server_environment(**extra_env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    server = LiveServer(port=port, process=process, log_path=log_path)
    try:
        wait_until(lambda: _answers(server), timeout_s=30, what=lambda: server.log())
        yield server
    finally:
        server.stop()


def _answers(server: LiveServer) -> bool:
    if server.process.poll() is not None:
        raise RuntimeError(f"server exited with {server.process.returncode}:\n{server.log()}")
    try:
        return httpx.get(f"{server.url}/healthz", timeout=2).status_code in (200, 503)
    except httpx.HTTPError:
        return False
