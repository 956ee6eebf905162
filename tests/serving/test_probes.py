"""Active health checks of replicas through a real agent (serving.probes).

Every route here runs a real process started through the agent's POST /agent/v1/processes, and
every probe goes through the agent's process proxy with the node credential. The checks use
short timings (interval 0.2 s, max_retries 1, initial delay 0) and the tick is called in a
bounded loop, as the beat would call it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.utils import timezone

from nodes.models import Node
from pools.models import Pool, TargetHealth
from serving import probes, tasks
from serving.models import (
    ModelFolder,
    ProbeResult,
    ResourceGroup,
    Revision,
    Route,
    RouteState,
    Service,
)
from serving.probes import probe_due_routes
from tests.deployments.factories import make_node
from tests.support.agent import RunningAgent, running_agent
from tests.support.http import LOOPBACK
from tests.support.ports import free_port

pytestmark = pytest.mark.django_db

QUICK = {"interval": 0.2, "max_retries": 1, "max_wait_time": 2.0, "initial_delay": 0.0}
# A server whose /slow answers after 5 s, long after the probes' max_wait_time.
SLOW_SERVER = """
import http.server, sys, time
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/slow":
            time.sleep(5)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""
# A process with a port that never listens: a server still loading its model.
SLEEPER = "import time; time.sleep(600)"


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    root = tmp_path_factory.mktemp("probes")
    (root / "www").mkdir()
    (root / "www" / "index.html").write_text("hello")
    with running_agent(root, args=["--allow-dir", str(root)]) as running:
        yield running


@pytest.fixture
def node(agent: RunningAgent) -> Node:
    return make_node("probed", address=agent.url, credential=agent.credential)


def start_process(agent: RunningAgent, argv: list[str], *, listens: bool = True) -> dict[str, Any]:
    """Start a process through the agent on `${PORT}`; wait until it answers if it listens."""
    response = LOOPBACK.post(
        f"{agent.url}/agent/v1/processes",
        headers=agent.headers(),
        json={
            "argv": argv,
            "env": {"PORT": "${PORT}", "PYTHONUNBUFFERED": "1"},
            "cwd": str(agent.data_dir.parent / "www"),
            "name": "replica",
        },
        timeout=10,
    )
    assert response.status_code == 201, response.text
    process = response.json()
    if listens:
        url = f"{agent.url}/agent/v1/processes/{process['id']}/http/"
        deadline = time.monotonic() + 15
        while _status(url, agent) != 200:
            assert time.monotonic() < deadline, f"process did not listen: {agent.log()}"
            time.sleep(0.05)
    return process


def _status(url: str, agent: RunningAgent) -> int | None:
    try:
        return LOOPBACK.get(url, headers=agent.headers(), timeout=2).status_code
    except httpx.HTTPError:
        return None


def http_server(agent: RunningAgent) -> dict[str, Any]:
    return start_process(
        agent, [sys.executable, "-m", "http.server", "${PORT}", "--bind", "127.0.0.1"]
    )


def stop_process(agent: RunningAgent, process_id: str) -> None:
    """Stop the process through the agent and wait until the agent reports it ended."""
    url = f"{agent.url}/agent/v1/processes/{process_id}"
    LOOPBACK.delete(
        url, headers=agent.headers(), params={"grace": 1}, timeout=15
    ).raise_for_status()
    record = LOOPBACK.get(url, headers=agent.headers(), timeout=5).json()
    assert record["state"] != "running"


def make_route(
    node: Node,
    process: dict[str, Any] | None,
    health_check: dict[str, Any] | None,
    *,
    name: str = "chat",
    started_ago_s: float = 0.0,
) -> Route:
    """Create a service with one PROVISIONING route on the node, running `process`."""
    folder, _ = ModelFolder.objects.get_or_create(name="demo")
    group, _ = ResourceGroup.objects.get_or_create(name="default")
    service = Service.objects.create(name=name)
    spec = {"argv": [], "env": {}, "port": None, "model_name": "demo-8b"}
    spec["health_check"] = None if health_check is None else {"path": "/", **health_check}
    revision = Revision.objects.create(
        service=service,
        number=1,
        model_folder=folder,
        runtime_variant="custom",
        resource_group=group,
        spec=spec,
    )
    Service.objects.filter(pk=service.pk).update(
        latest_revision=revision, running_revision=revision
    )
    return Route.objects.create(
        service=service,
        revision=revision,
        node=node,
        process_id="" if process is None else process["id"],
        port=None if process is None else process["port"],
        started_at=timezone.now() - timedelta(seconds=started_ago_s),
    )


