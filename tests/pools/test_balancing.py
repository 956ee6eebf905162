"""The balancer in a live gateway: retries by phase, drain, continuity, ejection, queue, tiers.

Every test sends real requests through a live daphne Nexus to simulator engines whose faults are
switched on at run time, then checks what the client saw (status, X-Nexus-Target,
X-Nexus-Attempts) and the routing history row the gateway wrote for the request.

The gateway runs with a 2 s upstream read timeout, so that a hanging engine times out quickly,
and with the ledger an operator of this setup would get: in memory beside the bundled Redis
(one embedded process), shared through Redis when REDIS_URL is set.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager as ContextManager
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
import redis
from django.conf import settings

from nexus.models import ApiToken
from pools import services
from pools.models import Pool, RoutingRecord, Target, TargetState
from tests.nexus.factories import make_pool, make_target
from tests.support import traffic
from tests.support.http import LOOPBACK
from tests.support.live import LiveServer, running_nexus
from tests.support.ports import free_port
from tests.support.prometheus import samples
from tests.support.simulator import Simulator, running_simulators
from tests.support.traffic import Answer, chat_body, send
from tests.support.waiting import wait_until

# The gateway's upstream read timeout in this module (the default is 600 s).
READ_TIMEOUT_S = 2
# HealthPolicy.base_cooldown_s: how long a first ejection lasts.
COOLDOWN_S = 5.0
# A configuration change reaches the gateway within its 1 s snapshot poll; with a margin.
SNAPSHOT_DELAY_S = 1.5
# The gateway reads each engine's /metrics once a second (plus its 0.25 s maintenance tick).
SCRAPE_DELAY_S = 1.5
SESSION = "X-Nexus-Session-Id"
QUEUE_TIMEOUT = "X-Nexus-Queue-Timeout"

# Engines: fast ones for retries, slow-ish ones (tpot 20 ms) for drain and continuity, and a
# slow one (tpot 40 ms) that queue and tier tests keep busy with streams of known length.
ENGINES: dict[str, dict[str, Any]] = {
    "good": {"ttft_ms": 0, "tpot_ms": 1},
    "faulty": {"ttft_ms": 0, "tpot_ms": 1},
    "drain_a": {"ttft_ms": 0, "tpot_ms": 20},
    "drain_b": {"ttft_ms": 0, "tpot_ms": 20},
    "c1": {"ttft_ms": 0, "tpot_ms": 20},
    "c2": {"ttft_ms": 0, "tpot_ms": 20},
    "c3": {"ttft_ms": 0, "tpot_ms": 20},
    "idle_a": {"ttft_ms": 0, "tpot_ms": 20},
    "idle_b": {"ttft_ms": 0, "tpot_ms": 20},
    "wake_a": {"ttft_ms": 0, "tpot_ms": 20},
    "wake_b": {"ttft_ms": 0, "tpot_ms": 20},
    # Bounded wait for a full sticky target: a quick engine and one six times slower.
    "quick": {"ttft_ms": 0, "tpot_ms": 5},
    "sluggish": {"ttft_ms": 0, "tpot_ms": 30},
    "slow": {"ttft_ms": 0, "tpot_ms": 40},
    "locked": {"ttft_ms": 0, "tpot_ms": 1, "api_key": "sk-engine"},
}


@dataclass(repr=False)
class World:
    """A live Nexus, its engines, two client tokens and the ids of every target by pool."""

    nexus: LiveServer
    engines: dict[str, Simulator]
    token: str  # client A
    other_token: str  # client B
    target_ids: dict[tuple[str, str], int]
    blocker: Any  # pytest-django's django_db_blocker

    @property
    def chat_url(self) -> str:
        return f"{self.nexus.url}/v1/chat/completions"

    def chat(
        self,
        pool: str,
        *,
        token: str | None = None,
        headers: dict[str, str] | None = None,
        started: threading.Event | None = None,
        **body: Any,
    ) -> Answer:
        """Send a chat request to the pool through the gateway and read the whole answer."""
        return send(
            self.chat_url,
            token or self.token,
            chat_body(pool, **body),
            headers=headers,
            started=started,
        )

    def target_id(self, pool: str, name: str) -> int:
        return self.target_ids[(pool, name)]

    def target(self, pool: str, name: str) -> Target:
        with self.blocker.unblock():
            return Target.objects.get(pk=self.target_id(pool, name))

    def record(self, answer: Answer | str) -> RoutingRecord:
        """Return the request's history row, waiting for the gateway's next batched write."""
        request_id = answer if isinstance(answer, str) else answer.request_id

        def find() -> RoutingRecord | None:
            with self.blocker.unblock():
                return RoutingRecord.objects.filter(request_id=request_id).first()

        return wait_until(find, timeout_s=5, what=f"no history row for {request_id}")

    def attempt(
        self, pool: str, name: str, phase: str, status: int | None, retried: bool, reason: str
    ) -> dict[str, Any]:
        """Return an attempt as the history stores it."""
        return {
            "target_id": self.target_id(pool, name),
            "target_name": name,
            "phase": phase,
            "status": status,
            "retried": retried,
            "reason": reason,
        }


def _build_pools(engines: dict[str, Simulator]) -> dict[tuple[str, str], int]:
    """Create every pool the tests use; return the target ids by (pool slug, target name)."""
    ids: dict[tuple[str, str], int] = {}
    closed_port_url = f"http://127.0.0.1:{free_port()}/v1"

    def pool(slug: str, targets: list[tuple[str, str, dict[str, Any]]], **fields: Any) -> None:
        created = make_pool(slug, **fields)
        for position, (name, engine, extra) in enumerate(targets):
            url = closed_port_url if engine == "closed" else engines[engine].base_url
            fields = {"model_id": "demo-8b", "position": position, **extra}
            target = make_target(created, name, base_url=url, **fields)
            ids[(slug, name)] = target.pk

    backup = {"priority": 2}
    # Retries: the faulty target is alone in tier 1, so every request tries it first.
    pool("connect-retry", [("unreachable", "closed", {}), ("good", "good", backup)])
    pool("refused-retry", [("refusing", "faulty", {}), ("good", "good", backup)])
    pool("timeout", [("hanging", "faulty", {}), ("good", "good", backup)])
    pool("cut", [("cutting", "faulty", {}), ("good", "good", backup)])
    pool("bad-request", [("first", "good", {}), ("second", "good", backup)])
    pool("exhausted", [("busy-1", "faulty", {}), ("busy-2", "faulty", backup)])
    pool("exhausted-history", [("busy-1", "faulty", {}), ("busy-2", "faulty", backup)])
    # Ejection uncapped, so that the lone target's circuit really opens.
    pool("refused-alone", [("refusing", "faulty", {})], max_attempts=1, max_ejection_percent=100)
    pool("ejection", [("failing", "faulty", {}), ("good", "good", backup)])
    # Misconfigured targets: a model id the engine does not serve, a credential it rejects.
    misnamed = {"model_id": "not-served"}
    pool("wrong-model", [("misnamed", "good", misnamed), ("good", "good", backup)])
    pool(
        "wrong-key", [("rejecting", "locked", {"credential": "sk-wrong"}), ("good", "good", backup)]
    )
    pool("right-key", [("accepting", "locked", {"credential": "sk-engine"})])
    pool("misnamed-alone", [("misnamed", "good", misnamed)], max_ejection_percent=100)
    # Drain: round robin, so that both targets get traffic while both are active.
    for slug in ("drain", "resume"):
        pool(
            slug,
            [("a", "drain_a", {"capacity_weight": 8}), ("b", "drain_b", {"capacity_weight": 8})],
            strategy="round_robin",
        )
    # Continuity: Smart pools over three engines of their own.
    for slug in ("sticky", "sticky-busy", "sticky-drain", "sticky-keys"):
        pool(slug, [(name, name, {"capacity_weight": 4}) for name in ("c1", "c2", "c3")])
    # Two identical capacity-2 targets, for conversations sent one request at a time.
    pool("sticky-idle", [(name, name, {"capacity_weight": 2}) for name in ("idle_a", "idle_b")])
    # Affinity-aware wake-up: two one-slot targets, so that both are soon full.
    pool(
        "wake-affinity",
        [(name, name, {"capacity_weight": 1}) for name in ("wake_a", "wake_b")],
        max_queue=10,
    )
    # Bounded wait for a full sticky target: one slot on each of two engines of unequal speed.
    for slug in ("sticky-wait-short", "sticky-wait-long", "sticky-wait-bound", "sticky-wait-woken"):
        pool(slug, [(name, name, {"capacity_weight": 1}) for name in ("quick", "sluggish")])
    # Queue: one slot on the slow engine.
    for slug in ("queue-full", "queue-timeout", "queue-gone", "queue-gone-wait", "queue-estimate"):
        pool(slug, [("only", "slow", {"capacity_weight": 1})], max_queue=2)
    pool("queue-fair", [("only", "slow", {"capacity_weight": 1})], max_queue=20)
    pool("queue-share", [("only", "slow", {"capacity_weight": 1})], max_queue=4)
    pool("queue-pushed", [("only", "slow", {"capacity_weight": 1})], max_queue=4)
    # One slot for chat, and an idle one for embeddings only.
    for slug in ("queue-kinds", "queue-kinds-order"):
        pool(
            slug,
            [
                ("chat", "slow", {"capacity_weight": 1, "kinds": ["chat"]}),
                ("embed", "good", {"capacity_weight": 1, "kinds": ["embeddings"]}),
            ],
            max_queue=10,
        )
    # Tiers: a small primary on the slow engine, a backup behind it.
    pool(
        "tiers",
        [
            ("primary", "slow", {"capacity_weight": 2}),
            ("backup", "good", {"capacity_weight": 4, **backup}),
        ],
    )
    pool("metered", [("meter", "good", {})])
    return ids


@pytest.fixture(scope="module")
def world(committed_db, django_db_blocker, tmp_path_factory) -> Iterator[World]:
    prefix = f"test-balancing-{uuid.uuid4().hex[:12]}"
    with running_simulators(**{name: dict(flags) for name, flags in ENGINES.items()}) as engines:
        with django_db_blocker.unblock():
            target_ids = _build_pools(engines)
            slugs = sorted({slug for slug, _ in target_ids})
            token_a, token = ApiToken.issue("client a")
            token_b, other_token = ApiToken.issue("client b")
        try:
            with running_nexus(
                tmp_path_factory.mktemp("balancing"),
                NEXUS_UPSTREAM_READ_TIMEOUT_S=str(READ_TIMEOUT_S),
                NEXUS_LEDGER="memory" if settings.NEXUS_BUNDLED_REDIS else "redis",
                NEXUS_REDIS_PREFIX=prefix,
                NEXUS_METRICS_PUBLIC="true",
            ) as nexus:
                yield World(nexus, engines, token, other_token, target_ids, django_db_blocker)
        finally:
            with django_db_blocker.unblock():
                Pool.objects.filter(slug__in=slugs).delete()
                ApiToken.objects.filter(pk__in=[token_a.pk, token_b.pk]).delete()
            client = redis.Redis.from_url(settings.REDIS_URL)
            keys = list(client.scan_iter(f"{prefix}:*"))
            if keys:
                client.delete(*keys)
            client.close()


@contextmanager
def faults(engine: Simulator, **settings_: Any) -> Iterator[None]:
    """Switch faults on for the block, and every fault off after it."""
    engine.set_faults(**settings_)
    try:
        yield
    finally:
        engine.clear_faults()


def hold_slot(
    executor: ThreadPoolExecutor, world: World, pool: str, *, tokens: int, token: str | None = None
) -> Future[Answer]:
    """Start a stream of `tokens` tokens in the background; return once it holds a slot."""
    started = threading.Event()
    future = executor.submit(
        world.chat, pool, max_tokens=tokens, stream=True, started=started, token=token
    )
    wait_until(lambda: started.is_set() or future.done(), timeout_s=5)
    assert started.is_set(), future.result()
    return future


@contextmanager
def holding_slot(world: World, pool: str, **holder: Any) -> Iterator[str | None]:
    with traffic.holding_slot(world.nexus.port, world.token, pool, **holder) as target:
        yield target


def raw_request(world: World, body: dict[str, Any]) -> ContextManager[socket.socket]:
    return traffic.raw_request(world.nexus.port, world.token, body)


def metric(world: World, name: str, **labels: str) -> float:
    """Return the value of one sample at the live server's /metrics (0 while it has none)."""
    response = LOOPBACK.get(f"{world.nexus.url}/metrics", timeout=5)
    assert response.status_code == 200
    return samples(response.text).get((name, frozenset(labels.items())), 0.0)


