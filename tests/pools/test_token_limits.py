"""Per-token limits: the window rule, then the ledger that enforces it, in memory and in Redis."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from django.conf import settings

from pools.balancer.limits import WINDOW_S, Limit, TokenLimits, prune, retry_after
from pools.gateway.ledger import LoadLedger, MemoryLedger, RedisLedger

TOKEN = 11


def test_a_window_admits_below_its_limit_and_says_when_the_oldest_bucket_leaves() -> None:
    now = 1000.25
    buckets = {950: 2, 990: 3, 1000: 5}
    total = prune(buckets, now)

    assert total == 10
    assert retry_after(buckets, total, 11, now) is None
    # 10 of 10: the first request fits again when second 950 leaves the window, at 1010.
    assert retry_after(buckets, total, 10, now) == pytest.approx(950 + WINDOW_S - now)
    # 10 of 8: seconds 950 and 990 must both leave (2 + 3 gone leaves 5 < 8).
    assert retry_after(buckets, total, 8, now) == pytest.approx(990 + WINDOW_S - now)


def test_buckets_older_than_the_window_are_dropped() -> None:
    buckets = {900: 7, 940: 1, 941: 2}

    assert prune(buckets, 1000.5) == 2
    assert buckets == {941: 2}


@pytest.fixture(params=["memory", "redis"])
async def ledger(request: pytest.FixtureRequest) -> AsyncIterator[LoadLedger]:
    if request.param == "memory":
        yield MemoryLedger()
        return
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    made = RedisLedger(settings.REDIS_URL, prefix=prefix, lease_ttl_s=5)
    yield made
    await made.aclose()
    client = aioredis.Redis.from_url(settings.REDIS_URL)
    keys = [key async for key in client.scan_iter(f"{prefix}:*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


async def test_requests_per_minute_admits_exactly_the_limit(ledger: LoadLedger) -> None:
    limits = TokenLimits(requests_per_minute=60)
    admissions = await asyncio.gather(*(ledger.admit(TOKEN, limits) for _ in range(75)))

    refused = [a for a in admissions if a.refused is not None]
    assert len(refused) == 15
    assert {a.refused for a in refused} == {Limit.REQUESTS_PER_MINUTE}
    # All were counted within a second or two: the window frees them about a minute later.
    assert all(WINDOW_S - 3 < a.retry_after_s <= WINDOW_S for a in refused)
    # Another token has its own budget.
    assert (await ledger.admit(TOKEN + 1, limits)).refused is None


async def test_tokens_per_minute_counts_what_settled_requests_used(ledger: LoadLedger) -> None:
    limits = TokenLimits(tokens_per_minute=100)
    first = await ledger.admit(TOKEN, limits)
    second = await ledger.admit(TOKEN, limits)
    assert first.refused is None and second.refused is None

    await ledger.settle(first, 60)
    assert (await ledger.admit(TOKEN, limits)).refused is None  # 60 of 100 used
    await ledger.settle(second, 45)

    refused = await ledger.admit(TOKEN, limits)
    assert refused.refused is Limit.TOKENS_PER_MINUTE
    assert WINDOW_S - 3 < refused.retry_after_s <= WINDOW_S


async def test_concurrent_requests_are_held_until_settled(ledger: LoadLedger) -> None:
    limits = TokenLimits(concurrent=2)
    held = [await ledger.admit(TOKEN, limits) for _ in range(2)]
    assert all(a.refused is None and a.lease_id for a in held)

    refused = await ledger.admit(TOKEN, limits)
    assert refused.refused is Limit.CONCURRENT and refused.retry_after_s >= 1

    await ledger.settle(held[0], 0)
    await ledger.settle(held[0], 0)  # twice gives back nothing more
    again = await ledger.admit(TOKEN, limits)
    assert again.refused is None
    assert (await ledger.admit(TOKEN, limits)).refused is Limit.CONCURRENT


async def test_a_refused_request_counts_against_no_window(ledger: LoadLedger) -> None:
    limits = TokenLimits(requests_per_minute=5, concurrent=1)
    first = await ledger.admit(TOKEN, limits)
    for _ in range(10):
        assert (await ledger.admit(TOKEN, limits)).refused is Limit.CONCURRENT
    await ledger.settle(first, 0)

    # Only the first was counted: four more fit in the minute.
    for _ in range(4):
        admission = await ledger.admit(TOKEN, limits)
        assert admission.refused is None
        await ledger.settle(admission, 0)
    assert (await ledger.admit(TOKEN, limits)).refused is Limit.REQUESTS_PER_MINUTE


# It connects to a closed loopback port, where Redis is not.
@pytest.mark.live
async def test_an_unreachable_redis_lets_requests_through() -> None:
    ledger = RedisLedger("redis://127.0.0.1:1/0", prefix="nowhere", lease_ttl_s=5)
    started = time.monotonic()
    try:
        admission = await ledger.admit(TOKEN, TokenLimits(requests_per_minute=1, concurrent=1))
    finally:
        await ledger.aclose()
    assert admission.refused is None
    assert time.monotonic() - started < 5
