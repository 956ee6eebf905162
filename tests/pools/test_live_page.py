"""The Live page: counts every gateway adds to Redis, the figures and charts read back from them,
the page and its socket through the real ASGI app (first render and pushes from one partial)."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from asgiref.sync import sync_to_async
from django.conf import settings as django_settings
from django.test import Client

from pools import live_figures
from pools.gateway.counters import BUCKET_S, LiveCounters, bucket_of, counts_key
from pools.gateway.publish import GatewayReadings, Publisher
from pools.live_figures import Bucket, figures, percentile
from serving.models import Service
from tests.nexus.factories import make_pool, make_target, make_user
from tests.support.personas import default_viewer
from tests.support.sockets import refusal, socket_of


@pytest.fixture
def prefix(settings: Any) -> Iterator[str]:
    """A Redis key prefix of this test's own."""
    prefix = f"test-livepage-{uuid.uuid4().hex[:12]}"
    settings.NEXUS_REDIS_PREFIX = prefix
    yield prefix
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    keys = list(client.scan_iter(f"{prefix}:*"))
    if keys:
        client.delete(*keys)
    client.close()


def test_percentiles_interpolate_within_the_histograms_buckets() -> None:
    # TTFT bounds (s): 0.01, 0.025, 0.05, 0.1, ...: 10 requests within 25-50 ms.
    histogram = [0, 0, 10] + [0] * 10

    assert percentile(histogram, 0.5) == pytest.approx(37.5)
    assert percentile(histogram, 0.95) == pytest.approx(48.75)
    assert percentile([0] * 13, 0.5) is None


def test_figures_are_the_latest_complete_ten_seconds_of_every_gateways_counts() -> None:
    counters = LiveCounters()
    for n in range(40):
        counters.add(1, 7 if n % 4 else 8, "ok" if n % 10 else "upstream_error", 30.0, 5, 20)
    counted = counters.take()[1]
    bucket = Bucket.parse({k.encode(): str(v).encode() for k, v in counted.fields().items()})
    now = 1_000_000.0 + 2 * BUCKET_S + 1.6  # two whole buckets done, publication lag passed

    shown = figures({1_000_000: bucket, 1_000_000 + BUCKET_S: bucket}, now)

    assert counters.take() == {}
    assert shown.requests_per_s == 8.0  # 80 requests in 10 s
    assert shown.tokens_per_s == 160.0
    assert shown.error_rate == 0.1
    assert shown.target_requests == {7: 60, 8: 20}
    assert 25.0 < (shown.ttft_p50_ms or 0) < 50.0


def test_charts_have_a_gap_before_the_first_count_and_zero_after_it() -> None:
    busy = Bucket(requests=10, completion_tokens=50, targets={7: 10})
    now = 1_000_000.0 + 3 * BUCKET_S + 1.6

    columns = live_figures.series({1_000_000: busy}, now, [7])

    assert columns.requests_per_s[-4:] == [None, 2.0, 0.0, 0.0]
    assert columns.target_requests_per_s[7][-3:] == [2.0, 0.0, 0.0]
    assert columns.ttft_p50_ms[-3:] == [None, None, None]  # no samples: no data
    assert columns.times[-1] == 1_000_000 + 3 * BUCKET_S


async def test_two_gateways_counts_add_up_in_one_bucket(prefix: str) -> None:
    first, second = (Publisher(django_settings.REDIS_URL, prefix) for _ in range(2))
    counters = LiveCounters()
    counters.add(3, 9, "ok", 12.0, 1, 4)
    once = counters.take()
    counters.add(3, 9, "ok", 12.0, 1, 6)
    counters.add(3, None, "queue_full", None, None, None)
    twice = counters.take()
    now = time.time()
    try:
        for publisher, counts in ((first, once), (second, twice)):
            readings = GatewayReadings(publisher.process, now, False, {}, {}, {})
            await publisher.publish(readings, counts)
    finally:
        await first.aclose()
        await second.aclose()

    found = await sync_to_async(live_figures.read_buckets)([3], now)

    assert found[3][bucket_of(now)] == Bucket(
        requests=3,
        errors=1,
        prompt_tokens=2,
        completion_tokens=10,
        ttft=(0, 2) + (0,) * 11,
        targets={9: 2},
    )


def test_an_open_page_reads_each_complete_bucket_once(prefix: str) -> None:
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    now = time.time()
    done, current = live_figures.last_complete(now), bucket_of(now)
    for start in (done, current):
        client.hset(counts_key(prefix, 5, start), mapping={"n": 10})
    cache = live_figures.BucketCache()
    first = live_figures.read_buckets([5], now, cache)

    for start in (done, current):
        client.hset(counts_key(prefix, 5, start), mapping={"n": 99})
    again = live_figures.read_buckets([5], now, cache)

    assert first[5][done].requests == first[5][current].requests == 10
    assert again[5][done].requests == 10  # complete: read once, kept
    assert again[5][current].requests == 99  # still being written: read again
    client.close()