def queued(world: World, pool: str) -> float:
    """Return how many requests wait in the pool's queue (the gateway sets the gauge as each
    request joins or leaves)."""
    return metric(world, "nexus_queued", pool=pool)


def join_queue(
    executor: ThreadPoolExecutor,
    world: World,
    pool: str,
    send: Callable[[], Answer] | None = None,
    **chat: Any,
) -> Future[Answer]:
    """Send a chat request that must wait (`send`, else one of `chat`'s); return once the queue
    holds it (one more than before), so that requests sent one after another queue in that
    order on any machine."""
    before = queued(world, pool)
    future = executor.submit(send or (lambda: world.chat(pool, **chat)))
    wait_until(
        lambda: queued(world, pool) > before or future.done(),
        timeout_s=10,
        what=f"the request did not join {pool}'s queue",
    )
    assert not future.done(), future.result()
    return future


def served_order(world: World, answers: list[tuple[str, Answer]]) -> list[str]:
    """Return the labels of the answers in the order they got their slot, by the gateway's own
    clock (arrival plus queue wait): the time a client saw its answer end also holds its
    thread's turn for the CPU, which on a busy machine reorders answers 160 ms apart."""

    def slot_at(answer: Answer) -> datetime:
        record = world.record(answer)
        return record.created_at + timedelta(milliseconds=record.queue_wait_ms)

    return [label for label, answer in sorted(answers, key=lambda pair: slot_at(pair[1]))]


