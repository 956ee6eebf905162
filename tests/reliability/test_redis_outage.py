"""Redis killed and restarted under two live gateways sharing the Redis ledger: no request fails,
the target is never sent more than its capacity, and no capacity is lost afterwards.

The gateways (daphne) and the engine are real processes; Redis is a redis-server of this test's
own on a Unix socket, killed with SIGKILL and started again empty, as a crash would leave it.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from nexus import embedded_redis
from nexus.models import ApiToken
from pools.gateway.ledger import RECONNECT_INTERVAL_S, RedisLedger
from pools.models import Pool
from tests.nexus.factories import make_pool, make_target
from tests.support import outcomes
from tests.support.http import LOOPBACK
from tests.support.live import LiveServer, running_nexus
from tests.support.simulator import Simulator, running_simulator
from tests.support.traffic import Answer, chat_body, send
from tests.support.waiting import wait_until

TARGET = 1
CAPACITY = 4  # the target's; two gateways take 2 each while Redis is away
CLIENTS = 6  # more than the capacity, so that the target stays full and requests queue
BEFORE_S, OUTAGE_S, AFTER_S = 3.0, 5.0, 4.0

# Every test here runs a redis-server of its own (OwnRedis), which the tiers cannot see.
pytestmark = pytest.mark.live


class OwnRedis:
    """A redis-server on a socket of the test's own, to kill and start again."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    def start(self) -> None:
        self.process = embedded_redis.start(self.socket_path)

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=5)

    def client(self) -> redis.Redis:
        return redis.Redis(unix_socket_path=str(self.socket_path), socket_timeout=2)


@contextmanager
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path / "redis.sock")
    server.start()
    try:
        yield server
    finally:
        if server.process is not None and server.process.poll() is None:
            embedded_redis.stop(server.process)


@asynccontextmanager
async def two_processes(
    tmp_path: Path, prefix: str
) -> AsyncIterator[tuple[OwnRedis, RedisLedger, RedisLedger]]:
    """Redis of the test's own and the ledgers of two gateway processes sharing it."""
    with own_redis(tmp_path) as own:
        one = RedisLedger(own.url, prefix=prefix, processes=lambda: 2)
        two = RedisLedger(own.url, prefix=prefix, processes=lambda: 2)
        try:
            yield own, one, two
        finally:
            await one.aclose()
            await two.aclose()


def healthz(server: LiveServer) -> dict[str, Any]:
    response = LOOPBACK.get(f"{server.url}/healthz", timeout=5)
    return {"http_status": response.status_code, **response.json()}


def ledger_status(server: LiveServer) -> str | None:
    return healthz(server).get("gateway", {}).get("ledger", {}).get("status")


def keep_streaming(url: str, token: str, stop: threading.Event) -> list[Answer]:
    """Send streams one after another until `stop` (bounded: at most 60 s)."""
    answers = []
    deadline = time.monotonic() + 60
    body = chat_body("survives-redis", max_tokens=8, stream=True)
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            answers.append(send(url, token, body, timeout_s=30))
        except httpx.HTTPError as error:
            answers.append(Answer(0, httpx.Headers(), repr(error).encode(), [], 0.0, 0.0))
    return answers


def sample_running(engine: Simulator, stop: threading.Event) -> list[tuple[float, int]]:
    """Read the engine's running count every 20 ms until `stop`: (monotonic time, count)."""
    samples = []
    deadline = time.monotonic() + 60
    with httpx.Client(timeout=2) as client:
        while not stop.is_set() and time.monotonic() < deadline:
            running = client.get(f"{engine.root_url}/sim/stats").json()["requests_running"]
            samples.append((time.monotonic(), running))
            time.sleep(0.02)
    return samples


