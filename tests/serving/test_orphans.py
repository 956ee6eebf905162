"""The orphan sweep against real agents: replica processes that are no route's are stopped, the
routes' own processes and every other process are kept, and a node is swept at most once per
interval."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from nexus.services import redis_client
from nodes.models import Node, NodeStatus
from serving import reconciler, replicas
from serving.models import ModelFolder, Route, RoutePart, RouteState, Service
from serving.tasks import reconcile as reconcile_task
from tests.nodes.fleet import trusted_node
from tests.serving.fleet import make_service, model_folder, models_agent, routes, run_until
from tests.support.agent import RunningAgent
from tests.support.http import LOOPBACK

SLEEPER = [sys.executable, "-c", "import time; time.sleep(300)"]


@pytest.fixture(autouse=True)
def no_gateway_to_wait_for(monkeypatch: pytest.MonkeyPatch) -> None:
    # No gateway runs here to mark drained targets drained: a retired route stops at once.
    monkeypatch.setattr(reconciler, "DRAIN_GRACE_S", 0.0)


@pytest.fixture(autouse=True)
def every_node_due() -> Iterator[None]:
    # Node ids repeat between tests; an earlier test's claim must not skip a sweep here.
    def forget() -> None:
        client = redis_client()
        for key in client.scan_iter(match=f"{settings.NEXUS_REDIS_PREFIX}:serving:sweep:*"):
            client.delete(key)

    forget()
    yield
    forget()


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as processes:
        yield processes


@pytest.fixture
def folder(stack: ExitStack) -> ModelFolder:
    return stack.enter_context(model_folder())


def node(stack: ExitStack, tmp_path: Path, name: str) -> tuple[RunningAgent, Node]:
    agent = stack.enter_context(models_agent(tmp_path, name=name))
    return agent, trusted_node(name, agent)


def start(agent: RunningAgent, name: str, folder: ModelFolder) -> str:
    """Start a sleeping process of this name through the agent; return its id."""
    response = LOOPBACK.post(
        f"{agent.url}/agent/v1/processes",
        headers=agent.headers(),
        json={"argv": SLEEPER, "cwd": str(folder.path), "name": name},
        timeout=10,
    )
    assert response.status_code == 201, response.text
    return response.json()["id"]


def states(agent: RunningAgent) -> dict[str, str]:
    """Return the agent's processes' states by process id."""
    response = LOOPBACK.get(f"{agent.url}/agent/v1/processes", headers=agent.headers(), timeout=5)
    return {record["id"]: record["state"] for record in response.json()["data"]}


def route_on(service: Service, node: Node | None, state: str, **fields: object) -> Route:
    """Make a route of the service's latest revision, as the reconciler would have left it."""
    route = Route.objects.create(
        service=service, revision=service.latest_revision, node=node, state=state, **fields
    )
    route.service = service
    return route


def with_process(route: Route, agent: RunningAgent, folder: ModelFolder) -> str:
    """Start the route's process on the agent and store its id on the route."""
    process_id = start(agent, replicas.process_name(route), folder)
    Route.objects.filter(pk=route.pk).update(process_id=process_id)
    return process_id


@pytest.mark.parametrize(
    ("name", "route_id"),
    [
        ("chat-r3-17", 17),
        ("chat-r3-17-w2", 17),  # a multi-node replica's worker
        ("chat-r3-17-w02", None),
        ("my_chat-2-r1-5", 5),
        ("a-r1-2-r3-4", 4),  # a service may be named like a replica; the tail decides
        ("chat-r03-17", None),  # never made: no leading zeros
        ("chat-r3-017", None),
        ("chat-r3", None),
        ("chat-3-17", None),
        ("vllm tiny", None),  # a deployment's runtime
        ("simulator sim-model", None),
        ("chat-r3-17 ", None),
        ("", None),
    ],
)
def test_only_names_the_reconciler_makes_are_replica_names(name: str, route_id: int | None) -> None:
    assert replicas.route_id_of(name) == route_id


def test_a_multi_node_replicas_workers_are_kept_with_it_and_swept_once_it_ended(
    db: None, tmp_path: Path, stack: ExitStack, folder: ModelFolder
) -> None:
    agent, node_a = node(stack, tmp_path, "node-a")
    service = make_service(folder)
    live = route_on(service, node_a, RouteState.HEALTHY)
    main = with_process(live, agent, folder)
    worker = start(agent, f"{replicas.process_name(live)}-w1", folder)
    RoutePart.objects.create(route=live, rank=1, node=node_a, process_id=worker)
    stray = start(agent, f"{replicas.process_name(live)}-w2", folder)

    assert reconciler.sweep_orphans() == 1
    assert [states(agent)[p] for p in (main, worker, stray)] == ["running", "running", "stopped"]
    live.refresh_from_db()
    assert live.errors[-1]["message"] == (
        f"orphan process {stray} stopped on node node-a: route {live.pk} has no worker 2"
    )


