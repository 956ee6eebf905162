"""Two real processes share one target through the Redis ledger and never exceed its capacity."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings

from pools.gateway.ledger import RedisLedger

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
