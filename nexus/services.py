"""Operations on shared state: Redis connection, worker heartbeat, health report."""

from __future__ import annotations

import functools
import time
from typing import Any

import redis
from django.conf import settings
from django.db import connection

HEARTBEAT_TTL_S = 30


@functools.cache
def redis_client() -> redis.Redis:
    """Return the process's Redis client (the bundled server or REDIS_URL)."""
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


def redis_text(value: object) -> str:
    """Return a Redis reply (bytes from `redis_client`, which does not decode) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def heartbeat_key() -> str:
    return f"{settings.NEXUS_REDIS_PREFIX}:worker:heartbeat"


def record_worker_heartbeat() -> None:
    redis_client().set(heartbeat_key(), str(time.time()), ex=HEARTBEAT_TTL_S)


def health_report() -> tuple[bool, dict[str, Any]]:
    """Return whether Nexus can serve, and the state of the database, Redis and workers."""
    report: dict[str, Any] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        report["database"] = {"status": "ok", "engine": connection.vendor}
    except Exception as exc:
        report["database"] = {"status": "error", "error": type(exc).__name__}
    worker: dict[str, Any]
    try:
        client = redis_client()
        client.ping()
        report["redis"] = {"status": "ok", "bundled": settings.NEXUS_BUNDLED_REDIS}
        beat = client.get(heartbeat_key())
        if beat is None:
            worker = {"status": "missing", "detail": f"no heartbeat in {HEARTBEAT_TTL_S} s"}
        else:
            worker = {"status": "ok", "last_heartbeat_age_s": round(time.time() - float(beat), 1)}
    except redis.RedisError as exc:
        report["redis"] = {"status": "error", "error": type(exc).__name__}
        worker = {"status": "unknown", "detail": "Redis is unreachable"}
    report["worker"] = worker
    # Without Redis the gateway still serves (each process from its share of the targets), so
    # only the database decides whether Nexus can serve.
    healthy = report["database"]["status"] == "ok"
    complete = report["redis"]["status"] == "ok" and worker["status"] == "ok"
    report["status"] = "ok" if healthy and complete else ("degraded" if healthy else "error")
    return healthy, report