def contents(answer: Answer) -> list[str]:
    """Return the non-empty content deltas of a chat stream."""
    deltas = []
    for event in answer.events:
        if event == "[DONE]":
            continue
        for choice in json.loads(event).get("choices", []):
            if content := choice.get("delta", {}).get("content"):
                deltas.append(content)
    return deltas


# --- Retries by phase ---------------------------------------------------------------------------


def test_a_connect_failure_moves_the_request_to_the_other_target(world: World) -> None:
    answer = world.chat("connect-retry")

    record = world.record(answer)
    assert (answer.status, answer.target, answer.attempts) == (200, "good", 2)
    assert record.outcome == "ok"
    assert record.attempts == [
        world.attempt(
            "connect-retry", "unreachable", "connect", None, True,
            "retried: not delivered (connection refused), outside the retry budget",
        ),
        world.attempt("connect-retry", "good", "ok", 200, False, "ok"),
    ]  # fmt: skip


def test_the_history_of_a_retried_request_keeps_the_decision_of_each_attempt(
    world: World,
) -> None:
    answer = world.chat("connect-retry")

    record = world.record(answer)
    first, second = record.decision["per_attempt"]
    unreachable = world.target_id("connect-retry", "unreachable")
    good = world.target_id("connect-retry", "good")
    assert record.attempt_count == 2
    assert first["target_id"] == record.attempts[0]["target_id"]
    # Tier 1 holds the unreachable target alone; the retry's ranking is tier 2's.
    assert [ranked["target_id"] for ranked in first["ranking"]] == [unreachable]
    assert first["ranking"][0]["factors"]
    assert second["target_id"] == good
    assert [(skip["target_id"], skip["reason"]) for skip in second["skipped"]] == [
        (unreachable, "already tried")
    ]


@pytest.mark.parametrize("status", [429, 503])
def test_a_refusal_before_output_moves_the_request_to_the_other_target(
    world: World, status: int
) -> None:
    with faults(world.engines["faulty"], error_rate=1.0, error_codes=[status]):
        answer = world.chat("refused-retry")

    record = world.record(answer)
    assert (answer.status, answer.target, answer.attempts) == (200, "good", 2)
    assert answer.json()["choices"][0]["message"]["content"]
    assert record.attempts == [
        world.attempt(
            "refused-retry", "refusing", "refused_status", status, True,
            f"retried: {status} before output",
        ),
        world.attempt("refused-retry", "good", "ok", 200, False, "ok"),
    ]  # fmt: skip


def test_a_timeout_after_the_request_was_sent_is_not_retried(world: World) -> None:
    good_before = world.engines["good"].stats()["requests_total"]
    with faults(world.engines["faulty"], hang=True):
        answer = world.chat("timeout")

    record = world.record(answer)
    assert answer.status == 504
    assert answer.error() == {
        "message": "Target 'hanging' did not answer in time.",
        "type": "server_error",
        "param": None,
        "code": "target_timeout",
    }
    # It waited for the read timeout once, and no other target saw the request.
    assert READ_TIMEOUT_S <= answer.elapsed_s < READ_TIMEOUT_S + 1.5
    assert world.engines["good"].stats()["requests_total"] == good_before
    assert (record.outcome, record.target_name, record.status_code) == (
        "upstream_error", "hanging", 504,
    )  # fmt: skip
    assert record.attempts == [
        world.attempt(
            "timeout", "hanging", "ambiguous_timeout", None, False,
            "not retried: timeout after the request was sent is ambiguous",
        )
    ]  # fmt: skip


def test_a_stream_cut_after_output_started_ends_with_an_error_event_and_is_not_retried(
    world: World,
) -> None:
    good_before = world.engines["good"].stats()["requests_total"]
    with faults(world.engines["faulty"], cut_stream_after=3):
        answer = world.chat("cut", max_tokens=20, stream=True)

    record = world.record(answer)
    assert (answer.status, answer.target, answer.attempts) == (200, "cutting", 1)
    assert len(contents(answer)) == 3
    assert "[DONE]" not in answer.events
    assert json.loads(answer.events[-1])["error"]["code"] == "stream_interrupted"
    assert world.engines["good"].stats()["requests_total"] == good_before
    assert record.outcome == "interrupted"
    assert record.attempts == [
        world.attempt(
            "cut", "cutting", "after_output", 200, False, "not retried: failed after output started"
        )
    ]


def test_a_stream_whose_connection_closes_after_its_done_is_whole_not_broken(
    world: World,
) -> None:
    # As llama-cpp-python's server: the whole answer and [DONE], then no end to the body.
    with faults(world.engines["faulty"], cut_stream_after=5):
        answer = world.chat("cut", max_tokens=5, stream=True)

    record = world.record(answer)
    assert (answer.status, answer.target) == (200, "cutting")
    assert len(contents(answer)) == 5
    assert answer.events[-1] == "[DONE]"
    assert record.outcome == "ok"
    assert record.attempts == [world.attempt("cut", "cutting", "ok", 200, False, "ok")]


def test_a_client_error_from_the_engine_is_relayed_as_is_and_not_retried(world: World) -> None:
    # More output than the engine's context (--max-model-len 32768) allows: its own 400.
    body = chat_body("bad-request", max_tokens=100_000)
    direct = LOOPBACK.post(
        f"{world.engines['good'].base_url}/chat/completions",
        json={**body, "model": "demo-8b"},
        timeout=5,
    )

    answer = send(world.chat_url, world.token, body)

    record = world.record(answer)
    assert (answer.status, answer.target, answer.attempts) == (400, "first", 1)
    assert answer.json() == direct.json()
    assert answer.error()["code"] == "context_length_exceeded"
    assert (record.outcome, record.status_code) == ("client_error", 400)
    assert record.attempts == [
        world.attempt(
            "bad-request", "first", "client_error", 400, False,
            "not retried: 4xx caused by the request",
        )
    ]  # fmt: skip