def tick_until(route: Route, done: Callable[[Route], bool], timeout_s: float = 15.0) -> Route:
    """Run the probe tick until the route (re-read) satisfies `done`; return it."""
    deadline = time.monotonic() + timeout_s
    while True:
        probe_due_routes()
        route.refresh_from_db()
        if done(route):
            return route
        assert time.monotonic() < deadline, f"route stayed {route.state}/{route.probe_result}"
        time.sleep(0.02)


def target_health(route: Route) -> str | None:
    """Return the health of the route's target in its service's managed pool, if it has one."""
    pool = Pool.objects.filter(slug=route.service.name, managed=True).first()
    if pool is None:
        return None
    target = pool.targets.filter(name=f"route-{route.pk}").first()
    return None if target is None else target.health


def healthy(route: Route) -> bool:
    return route.state == RouteState.HEALTHY


def failed_once(route: Route) -> bool:
    return route.probe_result == ProbeResult.FAILED


def unhealthy(route: Route) -> bool:
    return route.state == RouteState.UNHEALTHY


# --- Schedule ----------------------------------------------------------------------------------


def test_a_new_route_is_first_probed_one_interval_after_its_initial_delay(node: Node) -> None:
    route = make_route(node, {"id": "p-1", "port": 1}, {**QUICK, "initial_delay": 60.0})

    assert probe_due_routes() == {"probed": 0, "services_synced": 0}

    route.refresh_from_db()
    assert route.next_probe_at == route.started_at + timedelta(seconds=60.2)
    assert (route.state, route.probe_result, route.last_probe_at) == (
        RouteState.PROVISIONING, ProbeResult.UNKNOWN, None,
    )  # fmt: skip


def test_a_route_claimed_by_one_tick_is_not_probed_by_an_overlapping_one(node: Node) -> None:
    route = make_route(node, {"id": "p-1", "port": 1}, QUICK, started_ago_s=5)
    now = timezone.now()

    [claimed] = probes._claim_due(now)

    assert claimed.route.pk == route.pk
    assert probes._claim_due(now) == []


def test_routes_without_a_process_or_past_provisioning_are_not_probed(node: Node) -> None:
    no_process = make_route(node, None, QUICK, name="waiting", started_ago_s=5)
    stopped = make_route(node, {"id": "p-2", "port": 1}, QUICK, name="stopped", started_ago_s=5)
    Route.objects.filter(pk=stopped.pk).update(state=RouteState.TERMINATED)

    assert probe_due_routes() == {"probed": 0, "services_synced": 0}
    assert Route.objects.get(pk=no_process.pk).next_probe_at is None
    assert Route.objects.get(pk=stopped.pk).next_probe_at is None


def test_the_beat_task_runs_one_tick(agent: RunningAgent, node: Node) -> None:
    route = make_route(node, http_server(agent), QUICK, started_ago_s=1)

    assert tasks.probe_routes() == {"probed": 1, "services_synced": 1}

    route.refresh_from_db()
    assert route.state == RouteState.HEALTHY


# --- With a health check ------------------------------------------------------------------------


def test_a_passing_probe_makes_the_route_healthy_and_puts_it_in_its_pool(
    agent: RunningAgent, node: Node
) -> None:
    route = make_route(node, http_server(agent), QUICK)

    route = tick_until(route, healthy)

    assert route.probe_result == ProbeResult.PASSED
    assert route.consecutive_failures == 0
    assert route.ready_at is not None and route.last_probe_at is not None
    assert route.errors == []
    assert target_health(route) == TargetHealth.HEALTHY


def test_a_stopped_process_degrades_the_route_then_makes_it_unhealthy_with_the_error_kept(
    agent: RunningAgent, node: Node
) -> None:
    process = http_server(agent)
    route = tick_until(make_route(node, process, QUICK), healthy)

    stop_process(agent, process["id"])
    route = tick_until(route, failed_once)
    degraded = (route.state, route.consecutive_failures, target_health(route))
    ended = tick_until(route, unhealthy)

    # Degraded: still routable (max_retries 1 allows one failure), ranked after healthy ones.
    assert degraded == (RouteState.HEALTHY, 1, TargetHealth.DEGRADED)
    # The second failure in a row ends it: out of the pool, not probed again, the error kept.
    assert (ended.consecutive_failures, ended.next_probe_at) == (2, None)
    assert target_health(ended) is None
    [error] = ended.errors
    assert error["message"] == (
        "unhealthy after 2 failed probes of / in a row (max_retries 1); the last: "
        f"process not running: process {process['id']} is stopped, not running"
    )
    assert error["at"] and error["exit_code"] is None
    assert ended.status_message == error["message"]