def test_the_process_of_a_terminated_route_is_stopped_and_the_route_says_so(
    db: None,
    tmp_path: Path,
    stack: ExitStack,
    folder: ModelFolder,
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent, node_a = node(stack, tmp_path, "node-a")
    service = make_service(folder)
    ended = route_on(service, node_a, RouteState.TERMINATED, ended_at=timezone.now())
    process_id = with_process(ended, agent, folder)

    with caplog.at_level(logging.WARNING, logger="serving.reconciler"):
        assert reconciler.sweep_orphans() == 1

    assert states(agent)[process_id] == "stopped"
    ended.refresh_from_db()
    reason = f"route {ended.pk} is terminated"
    assert ended.errors[-1]["message"] == (
        f"orphan process {process_id} stopped on node node-a: {reason}"
    )
    assert [r.getMessage() for r in caplog.records if r.name == "serving.reconciler"] == [
        f"node node-a: stopped orphan chat-r1-{ended.pk} ({process_id}): {reason}"
    ]


def test_the_processes_of_live_routes_on_their_node_are_kept(
    db: None, tmp_path: Path, stack: ExitStack, folder: ModelFolder
) -> None:
    agent, node_a = node(stack, tmp_path, "node-a")
    service = make_service(folder, replicas=3)
    serving = with_process(route_on(service, node_a, RouteState.HEALTHY), agent, folder)
    draining = with_process(route_on(service, node_a, RouteState.TERMINATING), agent, folder)
    # Started, its answer not stored yet: the route names the node but no process id.
    starting = route_on(service, node_a, RouteState.PROVISIONING)
    being_started = start(agent, replicas.process_name(starting), folder)
    # Failed, not stopped yet: the tick's stop_ended stops it and records it.
    failed = route_on(service, node_a, RouteState.UNHEALTHY)
    failing = with_process(failed, agent, folder)

    assert reconciler.sweep_orphans() == 0

    found = states(agent)
    assert [found[id] for id in (serving, draining, being_started, failing)] == ["running"] * 4
    assert [route.errors for route in routes(service)] == [[], [], [], []]


def test_a_second_process_of_a_route_whose_start_answer_was_lost_is_stopped(
    db: None, tmp_path: Path, stack: ExitStack, folder: ModelFolder
) -> None:
    agent, node_a = node(stack, tmp_path, "node-a")
    service = make_service(folder)
    route = route_on(service, node_a, RouteState.HEALTHY)
    lost = start(agent, replicas.process_name(route), folder)
    kept = with_process(route, agent, folder)

    assert reconciler.sweep_orphans() == 1

    assert (states(agent)[lost], states(agent)[kept]) == ("stopped", "running")
    route.refresh_from_db()
    assert route.state == RouteState.HEALTHY
    assert route.errors[-1]["message"] == (
        f"orphan process {lost} stopped on node node-a: route {route.pk} runs process {kept}"
    )


def test_a_process_left_on_a_node_the_route_was_moved_from_is_stopped_there(
    db: None, tmp_path: Path, stack: ExitStack, folder: ModelFolder
) -> None:
    agent_a, node_a = node(stack, tmp_path, "node-a")
    agent_b, node_b = node(stack, tmp_path, "node-b")
    service = make_service(folder)
    route = route_on(service, node_b, RouteState.HEALTHY)
    left = start(agent_a, replicas.process_name(route), folder)
    serving = with_process(route, agent_b, folder)

    assert reconciler.sweep_orphans() == 1

    assert (states(agent_a)[left], states(agent_b)[serving]) == ("stopped", "running")
    route.refresh_from_db()
    assert route.errors[-1]["message"] == (
        f"orphan process {left} stopped on node node-a: route {route.pk} is placed on node node-b"
    )


def test_processes_that_are_not_replicas_are_never_touched(
    db: None, tmp_path: Path, stack: ExitStack, folder: ModelFolder
) -> None:
    agent, _ = node(stack, tmp_path, "node-a")
    others = [start(agent, name, folder) for name in ("vllm tiny", "chat-r1", "chat-r01-5")]
    no_route = start(agent, "chat-r1-999999", folder)

    assert reconciler.sweep_orphans() == 1

    found = states(agent)
    assert [found[id] for id in others] == ["running"] * 3
    assert found[no_route] == "stopped"


def test_a_route_stopped_while_its_node_was_offline_has_its_process_stopped_once_it_is_back(
    db: None, tmp_path: Path, stack: ExitStack, folder: ModelFolder
) -> None:
    agent, node_a = node(stack, tmp_path, "node-a")
    service = make_service(folder)
    [route] = run_until(service, lambda: routes(service, RouteState.HEALTHY))
    # The node stops answering and is marked offline; then the service is scaled to zero.
    Node.objects.filter(pk=node_a.pk).update(
        address="http://127.0.0.1:9", status=NodeStatus.OFFLINE
    )
    Service.objects.filter(pk=service.pk).update(desired_replicas=0)
    run_until(service, lambda: routes(service, RouteState.TERMINATED))
    route.refresh_from_db()
    assert route.status_message == "node node-a is offline; its process was not stopped"
    assert states(agent)[route.process_id] == "running"
    assert reconciler.sweep_orphans() == 0  # an offline node is not swept

    Node.objects.filter(pk=node_a.pk).update(address=agent.url, status=NodeStatus.ONLINE)

    assert reconcile_task() == {"ok": 1, "orphans_stopped": 1}
    assert states(agent)[route.process_id] == "stopped"
    route.refresh_from_db()
    assert route.errors[-1]["message"] == (
        f"orphan process {route.process_id} stopped on node node-a: route {route.pk} is terminated"
    )


def test_a_node_is_swept_at_most_once_per_interval_over_all_workers(
    db: None, tmp_path: Path, stack: ExitStack, folder: ModelFolder
) -> None:
    agent, node_a = node(stack, tmp_path, "node-a")
    first = start(agent, "chat-r1-999998", folder)
    assert reconciler.sweep_orphans() == 1
    second = start(agent, "chat-r1-999999", folder)

    assert reconciler.sweep_orphans() == 0

    assert (states(agent)[first], states(agent)[second]) == ("stopped", "running")
    key = f"{settings.NEXUS_REDIS_PREFIX}:serving:sweep:{node_a.pk}"
    assert 0 < redis_client().ttl(key) <= reconciler.SWEEP_INTERVAL_S
    redis_client().delete(key)  # the interval has passed
    assert reconciler.sweep_orphans() == 1
    assert states(agent)[second] == "stopped"