def test_when_every_target_refuses_the_client_gets_the_last_503_in_the_openai_shape(
    world: World,
) -> None:
    with faults(world.engines["faulty"], error_rate=1.0, error_codes=[503]):
        answer = world.chat("exhausted")

    record = world.record(answer)
    assert (answer.status, answer.target, answer.attempts) == (503, "busy-2", 2)
    assert set(answer.error()) == {"message", "type", "param", "code"}
    assert answer.error()["code"] == "service_unavailable"  # the engine's own answer
    assert (record.outcome, record.target_name, record.status_code) == (
        "upstream_error", "busy-2", 503,
    )  # fmt: skip


def test_when_every_target_refuses_the_history_lists_each_attempt_once(world: World) -> None:
    with faults(world.engines["faulty"], error_rate=1.0, error_codes=[503]):
        answer = world.chat("exhausted-history")

    record = world.record(answer)
    assert record.attempts == [
        world.attempt(
            "exhausted-history", "busy-1", "refused_status", 503, True,
            "retried: 503 before output",
        ),
        world.attempt(
            "exhausted-history", "busy-2", "refused_status", 503, False,
            "not retried: attempts exhausted (2 of 2)",
        ),
    ]  # fmt: skip


def test_a_target_that_refuses_is_ejected_after_its_third_failed_request_not_its_second(
    world: World,
) -> None:
    with faults(world.engines["faulty"], error_rate=1.0, error_codes=[503]):
        answers = [world.chat("refused-alone") for _ in range(4)]

    # Three consecutive failures eject a target: the first three requests all reach it, the
    # fourth finds its circuit open.
    assert [(answer.status, answer.target) for answer in answers[:3]] == [(503, "refusing")] * 3
    assert (answers[3].status, answers[3].target) == (503, None)
    assert answers[3].error() == {
        "message": "Pool 'refused-alone' has no target that can take this chat request now:"
        " refusing (circuit open).",
        "type": "server_error",
        "param": None,
        "code": "no_target_available",
    }


# --- Misconfigured targets ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pool", "target", "status", "what"),
    [
        (
            "wrong-model",
            "misnamed",
            404,
            "404: the target does not serve the model id it was given",
        ),
        ("wrong-key", "rejecting", 401, "401: the target rejects its credential"),
    ],
)
def test_a_misconfigured_target_is_the_targets_fault_and_the_request_is_served_by_another(
    world: World, pool: str, target: str, status: int, what: str
) -> None:
    answer = world.chat(pool)

    assert (answer.status, answer.target, answer.attempts) == (200, "good", 2), answer.content
    assert world.record(answer).attempts == [
        world.attempt(pool, target, "misconfigured", status, True, f"retried: {what}"),
        world.attempt(pool, "good", "ok", 200, False, "ok"),
    ]


def test_the_right_credential_is_accepted_by_the_same_engine(world: World) -> None:
    answer = world.chat("right-key")

    assert (answer.status, answer.target) == (200, "accepting"), answer.content


def test_a_target_alone_with_a_wrong_model_id_answers_502_and_is_ejected_naming_why(
    world: World,
) -> None:
    answers = [world.chat("misnamed-alone") for _ in range(4)]

    what = "404: the target does not serve the model id it was given"
    # The caller, whose request is fine, never hears the target's own 404.
    assert [(a.status, a.error()["code"]) for a in answers[:3]] == [
        (502, "target_misconfigured")
    ] * 3
    assert answers[0].error()["message"] == (
        f"Target 'misnamed' is misconfigured ({what}), and no other target could take the request."
    )
    assert world.record(answers[0]).attempts == [
        world.attempt("misnamed-alone", "misnamed", "misconfigured", 404, True, f"retried: {what}")
        | {"retried": False, "reason": "not retried: no other target can take it"}
    ]
    # The third failure ejected it, and the cause says what it answered.
    assert (answers[3].status, answers[3].error()["code"]) == (503, "no_target_available")
    [skipped] = world.record(answers[3]).decision["skipped"]
    assert skipped["detail"].startswith(
        f"circuit open: 3 consecutive failures, the last: {what}; half-open trial in"
    )


# --- Ejection and recovery ----------------------------------------------------------------------


def test_a_failing_target_is_ejected_after_three_failures_and_readmitted_by_a_half_open_trial(
    world: World,
) -> None:
    with faults(world.engines["faulty"], error_rate=1.0, error_codes=[500]):
        failures = [world.chat("ejection") for _ in range(3)]
        ejected_at = time.monotonic()
        while_ejected = world.chat("ejection")
    # The fault is gone; the circuit stays open until its cooldown ends.
    time.sleep(max(0.0, ejected_at + COOLDOWN_S + 0.2 - time.monotonic()))
    trial = world.chat("ejection")
    after_trial = world.chat("ejection")

    assert [(answer.status, answer.target) for answer in failures] == [(500, "failing")] * 3
    assert (while_ejected.status, while_ejected.target) == (200, "good")
    [skipped] = world.record(while_ejected).decision["skipped"]
    assert {key: skipped[key] for key in ("target_id", "name", "reason")} == {
        "target_id": world.target_id("ejection", "failing"),
        "name": "failing",
        "reason": "circuit open",
    }
    assert skipped["detail"].startswith("circuit open: 3 consecutive failures; half-open trial in")
    assert (trial.status, trial.target) == (200, "failing")
    assert world.record(trial).decision["skipped"] == []
    assert (after_trial.status, after_trial.target) == (200, "failing")


# --- Drain --------------------------------------------------------------------------------------


