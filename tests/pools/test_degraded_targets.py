"""Degraded targets in a live gateway: ranked after healthy ones, ejected by one failed request.

A target is degraded while its latest active probe failed (a model service's replica whose
route is HEALTHY with probe_result failed). Its health reaches the gateway through the
configuration snapshot, and real requests go through a live daphne Nexus to simulator engines.
The API and the pools page show it, read-only.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from nexus.models import ApiToken
from pools.models import Pool, RoutingRecord, Target, TargetHealth
from tests.nexus.factories import make_pool, make_target
from tests.support.live import LiveServer, running_nexus
from tests.support.simulator import Simulator, running_simulators
from tests.support.traffic import Answer, chat_body, holding_slot, send
from tests.support.waiting import wait_until

# A configuration change reaches the gateway within its 1 s snapshot poll; with a margin.
SNAPSHOT_DELAY_S = 1.5
ENGINES: dict[str, dict[str, Any]] = {
    "fast": {"ttft_ms": 0, "tpot_ms": 1},
    "other": {"ttft_ms": 0, "tpot_ms": 1},
    "faulty": {"ttft_ms": 0, "tpot_ms": 1},
    "slow": {"ttft_ms": 0, "tpot_ms": 40},  # holds a slot for max_tokens × 40 ms
}
DEGRADED = {"health": TargetHealth.DEGRADED}


@dataclass(repr=False)
class World:
    """A live Nexus, its engines, a client token and the ids of every target by pool."""

    nexus: LiveServer
    engines: dict[str, Simulator]
    token: str
    target_ids: dict[tuple[str, str], int]
    blocker: Any  # pytest-django's django_db_blocker

    def chat(self, pool: str, started: threading.Event | None = None, **body: Any) -> Answer:
        return send(
            f"{self.nexus.url}/v1/chat/completions",
            self.token,
            chat_body(pool, **body),
            started=started,
        )

    def record(self, answer: Answer) -> RoutingRecord:
        """Return the request's history row, waiting for the gateway's next batched write."""

        def find() -> RoutingRecord | None:
            with self.blocker.unblock():
                return RoutingRecord.objects.filter(request_id=answer.request_id).first()

        return wait_until(find, timeout_s=5, what=f"no history row for {answer.request_id}")


def _build_pools(engines: dict[str, Simulator]) -> dict[tuple[str, str], int]:
    ids: dict[tuple[str, str], int] = {}

    def pool(slug: str, targets: list[tuple[str, str, dict[str, Any]]], **fields: Any) -> None:
        created = make_pool(slug, **fields)
        for position, (name, engine, extra) in enumerate(targets):
            target = make_target(
                created,
                name,
                base_url=engines[engine].base_url,
                model_id="demo-8b",
                position=position,
                **extra,
            )
            ids[(slug, name)] = target.pk

    # One tier: the healthy target has one slot on the slow engine, so a held stream fills it.
    pool(
        "degraded-ranking",
        [("healthy", "slow", {"capacity_weight": 1}), ("degraded", "fast", DEGRADED)],
    )
    # Round robin would alternate between both, were one of them not degraded.
    pool(
        "degraded-flip",
        [("a", "fast", {}), ("b", "other", DEGRADED)],
        strategy="round_robin",
    )
    # The degraded target is alone in tier 1, so every request tries it first.
    pool(
        "degraded-ejection",
        [("degraded", "faulty", DEGRADED), ("backup", "fast", {"priority": 2})],
    )
    return ids


@pytest.fixture(scope="module")
def world(committed_db, django_db_blocker, tmp_path_factory) -> Iterator[World]:
    with running_simulators(**{name: dict(flags) for name, flags in ENGINES.items()}) as engines:
        with django_db_blocker.unblock():
            target_ids = _build_pools(engines)
            slugs = sorted({slug for slug, _ in target_ids})
            issued, token = ApiToken.issue("degraded client")
        try:
            with running_nexus(
                tmp_path_factory.mktemp("degraded"),
                NEXUS_LEDGER="memory" if settings.NEXUS_BUNDLED_REDIS else "redis",
                NEXUS_REDIS_PREFIX=f"test-degraded-{uuid.uuid4().hex[:12]}",
            ) as nexus:
                yield World(nexus, engines, token, target_ids, django_db_blocker)
        finally:
            with django_db_blocker.unblock():
                Pool.objects.filter(slug__in=slugs).delete()
                ApiToken.objects.filter(pk=issued.pk).delete()


def test_a_degraded_target_takes_no_request_while_a_healthy_one_has_room(world: World) -> None:
    answers = [world.chat("degraded-ranking") for _ in range(4)]

    routed = [(answer.status, answer.target) for answer in answers]
    assert routed == [(200, "healthy")] * 4, [  # with why, where one went elsewhere
        world.record(answer).decision for answer in answers if answer.target != "healthy"
    ]
    ranking = world.record(answers[-1]).decision["ranking"]
    assert [ranked["name"] for ranked in ranking] == ["healthy", "degraded"]
    assert {"name": "degraded", "value": 0.0, "note": (
        "latest probe failed: ranked after healthy targets"
    )} in ranking[1]["factors"]  # fmt: skip


def test_a_degraded_target_serves_when_every_healthy_one_is_full(world: World) -> None:
    # The healthy target's only slot held by a stream until the request has its answer
    with holding_slot(world.nexus.port, world.token, "degraded-ranking"):
        answer = world.chat("degraded-ranking")

    assert (answer.status, answer.target, answer.attempts) == (200, "degraded", 1)
    [skipped] = world.record(answer).decision["skipped"]
    assert (skipped["name"], skipped["reason"]) == ("healthy", "full")


def test_a_target_that_is_no_longer_degraded_gets_its_share_again(world: World) -> None:
    before = [world.chat("degraded-flip").target for _ in range(4)]
    with world.blocker.unblock():
        target = Target.objects.get(pk=world.target_ids[("degraded-flip", "b")])
        target.health = TargetHealth.HEALTHY
        target.save()  # bumps the configuration version; the gateway reloads its snapshot
    time.sleep(SNAPSHOT_DELAY_S)

    after = [world.chat("degraded-flip").target for _ in range(4)]

    assert before == ["a"] * 4
    assert sorted(after) == ["a", "a", "b", "b"]


def test_one_failed_request_ejects_a_degraded_target_and_the_request_moves_to_a_healthy_one(
    world: World,
) -> None:
    with_fault = world.engines["faulty"]
    with_fault.set_faults(error_rate=1.0, error_codes=[503])
    try:
        first = world.chat("degraded-ejection")
        second = world.chat("degraded-ejection")
    finally:
        with_fault.clear_faults()

    # The refusal came before any output: the request was retried on the healthy target.
    assert (first.status, first.target, first.attempts) == (200, "backup", 2)
    assert [
        (attempt["target_name"], attempt["status"], attempt["retried"])
        for attempt in world.record(first).attempts
    ] == [("degraded", 503, True), ("backup", 200, False)]
    # One failure was enough (a healthy target takes three): the next request skips it.
    assert (second.status, second.target, second.attempts) == (200, "backup", 1)
    [skipped] = world.record(second).decision["skipped"]
    assert (skipped["name"], skipped["reason"]) == ("degraded", "circuit open")
    assert skipped["detail"].startswith(
        "circuit open: a failed request while its probes fail (degraded); half-open trial in"
    )


# --- Shown, never written, by operators ------------------------------------------------------


@pytest.mark.django_db
def test_the_api_shows_a_targets_health_and_ignores_a_write_to_it(owner: APIClient) -> None:
    target = make_target(make_pool("health-api"), "replica", health=TargetHealth.DEGRADED)

    shown = owner.get(f"/api/v1/targets/{target.pk}/")
    patched = owner.patch(f"/api/v1/targets/{target.pk}/", {"health": "healthy"}, format="json")

    assert shown.json()["health"] == "degraded"
    assert (patched.status_code, patched.json()["health"]) == (200, "degraded")
    target.refresh_from_db()
    assert target.health == TargetHealth.DEGRADED


@pytest.mark.django_db
def test_the_pools_page_shows_each_targets_health(teammate: APIClient) -> None:
    pool = make_pool("health-page")
    make_target(pool, "fine")
    make_target(pool, "probe-failing", health=TargetHealth.DEGRADED)

    page = teammate.get("/pools/health-page/").content.decode()

    fine, failing = (
        page[page.index(f'data-target="{name}"') :].split("</tr>")[0]
        for name in ["fine", "probe-failing"]
    )
    assert fine.count('data-state="active"') == 1  # healthy: its traffic state
    assert failing.count('data-state="degraded"') == 1