@pytest.mark.django_db
def test_the_live_page_shows_the_pools_a_user_sees_and_links_each(prefix: str) -> None:
    pool = make_pool("chat", name="Chat models")
    make_target(pool, "gpu-a", capacity_weight=4)
    client = Client()
    client.force_login(default_viewer("teammate"))

    overview = client.get("/live/").content.decode()
    one = client.get("/live/chat/").content.decode()

    assert 'href="/live/chat/"' in overview and 'ws-connect="/ws/live/"' in overview
    assert 'data-target="gpu-a"' in one and 'ws-connect="/ws/live/chat/"' in one
    assert "0 of 4" in one
    for chart in ("live-requests", "live-tokens", "live-ttft", "live-share"):
        assert f'id="{chart}-data"' in one
    outsider = Client()
    outsider.force_login(make_user("outsider"))
    assert outsider.get("/live/chat/").status_code == 404
    assert 'href="/live/chat/"' not in outsider.get("/live/").content.decode()


def live_now(html: str) -> str:
    """Return the #live-now part of a page or a frame, without its out-of-band mark."""
    html = html.replace(' hx-swap-oob="true"', "")
    part = html[html.index('<div id="live-now"') :]
    # What follows it: the charts' card on the page, the charts' columns in a frame.
    part = re.split(r'<section class="card" id="live-charts"|<div id="live-requests-data"', part)[0]
    return re.sub(r"\s+", " ", part).strip()


async def test_the_socket_sends_the_pages_own_partial_at_once_and_then_every_second(
    transactional_db: None, prefix: str
) -> None:
    pool = await sync_to_async(make_pool)("chat", name="Chat models")
    await sync_to_async(make_target)(pool, "gpu-a", capacity_weight=4)
    user = await sync_to_async(default_viewer)("teammate")
    client = Client()
    await sync_to_async(client.force_login)(user)
    page = (await sync_to_async(client.get)("/live/chat/")).content.decode()

    socket = await socket_of("/ws/live/chat/", user)
    try:
        first = await socket.receive_from(timeout=5)
        began = asyncio.get_running_loop().time()
        second = await socket.receive_from(timeout=5)
        waited = asyncio.get_running_loop().time() - began
    finally:
        await socket.disconnect()

    assert '<div id="live-now" hx-swap-oob="true">' in first
    assert '<div id="live-requests-data" data-chart-data=' in first
    assert live_now(first) == live_now(page)
    assert live_now(second) == live_now(page)
    assert 0.5 < waited < 2.5


async def test_a_page_that_reconnects_catches_up_with_what_it_missed(
    transactional_db: None, prefix: str
) -> None:
    pool = await sync_to_async(make_pool)("chat", name="Chat models")
    user = await sync_to_async(default_viewer)("teammate")
    socket = await socket_of("/ws/live/", user)
    first = await socket.receive_from(timeout=5)
    await socket.disconnect()
    assert 'data-figure="requests">0 req/s<' in first

    # While the socket is down a gateway counts 60 requests in a bucket now complete.
    counters = LiveCounters()
    for _ in range(60):
        counters.add(pool.pk, None, "ok", 20.0, 1, 3)
    publisher = Publisher(django_settings.REDIS_URL, prefix)
    earlier = time.time() - BUCKET_S - 2.0
    try:
        readings = GatewayReadings(publisher.process, earlier, False, {}, {}, {})
        await publisher.publish(readings, counters.take())
    finally:
        await publisher.aclose()
    socket = await socket_of("/ws/live/", user)
    try:
        caught_up = await socket.receive_from(timeout=5)
    finally:
        await socket.disconnect()

    assert 'data-figure="requests">6.0 req/s<' in caught_up
    assert 'data-figure="tokens">18 tok/s<' in caught_up


async def test_a_pool_outside_the_users_projects_has_no_socket(
    transactional_db: None, prefix: str
) -> None:
    await sync_to_async(make_pool)("chat")

    assert await refusal("/ws/live/chat/", "outsider") == (False, 1000)
    assert await refusal("/ws/live/") == (False, 1000)


@pytest.mark.django_db
def test_live_says_when_a_service_that_scales_to_zero_sleeps(prefix: str) -> None:
    pool = make_pool("sleeper", name="Sleeper", managed=True)
    Service.objects.create(name="sleeper", pool=pool, desired_replicas=0, scale_to_zero_after_s=60)
    client = Client()
    client.force_login(make_user("owner", staff=True))

    overview = client.get("/live/").content.decode()
    one = client.get("/live/sleeper/").content.decode()

    assert '<small data-sleep="asleep">(asleep)</small>' in overview
    assert 'id="live-sleep"' in one and "asleep, 0 replicas; the next request wakes it" in one