def test_two_gateways_serve_through_a_redis_crash_without_errors_or_overload(
    committed_db, django_db_blocker, tmp_path: Path
) -> None:
    prefix = f"test-outage-{uuid.uuid4().hex[:8]}"
    with (
        own_redis(tmp_path) as own,
        running_simulator(model="demo-8b", ttft_ms=20, tpot_ms=25, concurrency=16) as engine,
    ):
        with django_db_blocker.unblock():
            pool = make_pool("survives-redis")
            target = make_target(
                pool, "only", base_url=engine.base_url, model_id="demo-8b", capacity_weight=CAPACITY
            )
            token_row, token = ApiToken.issue("outage")
        env = {"NEXUS_LEDGER": "redis", "NEXUS_REDIS_PREFIX": prefix, "REDIS_URL": own.url}
        try:
            with running_nexus(tmp_path, **env) as one, running_nexus(tmp_path, **env) as two:
                gateways = (one, two)
                stop = threading.Event()
                with ThreadPoolExecutor(max_workers=CLIENTS + 1) as executor:
                    sampler = executor.submit(sample_running, engine, stop)
                    clients = [
                        executor.submit(
                            keep_streaming,
                            f"{gateways[i % 2].url}/v1/chat/completions",
                            token,
                            stop,
                        )
                        for i in range(CLIENTS)
                    ]
                    # Given both gateways serving and each knowing the other (published state),
                    time.sleep(BEFORE_S)
                    # when Redis dies,
                    own.kill()
                    killed_at = time.monotonic()
                    degraded = wait_until(
                        lambda: all(ledger_status(g) == "degraded" for g in gateways),
                        timeout_s=OUTAGE_S,
                        what="the gateways never noticed the outage",
                    )
                    during = healthz(one)
                    # (meanwhile a refusal is still OpenAI-shaped JSON, and the model list works)
                    refused = LOOPBACK.post(
                        f"{one.url}/v1/chat/completions",
                        headers={"Authorization": "Bearer nx-not-a-token"},
                        json=chat_body("survives-redis"),
                        timeout=10,
                    )
                    models = LOOPBACK.get(
                        f"{two.url}/v1/models",
                        headers={"Authorization": f"Bearer {token}"},
                        timeout=10,
                    )
                    noticed_s = time.monotonic() - killed_at
                    time.sleep(max(0.0, OUTAGE_S - noticed_s))
                    # and comes back empty,
                    own.start()
                    restarted_at = time.monotonic()
                    wait_until(
                        lambda: all(ledger_status(g) == "ok" for g in gateways),
                        timeout_s=10,
                        what="the gateways never went back to the shared ledger",
                    )
                    recovered_s = time.monotonic() - restarted_at
                    time.sleep(AFTER_S)
                    stop.set()
                    answers = [answer for client in clients for answer in client.result()]
                    samples = sampler.result()
                # Once the traffic stopped, every slot is free again: nothing held, nothing lost.
                leases = wait_until(
                    lambda: own.client().zcard(f"{prefix}:ledger:target:{target.pk}") == 0,
                    timeout_s=5,
                    what="leases stayed behind in Redis",
                )
                logs = [g.log() for g in gateways]
        finally:
            with django_db_blocker.unblock():
                Pool.objects.filter(pk=pool.pk).delete()
                token_row.delete()

    failed = [answer for answer in answers if answer.status != 200 or not answer.done]
    outcome = {
        "requests": len(answers),
        "failed": len(failed),
        "outage_noticed_s": round(noticed_s, 2),
        "recovered_after_restart_s": round(recovered_s, 2),
        "most_running_on_engine": max(running for _, running in samples),
        "capacity": CAPACITY,
    }
    outcomes.record("redis_outage", outcome)
    # Then no request failed (and none got HTML or a 500),
    assert failed == [], [(a.status, a.content[:200], a.events[-1:]) for a in failed]
    assert len(answers) > 3 * CLIENTS, "too little traffic to say anything"
    # the engine never ran more than the target's capacity, and was full (the test means it),
    # (each sample over it is told by its time from the kill and from the restart)
    over = [
        (running, round(at - killed_at, 2), round(at - restarted_at, 2))
        for at, running in samples
        if running > CAPACITY
    ]
    assert over == [], over
    assert outcome["most_running_on_engine"] == CAPACITY, "the target was never full: no proof"
    # /healthz told the outage and the share each process took,
    assert degraded
    assert during["http_status"] == 200
    assert during["status"] == "degraded"
    assert during["gateway"]["ledger"]["processes"] == 2
    assert during["gateway"]["revocations"]["status"] == "degraded"
    assert (refused.status_code, refused.json()["error"]["code"]) == (401, "invalid_api_key")
    assert models.status_code == 200
    assert "@pool/survives-redis" in [model["id"] for model in models.json()["data"]]
    # the outage was logged once per process, not per request, and so was its end,
    for log in logs:
        assert log.count("Redis unreachable; admitting") == 1, log[-3000:]
        assert log.count("Redis reachable again") == 1, log[-3000:]
    assert leases


