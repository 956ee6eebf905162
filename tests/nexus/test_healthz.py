"""GET /healthz names the state of the database, Redis and the Celery worker.

In a process where no gateway serves: a gateway adds its own part (tests/reliability's Redis
outage test reads it from a live server)."""

from __future__ import annotations

import pytest
from django.test import Client

from nexus import services, tasks
from pools.gateway import app as gateway_app


@pytest.fixture(autouse=True)
def no_heartbeat() -> None:
    services.redis_client().delete(services.heartbeat_key())


@pytest.fixture(autouse=True)
def no_gateway_in_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    # An earlier test on this worker may have left its in-process gateway serving, its Redis
    # listener gone with that test's event loop: its part would read "degraded".
    monkeypatch.setattr(gateway_app, "_serving", None)


@pytest.mark.django_db
def test_it_reports_a_missing_worker_without_failing_the_check(client: Client) -> None:
    response = client.get("/healthz")

    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "degraded"
    assert body["database"]["status"] == "ok"
    assert body["redis"]["status"] == "ok"
    assert body["worker"] == {"status": "missing", "detail": "no heartbeat in 30 s"}


@pytest.mark.django_db
def test_it_reports_ok_once_the_worker_heartbeat_ran(client: Client) -> None:
    assert tasks.heartbeat() == "ok"

    body = client.get("/healthz").json()

    assert body["status"] == "ok"
    assert body["worker"]["status"] == "ok"
    assert 0 <= body["worker"]["last_heartbeat_age_s"] < 5


# It connects to a closed loopback port, where Redis is not.
@pytest.mark.live
@pytest.mark.django_db
def test_it_reports_an_unreachable_redis_as_degraded_since_the_gateway_still_serves(
    client: Client, settings
) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    services.redis_client.cache_clear()
    try:
        response = client.get("/healthz")
    finally:
        services.redis_client.cache_clear()

    assert response.status_code == 200
    assert response.json()["status"] == "degraded"
    assert response.json()["redis"] == {"status": "error", "error": "ConnectionError"}
    assert response.json()["worker"]["status"] == "unknown"
