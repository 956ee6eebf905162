"""Drain, resume, dry run and replay through the admin API."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from nexus.services import redis_client
from pools.gateway import publish
from pools.models import RoutingOutcome, RoutingRecord, Target, TargetState
from tests.nexus.factories import make_pool, make_target
from tests.support.ports import free_port
from tests.support.simulator import Simulator, running_simulator

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def engine() -> Iterator[Simulator]:
    with running_simulator(ttft_ms=0, tpot_ms=0) as sim:
        yield sim


@pytest.fixture
def no_live_gateway() -> None:
    """Forget gateways an earlier test on this worker killed: each stays listed as live until
    its reading's TTL (5 s) runs out."""
    redis_client().delete(publish.index_key(settings.NEXUS_REDIS_PREFIX))


def test_an_owner_drains_a_target_and_it_takes_no_new_requests(owner: APIClient) -> None:
    target = make_target(make_pool("chat"), "gpu-a")

    response = owner.post(f"/api/v1/targets/{target.pk}/drain/")

    assert response.status_code == 200
    assert response.json()["state"] == "draining"
    target.refresh_from_db()
    assert target.state == TargetState.DRAINING
    assert target.state_changed_at is not None


def test_a_teammate_cannot_drain(teammate: APIClient) -> None:
    target = make_target(make_pool("chat"), "gpu-a")

    assert teammate.post(f"/api/v1/targets/{target.pk}/drain/").status_code == 403
    assert Target.objects.get(pk=target.pk).state == TargetState.ACTIVE


def test_a_drained_target_resumes_once_it_answers_again(
    owner: APIClient, engine: Simulator
) -> None:
    target = make_target(
        make_pool("chat"), "sim", base_url=engine.base_url, model_id="demo-8b",
        state=TargetState.DRAINED,
    )  # fmt: skip

    response = owner.post(f"/api/v1/targets/{target.pk}/resume/")

    assert response.status_code == 200
    assert response.json()["state"] == "active"


def test_a_target_that_does_not_answer_cannot_resume(owner: APIClient) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    target = make_target(make_pool("chat"), "gone", base_url=url, state=TargetState.DRAINED)

    response = owner.post(f"/api/v1/targets/{target.pk}/resume/")

    assert response.status_code == 409
    assert response.json()["detail"].startswith(f"gone does not answer at {url}/models")
    assert Target.objects.get(pk=target.pk).state == TargetState.DRAINED


def test_the_state_cannot_be_written_directly(owner: APIClient) -> None:
    target = make_target(make_pool("chat"), "gpu-a")

    owner.patch(f"/api/v1/targets/{target.pk}/", {"state": "drained"}, format="json")

    assert Target.objects.get(pk=target.pk).state == TargetState.ACTIVE


def test_a_dry_run_ranks_the_targets_and_explains_the_skipped_ones(
    owner: APIClient, no_live_gateway: None
) -> None:
    pool = make_pool("chat", strategy="least_busy")
    make_target(pool, "big", capacity_weight=8)
    make_target(pool, "small", capacity_weight=2)
    make_target(pool, "off", enabled=False)
    make_target(pool, "leaving", state=TargetState.DRAINING)
    make_target(pool, "embedder", kinds=["embeddings"])

    response = owner.post(
        "/api/v1/pools/chat/dry-run/", {"kind": "chat", "session_id": "s1"}, format="json"
    )

    assert response.status_code == 200
    ranking = response.json()
    assert ranking["live"] is False
    assert ranking["request"] == {
        "kind": "chat",
        "sticky_target_id": None,
        "prefix_target_id": None,
    }
    assert [candidate["name"] for candidate in ranking["ranking"]] == ["big", "small"]
    assert {skip["name"]: skip["reason"] for skip in ranking["skipped"]} == {
        "off": "disabled",
        "leaving": "draining",
        "embedder": "incompatible",
    }
    assert ranking["target_id"] == ranking["ranking"][0]["target_id"]
    assert all(candidate["factors"] for candidate in ranking["ranking"])


def test_a_dry_run_refuses_an_unknown_kind(owner: APIClient) -> None:
    make_pool("chat")

    response = owner.post("/api/v1/pools/chat/dry-run/", {"kind": "images"}, format="json")

    assert response.status_code == 400
    assert "kind" in response.json()


def test_a_replay_says_what_would_change_under_the_current_configuration(
    owner: APIClient,
) -> None:
    pool = make_pool("chat", strategy="priority")
    first = make_target(pool, "first", priority=1)
    make_target(pool, "second", priority=1)
    RoutingRecord.objects.create(
        request_id="a" * 32,
        pool=pool,
        kind="chat",
        target=first,
        target_name="first",
        outcome=RoutingOutcome.OK,
        decision={"target_id": first.pk, "request": {"kind": "chat"}},
    )
    first.state = TargetState.DRAINING
    first.save()

    response = owner.post(f"/api/v1/history/{'a' * 32}/replay/")

    assert response.status_code == 200
    replay = response.json()
    assert replay["changed"] is True
    assert replay["then"]["target_id"] == first.pk
    assert replay["now"]["ranking"][0]["name"] == "second"
    assert {"name": "first", "reason": "draining"}.items() <= replay["now"]["skipped"][0].items()


def test_an_owner_drains_and_resumes_a_whole_pool_through_the_api(
    owner: APIClient, engine: Simulator
) -> None:
    pool = make_pool("chat")
    make_target(pool, "sim", base_url=engine.base_url, model_id="demo-8b")
    make_target(pool, "gone", base_url=f"http://127.0.0.1:{free_port()}/v1")

    drained = owner.post("/api/v1/pools/chat/drain/")
    resumed = owner.post("/api/v1/pools/chat/resume/")

    assert drained.json() == {"draining": ["sim", "gone"]}
    assert resumed.json()["resumed"] == ["sim"]
    [refused] = resumed.json()["refused"]
    assert refused.startswith("gone does not answer at")


def test_a_teammate_cannot_drain_a_pool(teammate: APIClient) -> None:
    make_target(make_pool("chat"), "gpu-a")

    assert teammate.post("/api/v1/pools/chat/drain/").status_code == 403
