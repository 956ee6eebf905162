"""Two real processes share one target through the Redis ledger and never exceed its capacity.

First the ledger itself, driven by two bare processes; then two live gateways (daphne) on the same
database and Redis, sending real streams to one engine.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redis
from django.conf import settings

from nexus.models import ApiToken
from pools.gateway.ledger import RedisLedger
from pools.models import Pool
from tests.nexus.factories import make_pool, make_target
from tests.support.live import running_nexus
from tests.support.simulator import Simulator, running_simulator
from tests.support.traffic import Answer, chat_body, send

REPO_ROOT = Path(__file__).resolve().parents[2]
TARGET = 1
CAPACITY = 4

# One gateway process: WORKERS concurrent clients, each running bounded acquire/hold/release
# cycles. Every holder counts itself in a Redis counter while it holds a lease, and the most
# holders ever seen at once across both processes is kept beside it, atomically.
GATEWAY = """
import asyncio, json, random, sys, time
import redis.asyncio as aioredis
from pools.gateway.ledger import RedisLedger

url, prefix, target, capacity, workers, cycles = sys.argv[1:7]
target, capacity, workers, cycles = int(target), int(capacity), int(workers), int(cycles)
ENTER = '''
local n = redis.call('INCR', KEYS[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
return n
'''

async def main():
    ledger = RedisLedger(url, prefix=prefix, lease_ttl_s=5)
    probe = aioredis.Redis.from_url(url)
    enter = probe.register_script(ENTER)
    holders, most, ready = f"{prefix}:holders", f"{prefix}:most", f"{prefix}:ready"
    # Start together, so that the two processes really contend.
    await probe.incr(ready)
    deadline = time.monotonic() + 20
    while int(await probe.get(ready)) < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    granted = refused = 0

    async def client():
        nonlocal granted, refused
        for _ in range(cycles):
            if time.monotonic() > deadline:
                return
            lease = await ledger.try_acquire(target, capacity)
            if lease is None:
                refused += 1
                await asyncio.sleep(random.uniform(0, 0.004))
                continue
            granted += 1
            await enter(keys=[holders, most])
            await asyncio.sleep(random.uniform(0.002, 0.01))
            await probe.decr(holders)
            await ledger.release(lease)

    await asyncio.gather(*(client() for _ in range(workers)))
    print(json.dumps({"granted": granted, "refused": refused}))
    await ledger.aclose()
    await probe.aclose()

asyncio.run(main())
"""

# A gateway process that takes every slot, says so, and then hangs until it is killed.
HOARDER = """
import asyncio, sys
from pools.gateway.ledger import RedisLedger

async def main():
    url, prefix, target, capacity, ttl = sys.argv[1:6]
    ledger = RedisLedger(url, prefix=prefix, lease_ttl_s=float(ttl))
    for _ in range(int(capacity)):
        assert await ledger.try_acquire(int(target), int(capacity)) is not None
    print("held", flush=True)
    await asyncio.sleep(120)

asyncio.run(main())
"""


@pytest.fixture
def prefix() -> Iterator[str]:
    """A Redis key prefix of this test's own, removed afterwards."""
    prefix = f"test-two-{uuid.uuid4().hex[:12]}"
    yield prefix
    client = redis.Redis.from_url(settings.REDIS_URL)
    keys = list(client.scan_iter(f"{prefix}:*"))
    if keys:
        client.delete(*keys)
    client.close()


