"""The load ledger: a target never holds more requests than its capacity, in one process or many."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis.asyncio as aioredis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from nexus.env import env_choice
from pools.balancer.limits import TokenLimits
from pools.gateway.ledger import (
    LoadLedger,
    MemoryLedger,
    RedisLedger,
    build_ledger,
)

TARGET = 7
OTHER_TARGET = 8
TOKEN = 3

MakeRedisLedger = Callable[..., RedisLedger]


@pytest.fixture
async def redis_prefix() -> AsyncIterator[str]:
    """A key prefix of this test's own, removed afterwards."""
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    yield prefix
    client = aioredis.Redis.from_url(settings.REDIS_URL)
    keys = [key async for key in client.scan_iter(f"{prefix}:*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


@pytest.fixture
async def make_redis_ledger(redis_prefix: str) -> AsyncIterator[MakeRedisLedger]:
    """Build Redis ledgers sharing one prefix, as gateway processes share Redis; close after."""
    made: list[RedisLedger] = []

    def make(lease_ttl_s: float = 60.0) -> RedisLedger:
        ledger = RedisLedger(settings.REDIS_URL, prefix=redis_prefix, lease_ttl_s=lease_ttl_s)
        made.append(ledger)
        return ledger

    yield make
    for ledger in made:
        await ledger.aclose()


@pytest.fixture(params=["memory", "redis"])
def ledger(request: pytest.FixtureRequest) -> LoadLedger:
    if request.param == "memory":
        return MemoryLedger()
    return request.getfixturevalue("make_redis_ledger")()


async def test_it_admits_exactly_capacity_of_200_concurrent_attempts(ledger: LoadLedger) -> None:
    leases = await asyncio.gather(*(ledger.try_acquire(TARGET, 10) for _ in range(200)))

    granted = [lease for lease in leases if lease is not None]
    assert len(granted) == 10
    assert len({lease.lease_id for lease in granted}) == 10
    assert ledger.in_flight(TARGET) == 10


# 200 clients on one Redis connection pool: under other tests' load, waits for a connection
# exceed its timeout.
@pytest.mark.serial
async def test_200_holders_cycling_at_once_never_exceed_capacity(ledger: LoadLedger) -> None:
    capacity = 4
    holding = 0
    most = 0
    served = 0

    # Each lease is held 10-30 ms, longer than a Redis round trip on a loaded machine: with holds
    # of 0-3 ms, a CI run's releases took longer than the holds, and no moment saw all four held.
    async def client() -> None:
        nonlocal holding, most, served
        for _ in range(5):
            lease = await ledger.try_acquire(TARGET, capacity)
            if lease is None:
                await asyncio.sleep(random.uniform(0, 0.02))
                continue
            holding += 1
            most = max(most, holding)
            await asyncio.sleep(random.uniform(0.01, 0.03))
            holding -= 1
            served += 1
            await ledger.release(lease)

    await asyncio.gather(*(client() for _ in range(200)))

    assert most == capacity
    assert served >= capacity
    assert ledger.in_flight(TARGET) == 0


async def test_a_released_slot_goes_to_the_next_request(ledger: LoadLedger) -> None:
    first = await ledger.try_acquire(TARGET, 1)
    assert first is not None
    assert await ledger.try_acquire(TARGET, 1) is None

    await ledger.release(first)

    assert ledger.in_flight(TARGET) == 0
    assert await ledger.try_acquire(TARGET, 1) is not None


async def test_releasing_a_lease_twice_gives_back_one_slot(ledger: LoadLedger) -> None:
    first = await ledger.try_acquire(TARGET, 2)
    second = await ledger.try_acquire(TARGET, 2)
    assert first is not None and second is not None

    await ledger.release(first)
    await ledger.release(first)

    assert ledger.in_flight(TARGET) == 1
    assert await ledger.try_acquire(TARGET, 2) is not None
    assert await ledger.try_acquire(TARGET, 2) is None


async def test_each_target_has_its_own_capacity(ledger: LoadLedger) -> None:
    assert await ledger.try_acquire(TARGET, 1) is not None

    assert await ledger.try_acquire(TARGET, 1) is None
    assert await ledger.try_acquire(OTHER_TARGET, 1) is not None
    assert (ledger.in_flight(TARGET), ledger.in_flight(OTHER_TARGET)) == (1, 1)


async def test_a_lower_capacity_refuses_while_more_are_in_flight(ledger: LoadLedger) -> None:
    for _ in range(3):
        assert await ledger.try_acquire(TARGET, 3) is not None

    # The operator lowered the capacity to 2 while 3 requests run: none more until below 2.
    assert await ledger.try_acquire(TARGET, 2) is None
    assert ledger.in_flight(TARGET) == 3


async def test_an_unknown_target_has_nothing_in_flight(ledger: LoadLedger) -> None:
    await ledger.refresh([TARGET])

    assert ledger.in_flight(TARGET) == 0


async def test_a_process_that_stopped_renewing_frees_its_slots_after_the_ttl(
    make_redis_ledger: MakeRedisLedger,
) -> None:
    crashed, survivor = make_redis_ledger(lease_ttl_s=0.5), make_redis_ledger(lease_ttl_s=0.5)
    assert await crashed.try_acquire(TARGET, 1) is not None
    await crashed.aclose()  # its renewer stops, as when the process dies

    assert await survivor.try_acquire(TARGET, 1) is None
    await asyncio.sleep(0.6)

    assert await survivor.try_acquire(TARGET, 1) is not None


async def test_a_running_request_keeps_its_lease_past_the_ttl(
    make_redis_ledger: MakeRedisLedger,
) -> None:
    holder, other = make_redis_ledger(lease_ttl_s=0.6), make_redis_ledger(lease_ttl_s=0.6)
    lease = await holder.try_acquire(TARGET, 1)
    assert lease is not None

    await asyncio.sleep(1.5)  # 2.5 TTLs: renewed every 0.2 s

    assert await other.try_acquire(TARGET, 1) is None
    await holder.release(lease)
    assert await other.try_acquire(TARGET, 1) is not None
    assert holder.lost_leases == 0


async def test_a_lease_that_expired_is_not_renewed_back(
    make_redis_ledger: MakeRedisLedger, redis_prefix: str
) -> None:
    holder, other = make_redis_ledger(), make_redis_ledger()
    lease = await holder.try_acquire(TARGET, 1)
    assert lease is not None
    client = aioredis.Redis.from_url(settings.REDIS_URL)
    # As if the renewer had missed a whole TTL: the lease expired and the slot went to another.
    await client.zrem(f"{redis_prefix}:ledger:target:{TARGET}", lease.lease_id)
    await client.aclose()
    assert await other.try_acquire(TARGET, 1) is not None

    await holder.renew([lease])

    assert holder.lost_leases == 1
    await other.refresh([TARGET])
    assert other.in_flight(TARGET) == 1


async def test_refresh_brings_in_the_counts_of_other_processes(
    make_redis_ledger: MakeRedisLedger,
) -> None:
    busy, watcher = make_redis_ledger(), make_redis_ledger()
    leases = [await busy.try_acquire(TARGET, 4) for _ in range(3)]
    assert watcher.in_flight(TARGET) == 0

    await watcher.refresh([TARGET, OTHER_TARGET])
    assert (watcher.in_flight(TARGET), watcher.in_flight(OTHER_TARGET)) == (3, 0)

    assert leases[0] is not None
    await busy.release(leases[0])
    await watcher.refresh([TARGET])
    assert watcher.in_flight(TARGET) == 2


async def test_an_acquire_tells_the_count_across_processes(
    make_redis_ledger: MakeRedisLedger,
) -> None:
    first, second = make_redis_ledger(), make_redis_ledger()
    await first.try_acquire(TARGET, 4)
    await first.try_acquire(TARGET, 4)

    await second.try_acquire(TARGET, 4)

    assert second.in_flight(TARGET) == 3


async def test_an_acquire_cancelled_in_flight_gives_its_slot_back(
    make_redis_ledger: MakeRedisLedger,
) -> None:
    ledger, watcher = make_redis_ledger(), make_redis_ledger()
    attempt = asyncio.ensure_future(ledger.try_acquire(TARGET, 1))
    await asyncio.sleep(0)  # the call to Redis is on its way

    attempt.cancel()
    with pytest.raises(asyncio.CancelledError):
        await attempt

    await wait_for(lambda: _count(watcher), expected=0)
    assert await watcher.try_acquire(TARGET, 1) is not None


async def test_leases_live_under_the_configured_prefix(
    make_redis_ledger: MakeRedisLedger, redis_prefix: str
) -> None:
    await make_redis_ledger().try_acquire(TARGET, 1)

    client = aioredis.Redis.from_url(settings.REDIS_URL)
    try:
        assert await client.zcard(f"{redis_prefix}:ledger:target:{TARGET}") == 1
    finally:
        await client.aclose()


# It connects to a closed loopback port, where Redis is not.
@pytest.mark.live
async def test_an_unreachable_redis_admits_from_this_process_share_of_the_capacity() -> None:
    ledger = RedisLedger("redis://127.0.0.1:1/0", prefix="unreachable", processes=lambda: 2)
    try:
        leases = [await ledger.try_acquire(TARGET, 5) for _ in range(3)]

        assert [lease is not None for lease in leases] == [True, True, False]
        status = ledger.status()
        assert (status.shared, status.processes) == (False, 2)
        assert status.report()["status"] == "degraded"
        assert ledger.in_flight(TARGET) == 4  # this process's two, scaled to the whole
    finally:
        await ledger.aclose()


@pytest.mark.parametrize(
    ("choice", "bundled", "kind"),
    [
        ("auto", True, MemoryLedger),
        ("auto", False, RedisLedger),
        ("memory", False, MemoryLedger),
        ("redis", True, RedisLedger),
    ],
)
async def test_the_ledger_follows_the_settings(
    settings: pytest.FixtureRequest, choice: str, bundled: bool, kind: type
) -> None:
    settings.NEXUS_LEDGER = choice
    settings.NEXUS_BUNDLED_REDIS = bundled

    ledger = build_ledger()

    assert isinstance(ledger, kind)
    await ledger.aclose()


def test_an_unknown_ledger_setting_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEXUS_LEDGER", "etcd")

    with pytest.raises(ImproperlyConfigured, match="NEXUS_LEDGER='etcd'"):
        env_choice("NEXUS_LEDGER", "auto", ("auto", "memory", "redis"))


async def _count(ledger: RedisLedger) -> int:
    await ledger.refresh([TARGET])
    return ledger.in_flight(TARGET)


async def wait_for(probe: Callable[[], Awaitable[int]], *, expected: int) -> None:
    """Wait up to 2 s for probe() to return expected."""
    for _ in range(40):
        if await probe() == expected:
            return
        await asyncio.sleep(0.05)
    assert await probe() == expected


# It connects to a closed loopback port, where Redis is not.
@pytest.mark.live
async def test_an_unreachable_redis_lets_limited_tokens_through_and_logs_the_outage_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger = RedisLedger("redis://127.0.0.1:1/0", prefix="unreachable")
    limits = TokenLimits(requests_per_minute=1, tokens_per_minute=10, concurrent=1)
    try:
        with caplog.at_level("WARNING", logger="pools.gateway.ledger"):
            admissions = [await ledger.admit(TOKEN, limits) for _ in range(5)]
            for admission in admissions:
                await ledger.settle(admission, tokens=100)
            lease = await ledger.try_acquire(TARGET, 4)

        assert [admission.refused for admission in admissions] == [None] * 5
        assert lease is not None
        assert [record.getMessage()[:33] for record in caplog.records] == [
            "load ledger: Redis unreachable; a"
        ]
    finally:
        await ledger.aclose()


async def test_a_count_read_before_a_release_arrived_does_not_bring_the_released_slot_back(
    make_redis_ledger: MakeRedisLedger,
) -> None:
    # Given a process holding one slot, and its periodic refresh on its way to Redis
    ledger = make_redis_ledger()
    lease = await ledger.try_acquire(TARGET, 4)
    assert lease is not None
    refreshing = asyncio.ensure_future(ledger.refresh([TARGET]))
    await asyncio.sleep(0)

    # When the slot is given back before the refresh's count (still 1) comes in
    releasing = asyncio.ensure_future(ledger.release(lease))
    seen = []
    refreshing.add_done_callback(lambda _: seen.append(ledger.in_flight(TARGET)))
    await asyncio.gather(refreshing, releasing)

    # Then the count stays 0 throughout: the next decision must not find the slot taken
    assert seen == [0]
    assert ledger.in_flight(TARGET) == 0
