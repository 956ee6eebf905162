"""Try traffic and the failure drill through a real gateway (daphne) to real engines: the runs
are called as the worker calls them; what they record is what the gateway did."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nexus.models import ApiToken
from pools import services, traffic
from pools.models import Pool, Target, TargetState, TrafficRun, TrafficRunKind, TrafficRunStatus
from tests.nexus.factories import make_pool, make_target, make_user
from tests.support.live import LiveServer, running_nexus
from tests.support.simulator import running_simulators

PARAMS = {"requests": 12, "concurrency": 3, "kind": "chat", "stream": True, "max_tokens": 4}


@pytest.fixture
def gateway(transactional_db: None, tmp_path: Path, settings: Any) -> Iterator[LiveServer]:
    with running_simulators(
        fast={"model": "demo-8b", "ttft_ms": 5, "tpot_ms": 1, "concurrency": 8},
        slow={"model": "demo-8b", "ttft_ms": 20, "tpot_ms": 2, "concurrency": 8},
    ) as engines:
        pool = make_pool("drill", strategy="round_robin")
        for name, engine in engines.items():
            make_target(pool, name, base_url=engine.base_url, model_id="demo-8b", capacity_weight=8)
        with running_nexus(tmp_path) as server:
            settings.NEXUS_CONTROLLER_URL = server.url
            yield server


def start(kind: str, target: Target | None = None) -> TrafficRun:
    pool = Pool.objects.get(slug="drill")
    run = services.start_traffic(pool, kind, PARAMS, make_user("operator"), target=target)
    assert services.run_claimed(run.pk) == TrafficRunStatus.SUCCEEDED
    run.refresh_from_db()
    return run


def test_try_traffic_counts_where_each_request_went_and_revokes_its_token(
    gateway: LiveServer,
) -> None:
    run = start(TrafficRunKind.TRY)

    [phase] = run.phases
    assert (phase["sent"], phase["ok"], phase["failed"]) == (12, 12, 0)
    assert phase["by_target"] == {"fast": 6, "slow": 6}
    assert len(phase["ttft_ms"]) == 12
    token = ApiToken.objects.get(name=f"Try traffic #{run.pk}")
    assert token.revoked_at is not None
    assert token.pools == ["drill"]
    # A duplicate delivery finds it claimed.
    assert services.run_claimed(run.pk) == "not queued"


def test_a_drill_avoids_the_drained_target_and_takes_it_back(gateway: LiveServer) -> None:
    fast = Target.objects.get(name="fast")

    run = start(TrafficRunKind.DRILL, target=fast)

    assert [phase["name"] for phase in run.phases] == ["before", "drain", "after resume"], run.error
    assert run.phases[1]["by_target"] == {"slow": 12}
    assert re.fullmatch(
        r"avoided: 0 of 12 requests went to fast while draining; "
        r"recovered: \d+ % share after resume \(before: 50 %\)",
        run.verdict,
    ), run.verdict
    assert Target.objects.get(pk=fast.pk).state == TargetState.ACTIVE


def test_the_verdict_says_when_the_pool_did_not_avoid_or_recover() -> None:
    phases = [
        {"name": "drain", "sent": 10, "by_target": {"fast": 2, "slow": 8}},
        {"name": "after resume", "sent": 10, "by_target": {"slow": 10}},
    ]

    assert traffic.drill_verdict("fast", phases) == (
        "not avoided: 2 of 10 requests went to fast while draining; "
        "not recovered: 0 % share after resume"
    )
