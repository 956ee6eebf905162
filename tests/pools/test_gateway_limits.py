"""A token's limits and usage through the gateway, in process, against a real simulator engine.

Limits refuse with an OpenAI-shaped 429 naming the limit and a Retry-After; a tokens-per-minute
limit counts the usage of the answers, streams included; the usage rows written with the history
match what the answers reported, and the hot path still runs no database query.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db.backends.base.base import BaseDatabaseWrapper

from nexus import upstream
from nexus.models import ApiToken
from pools import history_writer
from pools.gateway.app import Gateway
from pools.gateway.history import HistoryShipper
from pools.gateway.ledger import LoadLedger, MemoryLedger, RedisLedger
from pools.gateway.registry import Registry
from pools.gateway.state import GatewayState
from pools.models import Pool, RoutingRecord, Target, TokenUsage
from tests.pools.test_gateway_hot_path import call
from tests.support.simulator import Simulator, running_simulator

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def engine() -> Iterator[Simulator]:
    with running_simulator(model="demo-8b", ttft_ms=0, tpot_ms=0) as sim:
        yield sim


@pytest.fixture(params=["memory", "redis"])
async def ledger(request: pytest.FixtureRequest) -> AsyncIterator[LoadLedger]:
    if request.param == "memory":
        yield MemoryLedger()
        return
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    yield RedisLedger(settings.REDIS_URL, prefix=prefix, lease_ttl_s=5)
    client = aioredis.Redis.from_url(settings.REDIS_URL)
    keys = [key async for key in client.scan_iter(f"{prefix}:*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


def configure(engine: Simulator, **limits: int) -> tuple[ApiToken, str]:
    pool = Pool.objects.create(name="Limited", slug="limited")
    Target.objects.create(
        pool=pool, name="a", base_url=engine.base_url, model_id="demo-8b", capacity_weight=8
    )
    return ApiToken.issue("app", **limits)


def body(stream: bool = False, max_tokens: int = 5) -> dict[str, Any]:
    return {
        "model": "@pool/limited",
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def answer(sent: list[dict]) -> tuple[int, dict[str, str], bytes]:
    headers = {k.decode(): v.decode() for k, v in sent[0]["headers"]}
    return sent[0]["status"], headers, b"".join(m.get("body", b"") for m in sent[1:])


def reported_usage(payload: bytes) -> tuple[int, int]:
    """Return the usage an answer reported, JSON or the usage event of a stream."""
    if payload.startswith(b"{"):
        usage = json.loads(payload)["usage"]
    else:
        events = [line[6:] for line in payload.split(b"\n") if line.startswith(b"data: {")]
        usage = [u for e in events if (u := json.loads(e).get("usage"))][-1]
    return usage["prompt_tokens"], usage["completion_tokens"]


async def test_the_61st_request_in_a_minute_is_refused_naming_the_limit(
    engine: Simulator, ledger: LoadLedger
) -> None:
    token, secret = await sync_to_async(configure)(engine, requests_per_minute=60)
    app = Gateway(Registry(refresh_interval_s=3600), GatewayState(ledger=ledger))
    try:
        statuses = [answer(await call(app, CHAT, body(), secret))[0] for _ in range(60)]
        status, headers, payload = answer(await call(app, CHAT, body(), secret))
    finally:
        await app.aclose()
        await upstream.close()

    assert statuses == [200] * 60
    assert status == 429
    assert 55 <= int(headers["retry-after"]) <= 60
    assert headers["x-nexus-request-id"]
    error = json.loads(payload)["error"]
    assert error["code"] == "rate_limit_exceeded"
    assert error["type"] == "rate_limit_error"
    assert "60 requests per minute" in error["message"]
    await sync_to_async(history_writer.drain)()  # as the writer process would
    outcomes = await sync_to_async(list)(RoutingRecord.objects.values_list("outcome", flat=True))
    assert sorted(set(outcomes)) == ["ok", "rate_limited"]


async def test_a_tokens_limit_counts_streamed_usage_the_client_did_not_ask_for(
    engine: Simulator, ledger: LoadLedger
) -> None:
    # Each stream answers 20 completion tokens plus its prompt: 3 fit under 100, the 4th waits.
    token, secret = await sync_to_async(configure)(engine, tokens_per_minute=100)
    app = Gateway(Registry(refresh_interval_s=3600), GatewayState(ledger=ledger))
    used = 0
    statuses = []
    try:
        while used < 100 and len(statuses) < 10:
            status, _, payload = answer(await call(app, CHAT, body(True, 20), secret))
            statuses.append(status)
            prompt, completion = reported_usage(payload)
            used += prompt + completion
        status, headers, payload = answer(await call(app, CHAT, body(True, 20), secret))
    finally:
        await app.aclose()
        await upstream.close()

    assert set(statuses) == {200} and 1 < len(statuses) < 10
    assert status == 429
    assert 55 <= int(headers["retry-after"]) <= 60
    assert "100 tokens per minute" in json.loads(payload)["error"]["message"]


async def test_usage_rows_match_the_answers_and_the_hot_path_queries_nothing(
    engine: Simulator, ledger: LoadLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    token, secret = await sync_to_async(configure)(
        engine, requests_per_minute=1000, tokens_per_minute=100_000, max_concurrent=4
    )
    # The history (and usage) is shipped when the gateway closes, not while queries are counted.
    history = HistoryShipper(ship_interval_s=3600, batch_size=1000)
    app = Gateway(Registry(refresh_interval_s=3600), GatewayState(ledger=ledger, history=history))
    prompt_sum = completion_sum = 0
    await call(app, CHAT, body(), secret)  # loads the snapshot
    cursors: list[str] = []
    real_cursor = BaseDatabaseWrapper.cursor

    def counting_cursor(self: BaseDatabaseWrapper) -> Any:
        cursors.append(self.alias)
        return real_cursor(self)

    try:
        monkeypatch.setattr(BaseDatabaseWrapper, "cursor", counting_cursor)
        for number in range(30):
            request = body(stream=number % 2 == 0, max_tokens=3 + number)
            status, _, payload = answer(await call(app, CHAT, request, secret))
            assert status == 200
            prompt, completion = reported_usage(payload)
            prompt_sum += prompt
            completion_sum += completion
        monkeypatch.undo()
        await call(app, CHAT, {"model": "@pool/limited", "messages": "not a list"}, secret)
    finally:
        monkeypatch.undo()
        await app.aclose()  # ships the buffered history to the stream
        await upstream.close()
    # The history writer (here, in this process) writes it, and the usage with it.
    await sync_to_async(history_writer.drain)()

    assert cursors == []
    rows = await sync_to_async(list)(TokenUsage.objects.values())
    assert len(rows) == 1
    row = rows[0]
    assert row["token_id"] == token.pk
    # The first call, the 30 counted and the refused one.
    assert (row["requests"], row["errors"]) == (32, 1)
    first = await sync_to_async(RoutingRecord.objects.order_by("created_at").first)()
    assert first is not None and first.prompt_tokens and first.completion_tokens
    assert row["prompt_tokens"] == prompt_sum + first.prompt_tokens
    assert row["completion_tokens"] == completion_sum + first.completion_tokens


async def test_a_concurrency_limit_refuses_while_the_tokens_requests_run(
    ledger: LoadLedger,
) -> None:
    with running_simulator(model="demo-8b", ttft_ms=0, tpot_ms=40) as slow:
        token, secret = await sync_to_async(configure)(slow, max_concurrent=2)
        app = Gateway(Registry(refresh_interval_s=3600), GatewayState(ledger=ledger))
        try:
            sent = await asyncio.gather(
                *(call(app, CHAT, body(True, 10), secret) for _ in range(3))
            )
            after = answer(await call(app, CHAT, body(True, 2), secret))
        finally:
            await app.aclose()
            await upstream.close()

    answers = sorted(answer(s)[0] for s in sent)
    assert answers == [200, 200, 429]
    refused = next(answer(s) for s in sent if answer(s)[0] == 429)
    assert refused[1]["retry-after"] == "1"
    assert "2 concurrent requests" in json.loads(refused[2])["error"]["message"]
    assert after[0] == 200  # the slots came back when the streams ended
