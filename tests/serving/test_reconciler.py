"""The reconciler against real agents and processes: placement, failures and backoff, rollouts
and rollbacks, scaling, destroying; the health probes are the real `serving.probes`."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.utils import timezone

from nexus.models import ApiToken
from nexus.services import redis_client
from nodes.models import Node
from pools.models import Pool, Target, TargetState
from serving import reconciler, replicas
from serving.models import (
    RevisionState,
    Route,
    RouteState,
    Service,
    ServiceLifecycle,
    models_root,
)
from serving.tasks import reconcile as reconcile_task
from tests.nodes.fleet import trusted_node
from tests.serving.fleet import (
    CRASHING,
    FAST_CHECK,
    HELLO,
    add_revision,
    describe,
    healthy,
    make_service,
    model_folder,
    models_agent,
    routes,
    run_until,
    tick,
)
from tests.support.agent import RunningAgent, running_agent
from tests.support.http import LOOPBACK
from tests.support.live import running_nexus
from tests.support.waiting import wait_until


@pytest.fixture(autouse=True)
def no_gateway_to_wait_for(monkeypatch: pytest.MonkeyPatch) -> None:
    # No gateway runs here to mark drained targets drained: a retired route stops at once.
    monkeypatch.setattr(reconciler, "DRAIN_GRACE_S", 0.0)


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as processes:
        yield processes


def fleet(stack: ExitStack, tmp_path: Path, *names: str) -> list[tuple[RunningAgent, Node]]:
    """Start an agent per name and add each as a trusted node of that name."""
    agents = [stack.enter_context(models_agent(tmp_path, name=name)) for name in names]
    return [(agent, trusted_node(name, agent)) for agent, name in zip(agents, names, strict=True)]


def agent_states(agent: RunningAgent) -> dict[str, str]:
    """Return the agent's processes' states by process id."""
    response = LOOPBACK.get(f"{agent.url}/agent/v1/processes", headers=agent.headers(), timeout=5)
    return {record["id"]: record["state"] for record in response.json()["data"]}


def active_targets(service: Service) -> list[Target]:
    return list(
        Target.objects.filter(pool__slug=service.name, state=TargetState.ACTIVE).order_by("name")
    )


def test_two_replicas_spread_over_two_nodes_and_serve_through_the_pool(
    db: None, tmp_path: Path, stack: ExitStack
) -> None:
    folder = stack.enter_context(model_folder())
    fleet(stack, tmp_path, "node-a", "node-b")
    service = make_service(folder, replicas=2)

    run_until(service, lambda: healthy(service, 2))

    ready = routes(service, RouteState.HEALTHY)
    assert sorted(route.node.name for route in ready) == ["node-a", "node-b"]
    pool = Pool.objects.get(slug="chat")
    assert pool.managed
    assert service.pool == pool
    targets = {target.name: target for target in pool.targets.all()}
    assert sorted(targets) == sorted(f"route-{route.pk}" for route in ready)
    for route in ready:
        target = targets[f"route-{route.pk}"]
        assert route.target_id == target.pk
        assert target.node == route.node
        assert target.model_id == "tiny"
        assert target.base_url == (
            f"{route.node.address}/agent/v1/processes/{route.process_id}/http"
        )
    through_agent = LOOPBACK.get(
        targets[f"route-{ready[0].pk}"].base_url + "/hello.txt",
        headers={"Authorization": f"Bearer {ready[0].node.get_credential()}"},
        timeout=5,
    )
    assert through_agent.text == HELLO
    tick(service)  # the next tick sees every replica ready
    assert service.running_revision == service.latest_revision
    assert service.running_revision.state == RevisionState.RUNNING
    assert service.status_message == "2 of 2 replicas ready"


def test_a_replica_that_fits_nowhere_waits_saying_why(
    db: None, tmp_path: Path, stack: ExitStack
) -> None:
    folder = stack.enter_context(model_folder())
    fleet(stack, tmp_path, "node-a")
    service = make_service(folder, slots={"cpu": 4096, "mem": "1g"})

    tick(service)

    [route] = routes(service)
    assert route.state == RouteState.PROVISIONING
    assert route.node is None
    assert route.status_message.startswith(
        "waiting: insufficient resources in default: needs 4096 CPU, 1 GiB; best node node-a has "
    )
    assert service.status_message == (
        "0 of 1 replica ready · rolling out r1 · waiting: insufficient resources in default"
    )


def test_a_crash_looping_command_fails_to_start_and_its_replacements_back_off(
    db: None, tmp_path: Path, stack: ExitStack
) -> None:
    folder = stack.enter_context(model_folder())
    fleet(stack, tmp_path, "node-a")
    service = make_service(folder, argv=CRASHING)

    run_until(
        service,
        lambda: len(routes(service, RouteState.FAILED_TO_START, RouteState.TERMINATED)) >= 3,
    )

    failed = routes(service)[:3]
    for route in failed:
        assert route.errors[-1]["exit_code"] == 1
        assert route.errors[-1]["log_tail"].splitlines()[-1] == "CUDA out of memory"
    assert [route.restart_count for route in failed] == [0, 1, 2]
    # Each replacement waited for its predecessor's backoff, which doubles.
    waits = [(route.not_before - route.ended_at).total_seconds() for route in failed]
    assert [round(wait) for wait in waits] == [1, 2, 4]
    for before, after in zip(failed, failed[1:], strict=False):
        assert after.created_at >= before.not_before
        assert before.status_message == f"replaced by route {after.pk}"
    # The errors travel with the replacements, so the latest route shows them all.
    assert len(failed[2].errors) == 3


def test_clearing_a_failed_routes_errors_replaces_it_at_once(
    db: None, tmp_path: Path, stack: ExitStack
) -> None:
    folder = stack.enter_context(model_folder())
    fleet(stack, tmp_path, "node-a")
    service = make_service(folder, argv=CRASHING)
    [failed] = run_until(service, lambda: routes(service, RouteState.FAILED_TO_START))
    far = timezone.now() + timedelta(seconds=60)
    Route.objects.filter(pk=failed.pk).update(not_before=far, restart_count=5)
    tick(service)
    assert routes(service, RouteState.FAILED_TO_START) == [failed]

    replicas.clear_errors_and_retry(failed)
    tick(service)

    failed.refresh_from_db()
    assert failed.state == RouteState.TERMINATED
    replacement = routes(service)[-1]
    assert failed.status_message == f"replaced by route {replacement.pk}"
    assert replacement.restart_count == 1
    assert replacement.errors == []


def test_a_rollout_replaces_routes_one_by_one_and_the_pool_always_has_a_target(
    db: None, tmp_path: Path, stack: ExitStack
) -> None:
    folder = stack.enter_context(model_folder())
    agents = fleet(stack, tmp_path, "node-a", "node-b")
    service = make_service(folder, replicas=2)
    run_until(service, lambda: healthy(service, 2))
    old = routes(service, RouteState.HEALTHY)
    first = service.latest_revision
    second = add_revision(service, folder, env={"PYTHONUNBUFFERED": "1", "REVISION": "2"})
    seen: list[tuple[int, int]] = []

    def check() -> None:
        assert active_targets(service), describe(service)
        live = routes(service, RouteState.PROVISIONING, RouteState.HEALTHY)
        assert len(live) <= 3, describe(service)
        starting = [r for r in live if r.revision_id == second.pk and r.state != "healthy"]
        assert len(starting) <= 1, describe(service)
        counts = (sum(r.revision_id == first.pk for r in live), len(live) - len(starting))
        if not seen or seen[-1] != counts:
            seen.append(counts)

    run_until(
        service,
        lambda: service.running_revision_id == second.pk and healthy(service, 2),
        every=check,
    )

    new = routes(service, RouteState.HEALTHY)
    assert {route.revision_id for route in new} == {second.pk}
    assert sorted(route.node.name for route in new) == ["node-a", "node-b"]
    assert sorted(t.name for t in active_targets(service)) == sorted(f"route-{r.pk}" for r in new)
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.state, second.state) == (RevisionState.SUPERSEDED, RevisionState.RUNNING)
    # Old routes left one at a time: 2 old + 1 new, 1 old + 2 new, then the new ones alone.
    old_counts = [count for count, _ in seen]
    assert old_counts == sorted(old_counts, reverse=True)
    assert set(old_counts) == {2, 1, 0}
    stopped = {}
    for agent, _ in agents:
        stopped |= agent_states(agent)
    for route in old:
        route.refresh_from_db()
        assert route.state == RouteState.TERMINATED
        assert stopped[route.process_id] == "stopped"


def test_a_broken_revision_rolls_back_and_the_old_routes_keep_serving(
    db: None, tmp_path: Path, stack: ExitStack
) -> None:
    folder = stack.enter_context(model_folder())
    fleet(stack, tmp_path, "node-a")
    service = make_service(folder)
    [serving] = run_until(service, lambda: routes(service, RouteState.HEALTHY))
    first = service.latest_revision
    broken = add_revision(service, folder, argv=CRASHING)

    run_until(service, lambda: service.latest_revision_id == first.pk)

    broken.refresh_from_db()
    [tried] = [route for route in routes(service) if route.revision_id == broken.pk]
    assert broken.state == RevisionState.ROLLED_BACK
    assert (
        broken.failure_reason
        == f"route {tried.pk} failed to start: exit code 1: CUDA out of memory"
    )
    assert service.running_revision == first
    serving.refresh_from_db()
    assert serving.state == RouteState.HEALTHY
    assert [t.name for t in active_targets(service)] == [f"route-{serving.pk}"]
    tick(service)
    tried.refresh_from_db()
    assert tried.state == RouteState.TERMINATED
    assert tried.errors[-1]["exit_code"] == 1
    assert service.status_message == "1 of 1 replica ready"


def test_a_first_revision_replaced_before_it_ran_is_superseded(db: None) -> None:
    with model_folder() as folder:
        service = make_service(folder)  # no node: its route waits
        tick(service)
        first = service.latest_revision
        second = add_revision(service, folder, env={"REVISION": "2"})

        tick(service)

    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.state, second.state) == (RevisionState.SUPERSEDED, RevisionState.ROLLING_OUT)


def test_a_revision_replaced_during_its_rollout_is_superseded_and_the_next_rolls_out(
    db: None, tmp_path: Path, stack: ExitStack
) -> None:
    folder = stack.enter_context(model_folder())
    fleet(stack, tmp_path, "node-a")
    service = make_service(folder)
    run_until(service, lambda: healthy(service, 1))
    first = service.latest_revision
    never_healthy = {**FAST_CHECK, "path": "/missing", "max_retries": 1000}
    stuck = add_revision(service, folder, health_check=never_healthy)
    run_until(service, lambda: any(r.revision_id == stuck.pk and r.node for r in routes(service)))
    third = add_revision(service, folder, env={"REVISION": "3"})

    run_until(service, lambda: service.running_revision_id == third.pk)

    states = {r.number: r.state for r in service.revisions.all()}
    assert states == {
        first.number: RevisionState.SUPERSEDED,
        stuck.number: RevisionState.SUPERSEDED,
        third.number: RevisionState.RUNNING,
    }


def test_a_revision_rolled_back_supersedes_none_and_one_skipped_stays_superseded(
    db: None, tmp_path: Path, stack: ExitStack
) -> None:
    folder = stack.enter_context(model_folder())
    fleet(stack, tmp_path, "node-a")
    service = make_service(folder)
    run_until(service, lambda: healthy(service, 1))
    first = service.latest_revision
    skipped = add_revision(service, folder, env={"REVISION": "2"})
    tick(service)
    broken = add_revision(service, folder, argv=CRASHING)

    run_until(service, lambda: service.latest_revision_id == first.pk)

    states = {r.number: r.state for r in service.revisions.all()}
    assert states == {
        first.number: RevisionState.RUNNING,
        skipped.number: RevisionState.SUPERSEDED,
        broken.number: RevisionState.ROLLED_BACK,
    }


def test_a_new_route_that_is_not_healthy_in_time_rolls_the_revision_back(
    db: None, tmp_path: Path, stack: ExitStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = stack.enter_context(model_folder())
    fleet(stack, tmp_path, "node-a")
    service = make_service(folder)
    run_until(service, lambda: healthy(service, 1))
    first = service.latest_revision
    # Its replica never fits; with no slack its deadline is the health check's 0.6 s.
    monkeypatch.setattr(reconciler, "ROLLOUT_SLACK_S", 0.0)
    too_big = add_revision(service, folder, slots={"cpu": 4096})

    run_until(service, lambda: service.latest_revision_id == first.pk, timeout_s=10)

    too_big.refresh_from_db()
    [waited] = [route for route in routes(service) if route.revision_id == too_big.pk]
    assert too_big.state == RevisionState.ROLLED_BACK
    assert too_big.failure_reason.startswith(
        f"route {waited.pk} was not healthy within 0.6 s (waiting: insufficient resources in "
        "default: needs 4096 CPU"
    )
    assert waited.state == RouteState.TERMINATED
    assert healthy(service, 1)


def test_scaling_adds_routes_and_retires_the_newest(
    db: None, tmp_path: Path, stack: ExitStack
) -> None:
    folder = stack.enter_context(model_folder())
    [(agent, _)] = fleet(stack, tmp_path, "node-a")
    service = make_service(folder)
    [first] = run_until(service, lambda: routes(service, RouteState.HEALTHY))

    Service.objects.filter(pk=service.pk).update(desired_replicas=3)
    run_until(service, lambda: healthy(service, 3))
    tick(service)
    assert len(active_targets(service)) == 3
    assert service.status_message == "3 of 3 replicas ready"

    Service.objects.filter(pk=service.pk).update(desired_replicas=1)
    run_until(service, lambda: healthy(service, 1) and not routes(service, "terminating"))

    assert routes(service, RouteState.HEALTHY) == [first]
    assert [t.name for t in active_targets(service)] == [f"route-{first.pk}"]
    states = agent_states(agent)
    assert sorted(states.values()) == ["running", "stopped", "stopped"]
    assert states[first.process_id] == "running"


def test_destroying_stops_every_process_drops_the_pool_and_revokes_its_tokens(
    db: None, tmp_path: Path, stack: ExitStack
) -> None:
    folder = stack.enter_context(model_folder())
    agents = fleet(stack, tmp_path, "node-a", "node-b")
    service = make_service(folder, replicas=2)
    run_until(service, lambda: healthy(service, 2))
    token, _ = ApiToken.issue("chat client", services=["chat"])
    other, _ = ApiToken.issue("other client", services=["summaries"])
    Service.objects.filter(pk=service.pk).update(lifecycle=ServiceLifecycle.DESTROYING)

    run_until(service, lambda: service.lifecycle == ServiceLifecycle.DESTROYED)

    assert {route.state for route in routes(service)} == {RouteState.TERMINATED}
    for agent, _ in agents:
        assert set(agent_states(agent).values()) == {"stopped"}
    assert not Pool.objects.filter(slug="chat").exists()
    assert service.pool is None
    assert service.destroyed_at is not None
    token.refresh_from_db()
    other.refresh_from_db()
    assert token.revoked_at is not None
    assert other.revoked_at is None
    assert reconciler.reconcile(service) == "destroyed"


def test_a_service_another_tick_holds_is_left_alone(db: None) -> None:
    service = Service.objects.create(name="chat")
    lock = redis_client().lock(
        f"{settings.NEXUS_REDIS_PREFIX}:serving:reconcile:{service.pk}", timeout=10
    )
    assert lock.acquire(blocking=False)
    try:
        assert reconciler.reconcile(service) == "busy"
    finally:
        lock.release()
    assert reconciler.reconcile(service) == "ok"


def test_the_beat_task_reconciles_every_live_service(
    db: None, tmp_path: Path, stack: ExitStack
) -> None:
    folder = stack.enter_context(model_folder())
    fleet(stack, tmp_path, "node-a")
    service = make_service(folder)
    Service.objects.create(name="gone", lifecycle=ServiceLifecycle.DESTROYED)

    assert reconcile_task() == {"ok": 1}

    [route] = routes(service)
    assert route.node is not None and route.process_id


def test_a_rollout_under_traffic_through_the_gateway_fails_no_request(
    transactional_db: None, tmp_path: Path, stack: ExitStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The gateway marks a drained target drained once its last request is done: wait for it.
    monkeypatch.setattr(reconciler, "DRAIN_GRACE_S", 30.0)
    folder = stack.enter_context(model_folder())
    fleet(stack, tmp_path, "node-a", "node-b")
    service = make_service(folder, replicas=2)
    Service.objects.filter(pk=service.pk).update(open_to_public=True)
    run_until(service, lambda: healthy(service, 2))
    nexus = stack.enter_context(running_nexus(tmp_path, NEXUS_LEDGER="memory"))
    url = f"{nexus.url}/serve/chat/hello.txt"
    wait_until(lambda: LOOPBACK.get(url, timeout=5).text == HELLO, what=nexus.log)
    outcomes: list[str] = []
    stop = threading.Event()

    def traffic() -> None:
        with httpx.Client(timeout=10) as client:
            while not stop.is_set():
                try:
                    response = client.get(url)
                    ok = response.status_code == 200 and response.text == HELLO
                    outcomes.append("ok" if ok else f"{response.status_code} {response.text}")
                except httpx.HTTPError as error:
                    outcomes.append(repr(error))

    clients = [threading.Thread(target=traffic) for _ in range(4)]
    for client in clients:
        client.start()
    try:
        second = add_revision(service, folder, env={"PYTHONUNBUFFERED": "1", "REVISION": "2"})
        run_until(
            service,
            lambda: (
                service.running_revision_id == second.pk
                and healthy(service, 2)
                and not routes(service, RouteState.TERMINATING)
            ),
            timeout_s=90,
        )
    finally:
        stop.set()
        for client in clients:
            client.join()

    failures = [outcome for outcome in outcomes if outcome != "ok"]
    assert failures == [], nexus.log()[-3000:]
    assert len(outcomes) > 100
    assert {route.revision_id for route in routes(service, RouteState.HEALTHY)} == {second.pk}


def test_a_node_that_refuses_the_folders_path_is_left_out_until_its_configuration_changes(
    db: None, tmp_path: Path, stack: ExitStack
) -> None:
    folder = stack.enter_context(model_folder())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    agent = stack.enter_context(models_agent(tmp_path, name="node-a"))
    trusted_node("node-a", agent)
    mkdir = {"action": "mkdir", "args": {"path": str(elsewhere / "config")}}
    service = make_service(folder, pre_start_actions=[mkdir])

    waiting = run_until(
        service,
        lambda: [
            r for r in routes(service, RouteState.PROVISIONING) if "not chosen" in r.status_message
        ],
        timeout_s=20,
    )

    [first] = [route for route in routes(service) if route.node is not None]
    assert first.state == RouteState.TERMINATED
    assert "is outside the directories this agent may use" in first.errors[0]["message"]
    assert waiting[0].status_message.startswith("waiting: insufficient resources in default: ")
    assert waiting[0].status_message.endswith(
        f"; node node-a refused route {first.pk}: {first.errors[0]['message'].split(': ', 1)[1]}"
        " (not chosen again until its configuration changes)"
    )
    agent.stop()
    allowed = ["--allow-dir", str(models_root()), "--allow-dir", str(elsewhere)]
    stack.enter_context(running_agent(tmp_path, name="node-a", port=agent.port, args=allowed))

    run_until(service, lambda: healthy(service, 1))