def test_a_degraded_route_whose_probe_passes_again_is_healthy_again(
    agent: RunningAgent, node: Node
) -> None:
    route = make_route(
        node, http_server(agent), {**QUICK, "path": "/flag.txt", "max_retries": 1000}
    )
    flag = agent.data_dir.parent / "www" / "flag.txt"
    flag.write_text("up")
    try:
        route = tick_until(route, healthy)
        flag.unlink()
        route = tick_until(route, failed_once)
        assert target_health(route) == TargetHealth.DEGRADED

        flag.write_text("up")
        route = tick_until(route, lambda r: r.probe_result == ProbeResult.PASSED)
    finally:
        flag.unlink(missing_ok=True)

    assert (route.state, route.consecutive_failures) == (RouteState.HEALTHY, 0)
    assert target_health(route) == TargetHealth.HEALTHY


def test_an_unexpected_status_fails_the_probe(agent: RunningAgent, node: Node) -> None:
    route = make_route(node, http_server(agent), {**QUICK, "expected_status_code": 204})

    route = tick_until(route, unhealthy)

    assert route.errors[-1]["message"].endswith("the last: status 200 != expected 204")
    assert route.ready_at is None


def test_a_probe_that_gets_no_answer_within_max_wait_time_fails(
    agent: RunningAgent, node: Node
) -> None:
    process = start_process(agent, [sys.executable, "-c", SLOW_SERVER, "${PORT}"])
    route = make_route(
        node, process, {**QUICK, "path": "/slow", "max_wait_time": 0.5, "max_retries": 0}
    )

    began = time.monotonic()
    route = tick_until(route, unhealthy)

    assert route.errors[-1]["message"].endswith("the last: no answer within 0.5 s")
    # Bounded by max_wait_time, not by the server's 5 s.
    assert time.monotonic() - began < 4


def test_a_process_whose_port_refuses_fails_its_probes_as_runtime_unavailable(
    agent: RunningAgent, node: Node
) -> None:
    process = start_process(agent, [sys.executable, "-c", SLEEPER], listens=False)
    route = make_route(node, process, QUICK)

    route = tick_until(route, unhealthy)

    assert route.consecutive_failures == 2
    assert "the last: runtime unavailable: process " in route.errors[-1]["message"]


def test_a_node_whose_agent_does_not_answer_fails_the_probe_as_unreachable() -> None:
    node = make_node("gone", address=f"http://127.0.0.1:{free_port()}")
    route = make_route(node, {"id": "p-1", "port": 1}, {**QUICK, "max_retries": 0})

    route = tick_until(route, unhealthy)

    assert route.errors[-1]["message"].endswith("the last: node unreachable: connection refused")


# --- Without a health check: the port -----------------------------------------------------------


def test_without_a_health_check_the_route_is_healthy_once_its_port_answers(
    agent: RunningAgent, node: Node, settings: Any
) -> None:
    settings.NEXUS_SERVING_TICK_S = 0.2
    route = make_route(node, http_server(agent), None)

    route = tick_until(route, healthy)

    assert route.probe_result == ProbeResult.PASSED
    assert target_health(route) == TargetHealth.HEALTHY


def test_without_a_health_check_a_closed_port_keeps_the_route_provisioning(
    agent: RunningAgent, node: Node, settings: Any
) -> None:
    settings.NEXUS_SERVING_TICK_S = 0.2
    process = start_process(agent, [sys.executable, "-c", SLEEPER], listens=False)
    route = make_route(node, process, None)
    probed_at = set()

    def probed_five_times(route: Route) -> bool:
        probed_at.add(route.last_probe_at)
        return len(probed_at - {None}) >= 5

    route = tick_until(route, probed_five_times)

    # A server binds its port once it has loaded its model; until then it is only waited for.
    assert (route.state, route.probe_result, route.consecutive_failures, route.errors) == (
        RouteState.PROVISIONING, ProbeResult.FAILED, 0, [],
    )  # fmt: skip