def test_draining_a_target_under_load_fails_no_request_and_it_ends_drained(world: World) -> None:
    # Given 40 streams arriving every 80 ms (about 5 in flight), when target b is drained after
    # the 12th:
    futures: list[Future[Answer]] = []

    def submit(index: int, started: threading.Event | None = None) -> None:
        futures.append(
            executor.submit(
                world.chat,
                "drain",
                content=f"request {index}",
                max_tokens=15,
                stream=True,
                started=started,
            )
        )

    with ThreadPoolExecutor(max_workers=16) as executor:
        for index in range(40):
            if index == 12:
                # Two sent together and both streaming (300 ms each): round robin gave b one of
                # them, so b is serving as the drain begins. Drained after the 80 ms sleeps
                # alone, a run where this thread slept long found b's earlier streams all ended.
                both_started = [threading.Event(), threading.Event()]
                submit(12, both_started[0])
                submit(13, both_started[1])
                assert all(event.wait(timeout=10) for event in both_started)
                with world.blocker.unblock():
                    services.drain_target(Target.objects.get(pk=world.target_id("drain", "b")))
                drained_at = time.monotonic()
            elif index != 13:
                submit(index)
            time.sleep(0.08)
        answers = [future.result() for future in futures]
    drained = wait_until(
        lambda: (target := world.target("drain", "b")).state == TargetState.DRAINED and target,
        timeout_s=3,
        what="target b never became drained",
    )

    # Then no request failed,
    assert [(answer.status, answer.done) for answer in answers] == [(200, True)] * 40
    # b served before the drain, and was still serving when it began,
    assert "b" in {answer.target for answer in answers if answer.started < drained_at}
    assert any(
        answer.target == "b" and answer.started < drained_at < answer.finished for answer in answers
    )
    # no request that arrived once the drain took effect went to b,
    late = [answer for answer in answers if answer.started > drained_at + SNAPSHOT_DELAY_S]
    assert len(late) >= 5
    assert {answer.target for answer in late} == {"a"}
    # and b became drained only once its last request had finished.
    records = [world.record(answer) for answer in answers if answer.target == "b"]
    last_end = max(
        record.created_at + timedelta(milliseconds=record.total_ms) for record in records
    )
    assert drained.state_changed_at is not None
    assert drained.state_changed_at >= last_end - timedelta(milliseconds=50)


def test_a_drained_target_serves_again_once_resumed(world: World) -> None:
    with world.blocker.unblock():
        services.drain_target(Target.objects.get(pk=world.target_id("resume", "b")))
    wait_until(lambda: world.target("resume", "b").state == TargetState.DRAINED, timeout_s=4)
    while_drained = [world.chat("resume").target for _ in range(4)]

    with world.blocker.unblock():
        services.resume_target(Target.objects.get(pk=world.target_id("resume", "b")))
    back = wait_until(
        lambda: (answer := world.chat("resume")).target == "b" and answer,
        timeout_s=4,
        what="the resumed target got no request",
    )

    assert while_drained == ["a"] * 4
    assert back.status == 200
    assert world.target("resume", "b").state == TargetState.ACTIVE


# --- Continuity ---------------------------------------------------------------------------------


def turn(
    world: World, pool: str, number: int, *, headers: dict[str, str] | None = None, **extra: Any
) -> Answer:
    """Send turn `number` of one conversation (the earlier turns repeated, as chat apps do)."""
    messages = [{"role": "user", "content": "Plan three days in Lisbon"}]
    for earlier in range(1, number):
        messages += [
            {"role": "assistant", "content": f"Day {earlier}: the old town"},
            {"role": "user", "content": f"And after day {earlier}?"},
        ]
    body = {"model": f"@pool/{pool}", "messages": messages, "max_tokens": 2, **extra}
    return send(world.chat_url, world.token, body, headers=headers)


def test_a_conversation_with_a_session_id_stays_on_one_target(world: World) -> None:
    turns = [turn(world, "sticky", number, headers={SESSION: "s1"}) for number in range(1, 5)]

    first = turns[0].target
    assert first is not None
    records = [world.record(answer) for answer in turns]
    assert [answer.target for answer in turns] == [first] * 4
    assert [record.decision["continuity"] for record in records] == ["none"] + ["kept"] * 3
    sticky = world.target_id("sticky", first)
    assert [record.decision["request"]["sticky_target_id"] for record in records] == [
        None, sticky, sticky, sticky,
    ]  # fmt: skip


def test_conversations_sent_one_request_at_a_time_never_move_between_idle_targets(
    world: World,
) -> None:
    # Each turn streams for about 0.4 s, so the engines are read (once a second) while turns
    # run there; those readings, up to 2 s old, must not make an idle target look busy.
    moved = []
    for session in range(6):
        headers = {SESSION: f"s-idle-{session}-{uuid.uuid4().hex[:8]}"}
        answers = [
            turn(world, "sticky-idle", number, headers=headers, max_tokens=20)
            for number in range(1, 5)
        ]
        assert [answer.status for answer in answers] == [200] * 4
        if len({answer.target for answer in answers}) > 1:
            why = [world.record(answer).decision["continuity"] for answer in answers]
            moved.append((session, [answer.target for answer in answers], why))

    assert moved == []


def test_a_conversation_moves_when_its_target_drains_and_the_history_says_it_yielded(
    world: World,
) -> None:
    session = {SESSION: "s-drain"}
    first = turn(world, "sticky-drain", 1, headers=session)
    assert first.target is not None
    with world.blocker.unblock():
        services.drain_target(Target.objects.get(pk=world.target_id("sticky-drain", first.target)))

    # Turns keep coming; within about a second the drain reaches the gateway.
    number = 2
    deadline = time.monotonic() + 4
    while (moved := turn(world, "sticky-drain", number, headers=session)).target == first.target:
        assert time.monotonic() < deadline, "the conversation never left the draining target"
        number += 1
        time.sleep(0.1)
    following = turn(world, "sticky-drain", number + 1, headers=session)

    # Whether the gateway already knows the target as drained depends on its snapshot's age.
    assert world.record(moved).decision["continuity"] in {
        "yielded: sticky target draining",
        "yielded: sticky target drained",
    }
    assert following.target == moved.target
    assert world.record(following).decision["continuity"] == "kept"


def test_a_conversation_yields_when_its_target_is_much_busier_and_the_history_says_so(
    world: World,
) -> None:
    session = {SESSION: "s-busy"}
    first = turn(world, "sticky-busy", 1, headers=session)
    assert first.target is not None
    engine = world.engines[first.target]
    # Other clients of the same engine keep 3 of the target's 4 slots busy; the gateway learns
    # it from the engine's /metrics.
    stop = threading.Event()

    def other_client() -> None:
        body = {
            "model": "demo-8b",
            "messages": [{"role": "user", "content": "a long story"}],
            "max_tokens": 400,
            "stream": True,
        }
        with LOOPBACK.stream(
            "POST", f"{engine.base_url}/chat/completions", json=body, timeout=15
        ) as response:
            for _ in response.iter_lines():
                if stop.is_set():
                    return

    with ThreadPoolExecutor(max_workers=3) as executor:
        others = [executor.submit(other_client) for _ in range(3)]
        try:
            wait_until(lambda: engine.stats()["requests_running"] == 3, timeout_s=3)
            time.sleep(SCRAPE_DELAY_S)
            second = turn(world, "sticky-busy", 2, headers=session)
        finally:
            stop.set()
        for other in others:
            other.result()

    record = world.record(second)
    assert second.status == 200
    assert second.target != first.target
    assert re.fullmatch(
        rf"yielded: score -?\d+\.\d\d vs -?\d+\.\d\d on {second.target}, threshold 0\.25",
        record.decision["continuity"],
    ), record.decision["continuity"]
    ranked = {entry["name"]: entry for entry in record.decision["ranking"]}
    utilization = {f["name"]: f["value"] for f in ranked[first.target]["factors"]}["utilization"]
    assert utilization == 1.0  # (3 running + this request) / 4 slots