async def test_slots_taken_and_given_back_while_the_ledger_reconnects_are_counted_right(
    tmp_path: Path,
) -> None:
    # Given a ledger that served two requests from its share while Redis was down
    with own_redis(tmp_path) as own:
        ledger = RedisLedger(own.url, prefix="reconnect", processes=lambda: 1)
        try:
            before = await ledger.try_acquire(TARGET, CAPACITY)  # Redis is up
            assert before is not None
            own.kill()
            first = await ledger.try_acquire(TARGET, CAPACITY)
            second = await ledger.try_acquire(TARGET, CAPACITY)
            assert first is not None and second is not None
            assert ledger.status().outage_since is not None
            own.start()  # empty, as after a crash
            await asyncio.sleep(RECONNECT_INTERVAL_S)

            # When one request ends, and another begins, while the leases are being written back
            reconnecting = asyncio.create_task(ledger.refresh([TARGET]))
            await asyncio.sleep(0)
            await ledger.release(first)
            third = await ledger.try_acquire(TARGET, CAPACITY)
            await reconnecting

            # Then Redis holds exactly the three requests still running (the one from before
            # the outage, the second and the third): nothing released, nothing missing
            assert ledger.status().outage_since is None
            assert third is not None
            leases = own.client().zrange(f"reconnect:ledger:target:{TARGET}", 0, -1)
            assert sorted(lease.decode() for lease in leases) == sorted(
                lease.lease_id for lease in (before, second, third)
            )
        finally:
            await ledger.aclose()


async def test_a_process_back_from_an_outage_keeps_to_its_share_until_the_others_are_back(
    tmp_path: Path,
) -> None:
    # Given two processes that each hold their share (2 of 4) from their outage
    async with two_processes(tmp_path, "settle") as (own, one, two):
        own.kill()
        held = [await ledger.try_acquire(TARGET, CAPACITY) for ledger in (one, one, two, two)]
        assert all(held)
        own.start()
        await asyncio.sleep(RECONNECT_INTERVAL_S)

        # When the first is back on Redis before the second has written its leases back
        await one.refresh([TARGET])
        assert one.status().outage_since is None
        assert two.status().outage_since is not None

        # Then it takes no more than its share, though Redis counts only its own two
        assert await one.try_acquire(TARGET, CAPACITY) is None
        # and once both are back, Redis counts all four: the target is full for both
        await two.refresh([TARGET])
        assert own.client().zcard(f"settle:ledger:target:{TARGET}") == CAPACITY
        assert await two.try_acquire(TARGET, CAPACITY) is None


async def test_a_process_keeps_to_what_it_held_until_the_others_leases_from_before_can_have_ended(
    tmp_path: Path,
) -> None:
    # Given two processes on Redis, the first holding 3 of 4 slots, the second 1, and the
    # longest request the second has seen end on the target lasting about 0.4 s
    async with two_processes(tmp_path, "uneven") as (own, one, two):
        seen = await two.try_acquire(TARGET, CAPACITY)
        assert seen is not None
        await asyncio.sleep(0.4)
        await two.release(seen)
        held = [await ledger.try_acquire(TARGET, CAPACITY) for ledger in (one, one, one, two)]
        assert all(held)

        # When Redis dies and both notice
        own.kill()
        await one.refresh([TARGET])
        await two.refresh([TARGET])
        assert one.status().outage_since and two.status().outage_since

        # Then neither takes a slot more: the first holds more than its share (2), and the
        # second keeps to the 1 it held while the first's 3 may still run (2 would make 5)
        assert await one.try_acquire(TARGET, CAPACITY) is None
        assert await two.try_acquire(TARGET, CAPACITY) is None
        # and once those could have ended, the second takes its share
        await asyncio.sleep(0.45)
        assert await two.try_acquire(TARGET, CAPACITY) is not None
        assert await two.try_acquire(TARGET, CAPACITY) is None