def python(code: str, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_processes_never_hold_more_than_the_capacity_together(prefix: str) -> None:
    gateways = [
        python(GATEWAY, settings.REDIS_URL, prefix, TARGET, CAPACITY, 8, 40) for _ in range(2)
    ]
    reports = []
    for process in gateways:
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        reports.append(json.loads(out))

    client = redis.Redis.from_url(settings.REDIS_URL)
    most = int(client.get(f"{prefix}:most") or 0)
    holders = int(client.get(f"{prefix}:holders") or 0)
    leases_left = client.zcard(f"{prefix}:ledger:target:{TARGET}")
    client.close()
    assert most <= CAPACITY
    assert most == CAPACITY, "the processes never filled the target: the test proved nothing"
    assert all(report["granted"] > 0 for report in reports), reports
    assert sum(report["refused"] for report in reports) > 0, reports
    assert (holders, leases_left) == (0, 0)


def test_the_slots_of_a_killed_process_come_back_after_the_lease_ttl(prefix: str) -> None:
    ttl_s = 2.0
    hoarder = python(HOARDER, settings.REDIS_URL, prefix, TARGET, CAPACITY, ttl_s)
    try:
        assert hoarder.stdout is not None
        assert hoarder.stdout.readline().strip() == "held", hoarder.stderr
    finally:
        hoarder.send_signal(signal.SIGKILL)
        hoarder.wait(timeout=10)
    killed_at = time.monotonic()

    freed_after = asyncio.run(wait_for_a_free_slot(prefix, timeout_s=ttl_s + 3))

    assert freed_after is not None, "the dead process's leases never expired"
    # Not freed at once (the slots were really held), and freed by about one TTL after the kill.
    assert freed_after > 0.5
    assert time.monotonic() - killed_at < ttl_s + 1.5


async def wait_for_a_free_slot(prefix: str, *, timeout_s: float) -> float | None:
    """Return the seconds until the target had a free slot, or None after timeout_s."""
    ledger = RedisLedger(settings.REDIS_URL, prefix=prefix, lease_ttl_s=5)
    start = time.monotonic()
    try:
        while time.monotonic() - start < timeout_s:
            lease = await ledger.try_acquire(TARGET, CAPACITY)
            if lease is not None:
                await ledger.release(lease)
                return time.monotonic() - start
            await asyncio.sleep(0.05)
        return None
    finally:
        await ledger.aclose()


def sample_running(engine: Simulator, stop: threading.Event, every_s: float) -> list[int]:
    """Return the engine's running count, read every `every_s` until `stop` (at most 30 s)."""
    samples: list[int] = []
    deadline = time.monotonic() + 30
    with httpx.Client(timeout=2) as client:
        while not stop.is_set() and time.monotonic() < deadline:
            stats = client.get(f"{engine.root_url}/sim/stats").json()
            samples.append(stats["requests_running"])
            time.sleep(every_s)
    return samples


def test_two_live_gateways_never_send_a_target_more_than_its_capacity_together(
    committed_db, django_db_blocker, tmp_path: Path, prefix: str
) -> None:
    # Given one target of capacity 2 on an engine that would run 8 at once, and two gateways
    # sharing the test database and Redis (the bundled one when REDIS_URL is unset):
    with running_simulator(model="demo-8b", ttft_ms=0, tpot_ms=30, concurrency=8) as engine:
        with django_db_blocker.unblock():
            pool = make_pool("shared-engine")
            make_target(
                pool, "only", base_url=engine.base_url, model_id="demo-8b", capacity_weight=2
            )
            token_row, token = ApiToken.issue("two gateways")
        env = {"NEXUS_LEDGER": "redis", "NEXUS_REDIS_PREFIX": prefix}
        try:
            with running_nexus(tmp_path, **env) as one, running_nexus(tmp_path, **env) as two:
                urls = [f"{server.url}/v1/chat/completions" for server in (one, two)]
                stop = threading.Event()
                with ThreadPoolExecutor(max_workers=13) as executor:
                    sampler = executor.submit(sample_running, engine, stop, 0.02)
                    # When 12 streams arrive at once, 6 on each gateway,
                    body = chat_body("shared-engine", max_tokens=10, stream=True)
                    futures = [
                        executor.submit(send, urls[index % 2], token, body) for index in range(12)
                    ]
                    answers: list[Answer] = [future.result() for future in futures]
                    stop.set()
                    samples = sampler.result()
                completed = engine.stats()["requests_completed"]
        finally:
            with django_db_blocker.unblock():
                Pool.objects.filter(pk=pool.pk).delete()
                token_row.delete()

    # Then every stream is answered in full, and the engine never ran more than 2 at once.
    assert [(answer.status, answer.done, answer.target) for answer in answers] == [
        (200, True, "only")
    ] * 12
    assert len(samples) >= 20, "too few samples to say anything"
    assert max(samples) <= 2, samples
    assert max(samples) == 2, "the target was never full: the test proved nothing"
    assert completed == 12
    # Request ids start with a per-process half: both processes answered.
    assert len({answer.request_id[:16] for answer in answers}) == 2
