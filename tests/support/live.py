"""A real Nexus server process (daphne, or uvicorn) on a free loopback port, sharing the test
database, with the history writer (`manage.py runhistorywriter`) that a gateway needs beside it."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx
from django.conf import settings
from django.db import connection

from tests.support import preloaded, processes
from tests.support.http import LOOPBACK
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
    process: preloaded.Process
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        processes.stop(self.process, timeout_s=10)


def history_writer_argv(consumer: str) -> list[str]:
    """Return the command that runs the history writer under this consumer name."""
    return [
        sys.executable,
        str(REPO_ROOT / "manage.py"),
        "runhistorywriter",
        "--consumer",
        consumer,
    ]


@contextmanager
def running_history_writer(
    tmp_dir: Path, consumer: str = "writer-tests", **extra_env: str
) -> Iterator[preloaded.Process]:
    """Run the history writer until the block ends; stopping it writes what is on the stream."""
    with _history_writer(tmp_dir, consumer, **extra_env) as (process, log_path):
        _wait_for_writer(process, log_path)
        yield process


@contextmanager
def _history_writer(
    tmp_dir: Path, consumer: str, **extra_env: str
) -> Iterator[tuple[preloaded.Process, Path]]:
    """Start the history writer (not waiting for it); stop it when the block ends."""
    # A log per run: a restarted writer's readiness is read from its own.
    log_path = tmp_dir / f"history-writer-{consumer}-{uuid.uuid4().hex[:6]}.log"
    with log_path.open("wb") as log:
        process = preloaded.start(
            history_writer_argv(consumer), server_environment(**extra_env), log
        )
    try:
        yield process, log_path
    finally:
        processes.stop(process, timeout_s=20)


def _wait_for_writer(process: preloaded.Process, log_path: Path) -> None:
    # Ready once its signal handlers are in place: a stop from then on writes what is left.
    wait_until(lambda: _writer_started(process, log_path), timeout_s=30, what=log_path.read_text)


def _writer_started(process: preloaded.Process, log_path: Path) -> bool:
    if process.poll() is not None:
        raise RuntimeError(
            f"history writer exited with {process.returncode}:\n{log_path.read_text()}"
        )
    return "history writer: started" in log_path.read_text(errors="replace")


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
    """Run daphne (or uvicorn) with Nexus's ASGI app, and a history writer, until the block ends.

    Both start at once (each takes about a second to import Nexus); the server stops first
    (shipping its last records), then the writer (writing them).
    """
    port = free_port()
    with (
        _history_writer(tmp_dir, f"writer-{port}", **extra_env) as (writer, writer_log),
        _web_server(tmp_dir, server, port, **extra_env) as live,
    ):
        _wait_for_writer(writer, writer_log)
        _wait_for_server(live)
        yield live


@contextmanager
def running_web_server(
    tmp_dir: Path, server: str = "daphne", port: int | None = None, **extra_env: str
) -> Iterator[LiveServer]:
    """Run the web server alone (no history writer: its records wait on the stream)."""
    with _web_server(tmp_dir, server, port or free_port(), **extra_env) as live:
        _wait_for_server(live)
        yield live


@contextmanager
def _web_server(tmp_dir: Path, server: str, port: int, **extra_env: str) -> Iterator[LiveServer]:
    """Start the web server (not waiting for it); stop it when the block ends."""
    log_path = tmp_dir / f"{server}-{port}.log"
    with log_path.open("wb") as log:
        process = preloaded.start(server_argv(server, port), server_environment(**extra_env), log)
    live = LiveServer(port=port, process=process, log_path=log_path)
    try:
        yield live
    finally:
        live.stop()


def _wait_for_server(server: LiveServer) -> None:
    wait_until(lambda: _answers(server), timeout_s=30, what=lambda: server.log())


def _answers(server: LiveServer) -> bool:
    if server.process.poll() is not None:
        raise RuntimeError(f"server exited with {server.process.returncode}:\n{server.log()}")
    try:
        return LOOPBACK.get(f"{server.url}/healthz", timeout=2).status_code in (200, 503)
    except httpx.HTTPError:
        return False
