"""Usage accounting: the history's batches add up per token, pool and hour; read through the API."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from rest_framework.test import APIClient

from nexus.models import ApiToken
from pools.gateway.history import write_rows
from pools.models import Pool, TokenUsage
from serving.models import Service
from tests.nexus.factories import make_pool, make_user
from tests.pools.test_history import row

pytestmark = pytest.mark.django_db

HOUR = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def usage(token_id: int, pool: Pool, hour: datetime) -> tuple[int, int, int, int]:
    found = TokenUsage.objects.get(token_id=token_id, pool=pool, hour=hour)
    return found.requests, found.errors, found.prompt_tokens, found.completion_tokens


def test_batches_add_up_per_token_pool_and_hour() -> None:
    chat, other = make_pool("chat"), make_pool("other")
    at = HOUR + timedelta(minutes=59, seconds=59)
    first = [
        row(chat, 1, token_id=7, created_at=HOUR, prompt_tokens=10, completion_tokens=5),
        row(chat, 2, token_id=7, created_at=at, prompt_tokens=3, completion_tokens=None),
        row(chat, 3, token_id=7, created_at=at, outcome="upstream_error", status_code=502),
        row(other, 4, token_id=7, created_at=HOUR, prompt_tokens=1, completion_tokens=1),
        row(chat, 5, token_id=8, created_at=HOUR + timedelta(hours=1), prompt_tokens=2),
        row(chat, 6, token_id=None, created_at=HOUR),  # a public service's anonymous caller
    ]
    second = [
        row(chat, 7, token_id=7, created_at=HOUR.timestamp() + 60, prompt_tokens=4,
            completion_tokens=6, outcome="rate_limited", status_code=429),
    ]  # fmt: skip

    write_rows(first)
    write_rows(second)

    assert usage(7, chat, HOUR) == (4, 2, 17, 11)
    assert usage(7, other, HOUR) == (1, 0, 1, 1)
    assert usage(8, chat, HOUR + timedelta(hours=1)) == (1, 0, 2, 0)
    assert TokenUsage.objects.count() == 3


def test_the_usage_api_filters_by_token_pool_service_and_time() -> None:
    chat = make_pool("chat")
    managed = make_pool("svc-pool", managed=True)
    Service.objects.create(name="svc", pool=managed)
    write_rows(
        [
            row(chat, 1, token_id=7, created_at=HOUR, prompt_tokens=10, completion_tokens=5),
            row(chat, 2, token_id=8, created_at=HOUR + timedelta(hours=2)),
            row(managed, 3, token_id=7, created_at=HOUR + timedelta(hours=1)),
        ]
    )
    client = APIClient()
    client.force_login(make_user("ops", staff=True))

    def listed(**query: str) -> list[tuple[int, str, str | None]]:
        response = client.get("/api/v1/usage/", query)
        assert response.status_code == 200, response.content
        results = response.json()
        results = results.get("results", results) if isinstance(results, dict) else results
        return [(r["token_id"], r["pool"], r["service"]) for r in results]

    assert listed() == [(8, "chat", None), (7, "svc-pool", "svc"), (7, "chat", None)]
    assert listed(token="7") == [(7, "svc-pool", "svc"), (7, "chat", None)]
    assert listed(pool="chat") == [(8, "chat", None), (7, "chat", None)]
    assert listed(service="svc") == [(7, "svc-pool", "svc")]
    since, until = HOUR + timedelta(hours=1), HOUR + timedelta(hours=2)
    assert listed(since=since.isoformat(), until=until.isoformat()) == [(7, "svc-pool", "svc")]
    first = client.get("/api/v1/usage/", {"token": "7", "pool": "chat"}).json()
    first = first.get("results", first) if isinstance(first, dict) else first
    assert first[0]["hour"].startswith("2026-06-01T12:00:00")
    assert (first[0]["requests"], first[0]["prompt_tokens"], first[0]["completion_tokens"]) == (
        1,
        10,
        5,
    )
    assert client.get("/api/v1/usage/", {"since": "yesterday"}).status_code == 400


def test_a_token_limited_to_a_pool_sees_only_that_pools_usage() -> None:
    chat, other = make_pool("chat"), make_pool("other")
    write_rows([row(chat, 1, token_id=7), row(other, 2, token_id=7)])
    _, secret = ApiToken.issue("narrow", pools=["chat"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")

    response = client.get("/api/v1/usage/")

    if response.status_code == 200:
        results = response.json()
        results = results.get("results", results) if isinstance(results, dict) else results
        assert {r["pool"] for r in results} == {"chat"}
    else:  # client tokens may not read the admin API at all (docs/access.md)
        assert response.status_code in (401, 403)