def test_a_slot_freed_on_a_conversations_target_goes_to_it_before_an_earlier_waiter(
    world: World,
) -> None:
    session = {SESSION: f"s-wake-{uuid.uuid4().hex[:8]}"}
    home = turn(world, "wake-affinity", 1, headers=session).target
    assert home is not None
    # Both one-slot targets are held until the test lets go, the conversation's own by a stream
    # of the same conversation: both waiters are in the queue before a slot frees on any
    # machine (with streams of fixed lengths, a loaded one saw the conversation queued late).
    with ThreadPoolExecutor(max_workers=2) as executor, ExitStack() as other_holder:
        with holding_slot(world, "wake-affinity", headers=session) as held_home:
            assert held_home == home
            other = other_holder.enter_context(
                holding_slot(world, "wake-affinity", content="Another client")
            )
            assert other not in (None, home)
            # The earlier waiter is first in line.
            earlier = join_queue(executor, world, "wake-affinity", content="Something else")
            later = join_queue(
                executor,
                world,
                "wake-affinity",
                send=lambda: turn(world, "wake-affinity", 2, headers=session),
            )
        # The conversation's target frees its slot; the other stays held.
        conversation = later.result()
        assert conversation.status == 200
        assert conversation.target == home
        first_in_line = earlier.result()  # the slot the conversation leaves

    decision = world.record(conversation).decision
    assert decision["woken_by"] == f"conversation on {home}, ahead of 1 earlier waiter"
    assert decision["continuity"] == "kept"
    assert first_in_line.target == home
    assert world.record(first_in_line).decision["woken_by"] == "fair order"


def conversation_on_the_quick_target(world: World, pool: str) -> dict[str, str]:
    """Teach the pool both engines' speeds, then start a conversation (on the quick one)."""
    with ThreadPoolExecutor(max_workers=2) as executor:
        # One 80-token stream on each target at once: speeds and slot times are measured. The
        # quick target's slot time (about 400 ms, 330 ms with turn 1 averaged in) sets each
        # wait's prediction and bound (1.5 ×): the streams that fill it below end well within.
        first = hold_slot(executor, world, pool, tokens=80)
        second = executor.submit(world.chat, pool, max_tokens=80, stream=True)
        assert {first.result().target, second.result().target} == {"quick", "sluggish"}
    session = {SESSION: f"s-{pool}-{uuid.uuid4().hex[:8]}"}
    assert turn(world, pool, 1, headers=session).target == "quick"
    return session


def second_turn_beside_a_holder(
    world: World, pool: str, session: dict[str, str], *, holder_tokens: int, max_tokens: int
) -> Answer:
    """Fill the quick target with another client's stream of `holder_tokens`, send the
    conversation's second turn meanwhile, and return its answer (the holder was on quick)."""
    with ThreadPoolExecutor(max_workers=2) as executor:
        holder = hold_slot(executor, world, pool, tokens=holder_tokens)
        second = turn(world, pool, 2, headers=session, max_tokens=max_tokens)
        assert holder.result().target == "quick"
    return second


# Timing: the quick target's slot must free within the wait's bound (about 1.5 × its slot time).
@pytest.mark.serial
def test_a_conversation_waits_for_its_full_target_when_that_is_shorter_than_moving(
    world: World,
) -> None:
    session = conversation_on_the_quick_target(world, "sticky-wait-short")
    # Another client's short stream (30 tokens, about 150 ms) fills the quick target: it ends
    # well within the wait's bound (about 1.5 × the quick target's 330 ms slot time). 20 tokens:
    # moving to the sluggish target costs about 20 × 25 ms more decoding.
    second = second_turn_beside_a_holder(
        world, "sticky-wait-short", session, holder_tokens=30, max_tokens=20
    )

    assert second.status == 200
    assert second.target == "quick"
    record = world.record(second)
    decision = record.decision
    assert re.fullmatch(
        r"waited \d+ ms for sticky target quick \(predicted \d+ ms < \d+ ms re-prefill and "
        r"decode loss on sluggish\)",
        decision["continuity"],
    ), decision["continuity"]
    assert decision["woken_by"] == "sticky target quick freed a slot"
    wait = decision["sticky_wait"]
    assert (wait["name"], wait["alternative"]) == ("quick", "sluggish")
    assert wait["predicted_ms"] < wait["loss_ms"]
    assert record.queue_wait_ms <= wait["bound_ms"] + 50  # woken, not timed out


@pytest.mark.serial
def test_a_conversation_moves_at_once_when_its_full_target_would_take_longer_than_moving(
    world: World,
) -> None:
    session = conversation_on_the_quick_target(world, "sticky-wait-long")
    # 2 tokens: moving costs about 50 ms, less than a slot of the quick target takes.
    second = second_turn_beside_a_holder(
        world, "sticky-wait-long", session, holder_tokens=40, max_tokens=2
    )

    assert second.target == "sluggish"
    record = world.record(second)
    assert record.decision["continuity"] == "yielded: sticky target full"
    assert "sticky_wait" not in record.decision
    assert record.queue_wait_ms < 50


@pytest.mark.serial
def test_a_conversation_that_waited_its_bound_in_vain_moves_and_the_history_says_so(
    world: World,
) -> None:
    session = conversation_on_the_quick_target(world, "sticky-wait-bound")
    # A 200-token stream (about 1 s) holds the quick target far beyond the wait's bound.
    second = second_turn_beside_a_holder(
        world, "sticky-wait-bound", session, holder_tokens=200, max_tokens=20
    )

    assert second.target == "sluggish"
    record = world.record(second)
    bound = record.decision["sticky_wait"]["bound_ms"]
    found = re.fullmatch(
        r"yielded: sticky target full after waiting (\d+) ms for it \(bound (\d+) ms\)",
        record.decision["continuity"],
    )
    assert found is not None, record.decision["continuity"]
    waited_ms, text_bound_ms = int(found[1]), int(found[2])
    # The text gives whole milliseconds, the history a tenth: 509.49 reads "509" beside 509.5.
    assert waited_ms >= text_bound_ms
    assert abs(text_bound_ms - bound) <= 0.5
    assert record.queue_wait_ms >= bound
    assert "woken_by" not in record.decision


