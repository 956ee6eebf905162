"""The gateways' live state reaches every process: a dry run from elsewhere sees what they see.

A live daphne gateway serves streams and ejects a dead target; this test process, which runs no
gateway, asks `pools.services.dry_run` and gets the gateway's in-flight counts (through the
published readings with the in-memory ledger, through the Redis ledger with the shared one)
and the open circuit with its cause and time to its trial.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings

from nexus.models import ApiToken
from pools import live, services
from pools.balancer.health import CircuitReport
from pools.balancer.snapshot import DrainState
from pools.balancer.strategies import load_of
from pools.gateway import publish
from pools.gateway.publish import GatewayReadings, TargetReading, decode, encode
from pools.gateway.snapshot import TargetEntry
from pools.models import Pool
from tests.nexus.factories import make_pool, make_target
from tests.support.live import running_nexus
from tests.support.ports import free_port
from tests.support.simulator import running_simulator
from tests.support.traffic import chat_body, send
from tests.support.waiting import wait_until

CONVERSATION = {"X-Nexus-Session-Id": "conversation-1"}
CIRCUIT_DETAIL = re.compile(r"circuit open: 3 consecutive failures; half-open trial in \d+\.\d s")


@pytest.fixture
def prefix(settings: Any) -> Iterator[str]:
    """A Redis key prefix of this test's own, for the gateway and this process alike."""
    prefix = f"test-live-{uuid.uuid4().hex[:12]}"
    settings.NEXUS_REDIS_PREFIX = prefix
    yield prefix
    client = redis.Redis.from_url(settings.REDIS_URL)
    keys = list(client.scan_iter(f"{prefix}:*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.mark.parametrize("ledger", ["memory", "redis"])
def test_a_dry_run_from_another_process_sees_the_gateways_streams_and_open_circuit(
    committed_db, django_db_blocker, tmp_path: Path, prefix: str, ledger: str
) -> None:
    # Given a pool whose tier-1 target refuses connections and whose tier-2 target takes two
    # streams, served by a live gateway (another process) with the in-memory or Redis ledger,
    with running_simulator(model="demo-8b", ttft_ms=0, tpot_ms=100, concurrency=8) as engine:
        with django_db_blocker.unblock():
            # Ejection uncapped: the dead target's circuit stays open (docs/reliability.md).
            pool = make_pool("live-tour", strategy="priority", max_ejection_percent=100)
            dead = make_target(
                pool, "dead", base_url=f"http://127.0.0.1:{free_port()}/v1", model_id="demo-8b"
            )
            busy = make_target(
                pool, "busy", base_url=engine.base_url, model_id="demo-8b",
                capacity_weight=2, priority=2,
            )  # fmt: skip
            token_row, token = ApiToken.issue("live state")
        try:
            with running_nexus(tmp_path, NEXUS_LEDGER=ledger, NEXUS_REDIS_PREFIX=prefix) as nexus:
                url = f"{nexus.url}/v1/chat/completions"
                # when three requests of a conversation fail on the dead target (each answered
                # by the busy one)
                for _ in range(3):
                    answer = send(url, token, chat_body("live-tour"), headers=CONVERSATION)
                    assert (answer.status, answer.target) == (200, "busy")
                # and two long streams fill the busy one,
                with ThreadPoolExecutor(max_workers=2) as executor:
                    started = [threading.Event(), threading.Event()]
                    streams = [
                        executor.submit(
                            send,
                            url,
                            token,
                            chat_body("live-tour", max_tokens=40, stream=True),
                            started=event,
                        )  # fmt: skip
                        for event in started
                    ]
                    wait_until(lambda: all(event.is_set() for event in started), timeout_s=5)

                    # then this process's dry run, once the gateway published, sees both.
                    def settled() -> dict[str, Any] | None:
                        with django_db_blocker.unblock():
                            ranking = services.dry_run(
                                Pool.objects.get(pk=pool.pk),
                                kind="chat",
                                headers={"x-nexus-session-id": "conversation-1"},
                                body={},
                            )
                        reasons = {skip["name"]: skip["reason"] for skip in ranking["skipped"]}
                        full = reasons == {"dead": "circuit open", "busy": "full"}
                        return ranking if full else None

                    ranking = wait_until(settled, timeout_s=3, what="the dry run never settled")
                    answers = [stream.result() for stream in streams]
        finally:
            with django_db_blocker.unblock():
                Pool.objects.filter(pk=pool.pk).delete()
                token_row.delete()

    assert [(answer.status, answer.target, answer.done) for answer in answers] == [
        (200, "busy", True)
    ] * 2
    assert (ranking["live"], ranking["gateways"]) == (True, 1)
    # The gateway process said where the conversation went.
    assert ranking["request"]["sticky_target_id"] == busy.pk
    assert (ranking["target_id"], ranking["all_full"], ranking["ranking"]) == (None, True, [])
    skipped = {skip["name"]: skip for skip in ranking["skipped"]}
    assert skipped["busy"]["detail"] == "2 of 2 in flight"
    assert skipped["dead"]["target_id"] == dead.pk
    assert CIRCUIT_DETAIL.fullmatch(skipped["dead"]["detail"]), skipped["dead"]["detail"]


def test_without_a_gateway_the_dry_run_shows_the_configuration_at_rest(
    db: None, prefix: str
) -> None:
    pool = make_pool("quiet", strategy="least_busy")
    make_target(pool, "a", capacity_weight=4)

    ranking = services.dry_run(pool, kind="chat", headers={}, body={})

    assert (ranking["live"], ranking["gateways"]) == (False, 0)
    assert [(entry["name"], entry["score"]) for entry in ranking["ranking"]] == [("a", 0.0)]


def reading(process: str, published_at: float, **targets: TargetReading) -> GatewayReadings:
    return GatewayReadings(
        process=process,
        published_at=published_at,
        shared_ledger=False,
        targets={int(target_id[1:]): found for target_id, found in targets.items()},
        queued={7: 1},
        turns={7: int(published_at)},
    )


def test_a_reading_survives_its_encoding() -> None:
    published = reading(
        "host:1:ab",
        100.0,
        t1=TargetReading(
            in_flight=2,
            circuit=CircuitReport(cause="3 consecutive failures", trial_in_s=4.5),
            ttft_s=0.25,
            tpot_s=0.01,
            error_rate=0.5,
            last_served_at=99.0,
            engine_running=3,
            engine_waiting=1,
            engine_read_at=99.5,
            engine_counted=2,
        ),
        t2=TargetReading(in_flight=0, circuit=CircuitReport(probe_failing=True)),
    )

    assert decode(encode(published)) == published
    assert len(encode(published)) < 210  # two targets, every field set on one


def test_readings_of_several_processes_merge_into_one_view() -> None:
    # Given two processes' readings of target 1, published one and three seconds ago,
    now = 1000.0
    older = reading(
        "a",
        now - 3,
        t1=TargetReading(
            in_flight=2,
            circuit=CircuitReport(cause="3 consecutive failures", trial_in_s=2.5),
            ttft_s=0.2,
            error_rate=0.1,
            last_served_at=now - 10,
            engine_running=5,
            engine_waiting=0,
            engine_read_at=now - 3.5,
        ),
    )
    newer = reading(
        "b",
        now - 1,
        t1=TargetReading(
            in_flight=1,
            circuit=CircuitReport(cause="the half-open trial failed", trial_in_s=5.0),
            ttft_s=0.4,
            error_rate=0.3,
            last_served_at=now - 2,
            engine_running=6,
            engine_waiting=2,
            engine_read_at=now - 1.2,
            engine_counted=4,
        ),
    )

    # when they are merged with their own counts, and with the shared ledger's,
    merged = live.merge([older, newer], now, [1, 2])
    shared = live.merge([older, newer], now, [1], shared_counts={1: 7})

    # then counts add up (or are the ledger's), the circuit still open is the later one, aged,
    # latency is averaged, the error rate the worst, the last service and engine the newest.
    assert merged.targets[1] == TargetReading(
        in_flight=3,
        circuit=CircuitReport(cause="the half-open trial failed", trial_in_s=4.0),
        ttft_s=pytest.approx(0.3),
        error_rate=0.3,
        last_served_at=now - 2,
        engine_running=6,
        engine_waiting=2,
        engine_read_at=now - 1.2,
    )
    assert merged.targets[2] == TargetReading(in_flight=0)
    assert shared.targets[1].in_flight == 7
    # What a process counted at its engine reading compares with the shared ledger's count, or
    # with its own when it alone published the target; beside other processes' own counts it
    # would count their requests twice.
    assert shared.targets[1].engine_counted == 4
    assert live.merge([newer], now, [1]).targets[1].engine_counted == 4
    assert merged.targets[1].engine_counted is None
    assert (merged.gateways, merged.queued, merged.turns) == (2, {7: 2}, {7: int(now - 1)})


def test_a_dry_run_counts_a_reading_as_the_gateway_does_so_an_idle_target_looks_idle() -> None:
    # Given a gateway that read its engine (4 running) while it had those 4 requests in flight,
    # and has none left now (the reading is fresh: 1 s old),
    now = 1000.0
    published = reading(
        "a",
        now - 0.5,
        t1=TargetReading(
            in_flight=0,
            engine_running=4,
            engine_waiting=0,
            engine_read_at=now - 1,
            engine_counted=4,
        ),
    )
    state = live.merge([published], now, [1])
    target = TargetEntry(
        id=1,
        name="t1",
        base_url="http://127.0.0.1:9/v1",
        model_id="m",
        kinds=frozenset({"chat"}),
        authorization=None,
        urls={},
        priority=1,
        capacity=4,
        position=0,
        enabled=True,
        drain=DrainState.ACTIVE,
    )

    # when the dry run builds the target's view and the balancer weighs it,
    view = state.view(target)

    # then, as in the gateway, the engine's four were Nexus's own: nothing is left of them.
    assert (view.engine_counted, load_of(view)) == (4, 0)
    # Unknown (an older gateway's reading), the engine's count would stand: max(0, 4).
    assert load_of(replace(view, engine_counted=None)) == 4


def test_a_cooldown_that_ended_since_its_reading_lets_requests_through() -> None:
    now = 1000.0
    old = reading(
        "a",
        now - 3,
        t1=TargetReading(in_flight=0, circuit=CircuitReport(cause="x", trial_in_s=2.0)),
    )

    assert live.merge([old], now, [1]).targets[1].circuit is None


def test_a_gateway_reading_expires_with_its_process(prefix: str) -> None:
    # Given a reading published with a one-second TTL, as a process that then died would leave,
    client = redis.Redis.from_url(settings.REDIS_URL)
    process = "gone:1:00"
    client.set(publish.reading_key(prefix, process), encode(reading(process, time.time())), px=1000)
    client.zadd(publish.index_key(prefix), {process: time.time() + 1})
    client.close()

    # when it is read at once and after its TTL,
    seen = [reading.process for reading in live.gateway_readings()]
    time.sleep(1.2)
    later = live.gateway_readings()

    # then only the first read counts the process.
    assert (seen, later) == ([process], [])


def test_a_dry_run_asks_no_gateway_when_the_sample_has_no_conversation(prefix: str) -> None:
    assert live.ask_affinity(["anyone:1:00"], None, None) == (None, None)


def test_a_gateway_that_does_not_answer_holds_the_dry_run_half_a_second_at_most(
    prefix: str,
) -> None:
    began = time.monotonic()

    answer = live.ask_affinity(["silent:1:00"], "conversation-key", None)

    assert answer == (None, None)
    assert live.ASK_TIMEOUT_S <= time.monotonic() - began < live.ASK_TIMEOUT_S + 0.5


async def test_a_redis_outage_is_logged_once_and_publishing_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a publisher whose Redis does not answer,
    publisher = publish.Publisher(
        f"redis://127.0.0.1:{free_port()}/0", "test-outage", interval_s=0.2
    )
    reads: list[str] = []

    def read(process: str) -> GatewayReadings:
        reads.append(process)
        return reading(process, time.time())

    # when it tries for a second,
    with caplog.at_level(logging.INFO, logger="pools.gateway.publish"):
        publisher.start(read, lambda session, prefix: (None, None))
        await asyncio.sleep(1.0)
        await publisher.aclose()

    # then it kept reading and trying, and said so once.
    assert len(reads) >= 3
    assert [record.getMessage() for record in caplog.records] == [
        "gateway live state not published (Redis unreachable)"
    ]