# Timing: the sluggish target's slot frees first, the quick one's within the wait's bound after.
@pytest.mark.serial
def test_a_waiter_woken_for_another_target_hands_that_slot_on_and_waits_for_its_own(
    world: World,
) -> None:
    session = conversation_on_the_quick_target(world, "sticky-wait-woken")
    with ThreadPoolExecutor(max_workers=3) as executor:
        # Both targets full: the quick one for about 450 ms, the sluggish one for about 150 ms
        # (time for the turn to reach the queue); the quick one then frees within the bound.
        on_quick = hold_slot(executor, world, "sticky-wait-woken", tokens=90)
        on_sluggish = hold_slot(executor, world, "sticky-wait-woken", tokens=5)
        second = turn(world, "sticky-wait-woken", 2, headers=session, max_tokens=20)
        assert (on_quick.result().target, on_sluggish.result().target) == ("quick", "sluggish")

    assert second.target == "quick"
    decision = world.record(second).decision
    assert decision.get("woken_by") == "sticky target quick freed a slot", decision
    assert decision["continuity"].startswith("waited "), decision["continuity"]
    assert decision["sticky_wait"]["alternative"] == "sluggish"


@pytest.mark.parametrize("key", ["prompt_cache_key", "user"])
def test_the_prompt_cache_key_and_the_user_field_also_keep_a_conversation_together(
    world: World, key: str
) -> None:
    first = turn(world, "sticky-keys", 1, **{key: f"conversation by {key}"})
    second = turn(world, "sticky-keys", 2, **{key: f"conversation by {key}"})

    assert first.target is not None
    assert second.target == first.target
    decision = world.record(second).decision
    assert decision["continuity"] == "kept"
    assert decision["request"]["sticky_target_id"] == world.target_id("sticky-keys", first.target)


# --- Queue --------------------------------------------------------------------------------------


# Alone: it asserts the refusal comes within 0.5 s.
@pytest.mark.serial
def test_a_request_beyond_a_full_queue_gets_429_with_retry_after(world: World) -> None:
    with ThreadPoolExecutor(max_workers=4) as executor:
        holder = hold_slot(executor, world, "queue-full", tokens=50)
        waiters = [join_queue(executor, world, "queue-full") for _ in range(2)]  # max_queue 2

        refused = world.chat("queue-full")

        assert not holder.done()
        answers = [waiter.result() for waiter in waiters]
    assert refused.status == 429
    assert refused.error()["code"] == "queue_full"
    assert refused.error()["type"] == "rate_limit_error"
    assert "(queue full)" in refused.error()["message"]
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.elapsed_s < 0.5  # refused at once, not after waiting
    assert [answer.status for answer in answers] == [200, 200]
    assert holder.result().done
    record = world.record(refused)
    assert (record.outcome, record.status_code, record.target_name) == ("queue_full", 429, "")


# Alone: it asserts the 0.3 s queue timeout answers within 0.9 s.
@pytest.mark.serial
def test_a_request_that_gets_no_slot_within_its_queue_timeout_gets_503(world: World) -> None:
    with ThreadPoolExecutor(max_workers=2) as executor:
        holder = hold_slot(executor, world, "queue-timeout", tokens=25)

        late = world.chat("queue-timeout", headers={QUEUE_TIMEOUT: "0.3"})

        assert not holder.done()
        assert holder.result().done
    assert late.status == 503
    assert late.error()["code"] == "queue_timeout"
    assert 0.3 <= late.elapsed_s < 0.9
    record = world.record(late)
    assert record.outcome == "queue_timeout"
    assert 300 <= record.queue_wait_ms < 600


def test_a_waiting_request_whose_client_left_gives_up_its_place_at_once(world: World) -> None:
    with ThreadPoolExecutor(max_workers=3) as executor:
        holder = hold_slot(executor, world, "queue-gone", tokens=30)
        with raw_request(world, chat_body("queue-gone")):
            # It waits in the queue, then its client leaves.
            wait_until(lambda: queued(world, "queue-gone") == 1, timeout_s=10)
        wait_until(
            lambda: queued(world, "queue-gone") == 0,
            timeout_s=2,
            what="the gone client's place was not given up",
        )

        # The queue holds 2: both fit only if the gone client's place was given up.
        later = [
            executor.submit(world.chat, "queue-gone", headers={QUEUE_TIMEOUT: "5"})
            for _ in range(2)
        ]
        answers = [future.result() for future in later]
        assert holder.result().done

    assert [answer.status for answer in answers] == [200, 200]

    def gone() -> RoutingRecord | None:
        with world.blocker.unblock():
            return RoutingRecord.objects.filter(
                pool__slug="queue-gone", outcome="client_gone"
            ).first()

    record = wait_until(gone, timeout_s=5, what="no history row for the client that left")
    assert record.target_id is None


def test_the_history_of_a_client_that_left_the_queue_says_how_long_it_waited(
    world: World,
) -> None:
    with ThreadPoolExecutor(max_workers=1) as executor:
        holder = hold_slot(executor, world, "queue-gone-wait", tokens=50)
        with raw_request(world, chat_body("queue-gone-wait")):
            wait_until(lambda: queued(world, "queue-gone-wait") == 1, timeout_s=10)
            time.sleep(0.5)  # waiting in the queue
        assert holder.result().done

    def gone() -> RoutingRecord | None:
        with world.blocker.unblock():
            return RoutingRecord.objects.filter(
                pool__slug="queue-gone-wait", outcome="client_gone"
            ).first()

    record = wait_until(gone, timeout_s=5, what="no history row for the client that left")
    assert 500 <= record.queue_wait_ms < 1500


def test_the_queue_serves_a_lone_request_of_another_token_before_a_busy_tokens_backlog(
    world: World,
) -> None:
    with ThreadPoolExecutor(max_workers=8) as executor:
        # Held until the queue filled, one request at a time.
        with holding_slot(world, "queue-fair"):
            backlog = [join_queue(executor, world, "queue-fair", max_tokens=4) for _ in range(6)]
            lone = join_queue(executor, world, "queue-fair", max_tokens=4, token=world.other_token)
        answers = [("A", future.result()) for future in backlog] + [("B", lone.result())]

    assert [answer.status for _, answer in answers] == [200] * 7
    # Tokens take turns: A's first waiter, then B's only one, then the rest of A's.
    assert served_order(world, answers) == ["A", "B", "A", "A", "A", "A", "A"]


def test_a_token_over_its_fair_share_of_the_queue_gets_429_while_another_token_waits(
    world: World,
) -> None:
    with ThreadPoolExecutor(max_workers=4) as executor:
        with holding_slot(world, "queue-share"):
            lone = join_queue(executor, world, "queue-share", token=world.other_token)
            # B holds 1 place of 4, A holds 2: A's fair share while B waits.
            backlog = [join_queue(executor, world, "queue-share") for _ in range(2)]

            refused = world.chat("queue-share")

        served = [future.result() for future in (lone, *backlog)]
    assert refused.status == 429
    assert refused.error()["code"] == "queue_full"
    assert "(token over its fair share)" in refused.error()["message"]
    assert [answer.status for answer in served] == [200] * 3


def test_a_token_that_filled_the_queue_alone_gives_up_its_newest_place_to_another_token(
    world: World,
) -> None:
    with ThreadPoolExecutor(max_workers=8) as executor:
        with holding_slot(world, "queue-pushed"):
            # A alone fills the queue's 4 places, one after another: the last is the newest.
            backlog = [join_queue(executor, world, "queue-pushed") for _ in range(4)]
            lone = executor.submit(world.chat, "queue-pushed", token=world.other_token)

            pushed_out = backlog[-1].result()

        served = [future.result() for future in (lone, *backlog[:-1])]

    # B, under its share (2 of 4), got in; A's newest waiter, over its share, gave up its place.
    assert pushed_out.status == 429
    assert pushed_out.error()["code"] == "queue_full"
    assert "(token over its fair share)" in pushed_out.error()["message"]
    assert int(pushed_out.headers["retry-after"]) >= 1
    assert [answer.status for answer in served] == [200] * 4


def test_an_embeddings_request_is_not_held_behind_chat_requests_waiting_for_the_chat_slot(
    world: World,
) -> None:
    with ThreadPoolExecutor(max_workers=2) as executor:
        holder = hold_slot(executor, world, "queue-kinds", tokens=60)
        waiter = join_queue(executor, world, "queue-kinds")  # waits for the only chat slot

        embedding = send(
            f"{world.nexus.url}/v1/embeddings",
            world.token,
            {"model": "@pool/queue-kinds", "input": "hello"},
        )

        assert not holder.done()
        assert waiter.result().status == 200
    assert (embedding.status, embedding.target) == (200, "embed")
    assert world.record(embedding).queue_wait_ms == 0.0


def test_waiters_of_one_token_are_served_in_arrival_order_beside_an_idle_target_of_another_kind(
    world: World,
) -> None:
    with ThreadPoolExecutor(max_workers=7) as executor:
        with holding_slot(world, "queue-kinds-order"):
            waiters = [
                join_queue(executor, world, "queue-kinds-order", content=f"w{index}")
                for index in range(6)
            ]
        answers = [future.result() for future in waiters]

    assert [answer.status for answer in answers] == [200] * 6
    labelled = [(str(index), answer) for index, answer in enumerate(answers)]
    assert served_order(world, labelled) == ["0", "1", "2", "3", "4", "5"]


def test_retry_after_estimates_the_wait_from_recent_service_times(world: World) -> None:
    # One request held the only slot for about a second: the pool's recent service time.
    assert world.chat("queue-estimate", max_tokens=25, stream=True).done
    with ThreadPoolExecutor(max_workers=4) as executor:
        # Held until both waiters queued and the third was refused (only finished requests
        # make the estimate: the holder's time counts after).
        with holding_slot(world, "queue-estimate"):
            waiters = [join_queue(executor, world, "queue-estimate") for _ in range(2)]

            refused = world.chat("queue-estimate")

        for waiter in waiters:
            waiter.result()
    # Two waiting ahead and one in service, about a second each, on one slot.
    assert refused.status == 429
    assert int(refused.headers["retry-after"]) >= 2, refused


# --- Tiers --------------------------------------------------------------------------------------


def test_the_second_tier_takes_traffic_only_while_the_first_is_full(world: World) -> None:
    before = [world.chat("tiers").target for _ in range(3)]
    with ThreadPoolExecutor(max_workers=2) as executor:
        holders = [hold_slot(executor, world, "tiers", tokens=25) for _ in range(2)]

        overflow = world.chat("tiers")

        held = [holder.result() for holder in holders]
    after = world.chat("tiers")

    assert before == ["primary"] * 3
    assert [answer.target for answer in held] == ["primary", "primary"]
    assert (overflow.status, overflow.target) == (200, "backup")
    decision = world.record(overflow).decision
    assert decision["tier"] == 2
    assert decision["skipped"] == [
        {
            "target_id": world.target_id("tiers", "primary"),
            "name": "primary",
            "reason": "full",
            "detail": "2 of 2 in flight",
        }
    ]
    assert after.target == "primary"


def test_the_second_tier_takes_traffic_while_the_first_is_disabled(world: World) -> None:
    def set_primary_enabled(enabled: bool) -> None:
        with world.blocker.unblock():
            primary = Target.objects.get(pk=world.target_id("tiers", "primary"))
            primary.enabled = enabled
            primary.save()

    def first_reaching(name: str) -> Callable[[], Answer | None]:
        return lambda: (answer := world.chat("tiers")).target == name and answer or None

    set_primary_enabled(False)
    try:
        moved = wait_until(first_reaching("backup"), timeout_s=4)
    finally:
        set_primary_enabled(True)
    back = wait_until(first_reaching("primary"), timeout_s=4)

    assert world.record(moved).decision["skipped"] == [
        {
            "target_id": world.target_id("tiers", "primary"),
            "name": "primary",
            "reason": "disabled",
            "detail": "",
        }
    ]
    assert world.record(back).decision["tier"] == 1


# --- Metrics ------------------------------------------------------------------------------------


def test_the_metrics_count_a_pools_requests_by_target_and_outcome(world: World) -> None:
    for _ in range(3):
        assert world.chat("metered").status == 200

    def served() -> float:
        return metric(world, "nexus_requests_total", pool="metered", target="meter", outcome="ok")

    # Counted as each request ends, which may be a moment after its last byte reached us.
    assert wait_until(lambda: served() == 3.0, timeout_s=3)
