"""Autoscaling end to end on real processes: rules scale a simulator-backed service out under a
bounded load and back in after it, with nothing called by hand that Nexus does itself.

A live daphne Nexus (its gateway's /serve), a real Celery worker whose beat runs the serving
tick, the health probes and `serving.tasks.autoscale` every INTERVAL_S, one real agent added and
trusted as a node, and — where Debian's `prometheus` is installed — a real Prometheus server on a
loopback port, scraping every ready replica's /metrics (a file_sd list this module keeps from
the ready routes, as an operator's service discovery would) with the label
nexus_service="<service>" that the presets' queries select.

Each replica is the simulator with one request generating at a time (`--concurrency 1`) and
100 ms per token, so a handful of concurrent clients leave requests waiting in it:
`vllm:num_requests_waiting` rises with the load and falls to 0 after it.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from nodes.models import Node
from pools.models import Pool, RoutingRecord
from serving import folders, metrics
from serving.autoscaling import MetricSource, Reading
from serving.models import ModelFolder, Route, RouteState, ScaleEvent, Service, models_root
from tests.nexus.factories import make_user
from tests.nodes.fleet import trusted_node
from tests.support.agent import running_agent
from tests.support.http import LOOPBACK
from tests.support.live import LiveServer, running_nexus
from tests.support.prometheus import PROMETHEUS, SKIP_REASON, Prometheus, running_prometheus
from tests.support.waiting import wait_until
from tests.support.worker import RunningWorker, running_worker

log = logging.getLogger(__name__)

# Timing-bound on a shared CPU: it runs alone, in make test's serial pass.
pytestmark = pytest.mark.serial

INTERVAL_S = 2.0  # NEXUS_AUTOSCALING_INTERVAL_S
WINDOW_S = 10
COOLDOWN_S = 6
# A cycle may run late on a busy worker; every bound in cycles gets this many on top.
SLACK_CYCLES = 4
NODE = "as-node"
CLIENTS = 6  # concurrent clients of the load run: up to 5 requests wait in one replica
MAX_LOAD_S = 60.0
IDLE_S = 10  # scale to zero after this long without requests (the shortest allowed)
DEFINITION = """\
models:
  - name: "{name}"
    model_path: "/models"
    service:
      start_command: ["python", "-m", "serving.runtimes.simulator", "--host", "127.0.0.1",
                      "--port", "${{PORT}}", "--model", "{name}", "--ttft-ms", "0",
                      "--tpot-ms", "100", "--concurrency", "1"]
      port: 8000
      health_check:
        path: /health
        interval: 0.5
        max_retries: 10
        max_wait_time: 1.0
        initial_delay: 0
"""


@dataclass
class World:
    """The live stack, the owner's API client, and the service names this module made."""

    nexus: LiveServer
    worker: RunningWorker
    owner: APIClient
    suffix: str
    prometheus: Prometheus | None
    services: list[str] = field(default_factory=list)

    def create_service(self, base: str) -> str:
        """Upload a simulator model folder and declare a public 1-replica service of it."""
        name = f"{base}-{self.suffix}"
        created = self.owner.post("/api/v1/model-folders/", {"name": name}, format="json")
        assert created.status_code == 201, created.content
        put = self.owner.put(
            f"/api/v1/model-folders/{name}/files/model-definition.yaml",
            data=DEFINITION.format(name=name).encode(),
            content_type="application/octet-stream",
        )
        assert put.status_code == 200, put.content
        declared = self.owner.post(
            "/api/v1/services/",
            {
                "name": name,
                "model_folder": name,
                "runtime_variant": "custom",
                "desired_replicas": 1,
                "open_to_public": True,
                "resource_slots": {"cpu": 0.1, "mem": "64mb"},
            },
            format="json",
        )
        assert declared.status_code == 201, declared.content
        self.services.append(name)
        return name

    def healthy(self, name: str) -> list[Route]:
        return list(
            Route.objects.filter(
                service__name=name, state=RouteState.HEALTHY, target__isnull=False
            ).order_by("pk")
        )

    def settled(self, name: str, count: int) -> bool:
        """Say whether the service wants `count` replicas and exactly that many serve."""
        service = Service.objects.get(name=name)
        live = Route.objects.filter(
            service=service,
            state__in=[RouteState.PROVISIONING, RouteState.HEALTHY, RouteState.TERMINATING],
        ).count()
        return service.desired_replicas == count and len(self.healthy(name)) == count == live

    def desired(self, name: str) -> int:
        return Service.objects.get(name=name).desired_replicas

    def add_rule(self, name: str, rule: dict[str, Any]) -> dict[str, Any]:
        created = self.owner.post(
            f"/api/v1/services/{name}/autoscaling-rules/", rule, format="json"
        )
        assert created.status_code == 201, created.content
        return created.json()

    def events(self, name: str) -> list[dict[str, Any]]:
        answer = self.owner.get(f"/api/v1/services/{name}/scale-events/")
        assert answer.status_code == 200, answer.content
        return list(reversed(answer.json()["results"]))  # oldest first

    def why(self, name: str) -> str:
        events = "\n".join(
            f"  {e.created_at:%H:%M:%S} {e.outcome} {e.value} {e.reason}"
            for e in ScaleEvent.objects.filter(service__name=name).order_by("created_at")
        )
        routes = "\n".join(
            f"  route {r.pk} {r.state} port={r.port} {r.status_message!r}"
            for r in Route.objects.filter(service__name=name).order_by("pk")
        )
        return (
            f"\n{name} wants {self.desired(name)}\nevents:\n{events}\nroutes:\n{routes}"
            f"\n--- worker\n{self.worker.log()[-4000:]}"
        )

    def keep_scraping(self, stop: threading.Event) -> None:
        """Keep Prometheus's file_sd list at the ready replicas, as service discovery would."""
        assert self.prometheus is not None
        while not stop.wait(0.5):
            ports: dict[str, list[int]] = {name: [] for name in self.services}
            for route in Route.objects.filter(
                service__name__in=self.services, state=RouteState.HEALTHY, port__isnull=False
            ).select_related("service"):
                ports[route.service.name].append(int(route.port or 0))
            self.prometheus.scrape(ports)


class Load:
    """A bounded load run: CLIENTS threads sending streamed chat completions one after another."""

    def __init__(self, url: str, model: str) -> None:
        self.url, self.model = url, model
        self.sent = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, name=f"load-{i}", daemon=True)
            for i in range(CLIENTS)
        ]

    def __enter__(self) -> Load:
        self.started = time.time()
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        self.stopped = time.time()

    def _at(self) -> str:
        """When a failure came, for its message: seconds into the load and the clock time, to
        set beside the scaling events and the servers' logs."""
        now = time.time()
        return f"+{now - self.started:.2f} s ({time.strftime('%H:%M:%S', time.localtime(now))})"

    def _run(self) -> None:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": "Say hello"}],
            "max_tokens": 10,
            "stream": True,
        }
        deadline = time.monotonic() + MAX_LOAD_S
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set() and time.monotonic() < deadline:
                try:
                    with client.stream("POST", self.url, json=body) as response:
                        text = response.read().decode(errors="replace")
                    if response.status_code != 200 or "[DONE]" not in text:
                        self.failures.append(f"{self._at()} {response.status_code} {text[:200]}")
                except httpx.HTTPError as error:
                    self.failures.append(f"{self._at()} {type(error).__name__}: {error}")
                self.sent += 1


@pytest.fixture(scope="module")
def world(committed_db: Any, django_db_blocker: Any, tmp_path_factory: Any) -> Iterator[World]:
    tmp_path = tmp_path_factory.mktemp("autoscaling")
    suffix = uuid.uuid4().hex[:6]
    with ExitStack() as stack:
        with django_db_blocker.unblock():
            user = make_user(f"as-owner-{suffix}", staff=True)
            owner = APIClient()
            owner.force_login(user)
        world_services: list[str] = []
        stack.callback(_remove_rows, django_db_blocker, user.pk, world_services)
        models_root().mkdir(parents=True, exist_ok=True)
        agent = stack.enter_context(
            running_agent(
                tmp_path,
                name=NODE,
                args=["--allow-dir", str(models_root())],
                env={"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"},
            )
        )
        with django_db_blocker.unblock():
            trusted_node(NODE, agent)
        prometheus = stack.enter_context(running_prometheus(tmp_path)) if PROMETHEUS else None
        env = {"NEXUS_PROMETHEUS_URL": prometheus.url} if prometheus else {}
        nexus = stack.enter_context(running_nexus(tmp_path, NEXUS_LEDGER="memory"))
        worker = stack.enter_context(
            running_worker(
                tmp_path,
                beat=True,
                NEXUS_SERVING_TICK_S="0.5",
                NEXUS_NODE_REFRESH_S="1",
                NEXUS_AUTOSCALING_INTERVAL_S=str(INTERVAL_S),
                **env,
            )
        )
        world = World(nexus, worker, owner, suffix, prometheus, world_services)
        if prometheus is not None:
            stop = threading.Event()
            scraper = threading.Thread(target=_unblocked, args=(django_db_blocker, world, stop))
            scraper.start()
            stack.callback(scraper.join, 10)
            stack.callback(stop.set)
        with django_db_blocker.unblock():
            yield world


def _unblocked(blocker: Any, world: World, stop: threading.Event) -> None:
    with blocker.unblock():
        world.keep_scraping(stop)


def _remove_rows(blocker: Any, user_id: int, names: list[str]) -> None:
    with blocker.unblock():
        Service.objects.filter(name__in=names).delete()
        Pool.objects.filter(slug__in=names, managed=True).delete()
        Node.objects.filter(name=NODE).delete()
        for folder in ModelFolder.objects.filter(name__in=names):
            folders.delete_folder(folder)
        User.objects.filter(pk=user_id).delete()


def wait_desired(world: World, name: str, count: int, timeout_s: float) -> float:
    """Wait until the service wants `count` replicas; return when that was seen (epoch s)."""
    wait_until(
        lambda: world.desired(name) == count, timeout_s=timeout_s, what=lambda: world.why(name)
    )
    return time.time()


def test_a_waiting_requests_rule_scales_out_under_load_and_back_in_after_it(world: World) -> None:
    name = world.create_service("as-queue")
    wait_until(lambda: world.settled(name, 1), timeout_s=40, what=lambda: world.why(name))
    world.add_rule(
        name,
        {
            "metric_source": "inference_framework",
            "metric_name": "vllm:num_requests_waiting",
            "condition": "scale_in_out",
            "min_threshold": 0.5,
            "max_threshold": 2,
            "step_size": 1,
            "cooldown_s": COOLDOWN_S,
            "min_replicas": 1,
            "max_replicas": 2,
            "window_s": WINDOW_S,
        },
    )

    with Load(f"{world.nexus.url}/serve/{name}/v1/chat/completions", name) as load:
        scaled_out_at = wait_desired(world, name, 2, timeout_s=SLACK_CYCLES * 4 * INTERVAL_S)
        wait_until(lambda: world.settled(name, 2), timeout_s=40, what=lambda: world.why(name))
        # Both replicas take the load for a while before it ends.
        time.sleep(2 * INTERVAL_S)
    scaled_in_at = wait_desired(world, name, 1, timeout_s=90)
    wait_until(lambda: world.settled(name, 1), timeout_s=60, what=lambda: world.why(name))

    out_cycles = (scaled_out_at - load.started) / INTERVAL_S
    in_cycles = (scaled_in_at - load.stopped) / INTERVAL_S
    log.info("scaled out after %.1f cycles, in after %.1f cycles", out_cycles, in_cycles)
    # The first sample under load is far above 2: the next cycle or two scale out.
    assert out_cycles <= 2 + SLACK_CYCLES, world.why(name)
    # Back in once the window holds (nearly) only idle samples and the cooldown is over.
    assert in_cycles <= (WINDOW_S + COOLDOWN_S) / INTERVAL_S + SLACK_CYCLES, world.why(name)
    assert load.failures == [], (len(load.failures), load.failures[:3], load.failures[-2:])
    assert load.sent > CLIENTS
    scalings = [e for e in world.events(name) if e["outcome"] in ("scaled_out", "scaled_in")]
    assert [(e["outcome"], e["replicas_before"], e["replicas_after"]) for e in scalings] == [
        ("scaled_out", 1, 2),
        ("scaled_in", 2, 1),
    ], world.why(name)
    out, back = scalings
    assert out["value"] > 2 and back["value"] < 0.5, scalings
    assert (out["window_s"], out["aggregation"]) == (WINDOW_S, "avg")
    assert out["reason"].startswith(f"{out['value']:g} > 2: 1 → 2"), out


@pytest.mark.skipif(
    PROMETHEUS is None,
    reason=SKIP_REASON,
)
def test_a_prometheus_rule_against_a_real_server_scales_the_service(
    world: World, settings: Any
) -> None:
    assert world.prometheus is not None
    settings.NEXUS_PROMETHEUS_URL = world.prometheus.url  # the preview runs in this process
    name = world.create_service("as-prom")
    wait_until(lambda: world.settled(name, 1), timeout_s=40, what=lambda: world.why(name))
    rules = f"/api/v1/services/{name}/autoscaling-rules/"

    def preview(**asked: Any) -> dict[str, Any]:
        answer = world.owner.post(f"{rules}preview/", {"window_s": 10, **asked}, format="json")
        assert answer.status_code == 200, answer.content
        return answer.json()

    idle = wait_until(
        lambda: (p := preview(prometheus_preset="vllm-requests-waiting"))["series"] and p,
        timeout_s=30,
        what="Prometheus never returned the replica's series",
    )
    empty = preview(prometheus_query='vllm:num_requests_waiting{nexus_service="nobody"}')
    world.add_rule(
        name,
        {
            "metric_source": "prometheus",
            "prometheus_preset": "vllm-requests-waiting",
            "condition": "scale_out",
            "max_threshold": 2,
            "min_replicas": 1,
            "max_replicas": 2,
            "window_s": WINDOW_S,
        },
    )

    with Load(f"{world.nexus.url}/serve/{name}/v1/chat/completions", name) as load:
        scaled_at = wait_desired(world, name, 2, timeout_s=60)
        busy = preview(prometheus_preset="vllm-requests-waiting")
    wait_until(lambda: world.settled(name, 2), timeout_s=40, what=lambda: world.why(name))

    assert idle["query"] == (
        f'avg_over_time(vllm:num_requests_waiting{{nexus_service="{name}"}}[10s])'
    )
    assert (idle["series"], idle["value"], idle["text"]) == (1, 0.0, "0"), idle
    assert empty["series"] == 0 and empty["text"] == "No data available", empty
    assert busy["value"] is not None and busy["value"] > 0, busy
    log.info("Prometheus rule scaled out %.1f s after the load began", scaled_at - load.started)
    scaled = [e for e in world.events(name) if e["outcome"] == "scaled_out"]
    assert len(scaled) == 1, world.why(name)
    assert scaled[0]["metric_source"] == "prometheus"
    assert scaled[0]["value"] > 2 and scaled[0]["series"] >= 1, scaled
    assert load.failures == [], (len(load.failures), load.failures[:3], load.failures[-2:])


def test_kernel_metrics_of_each_replica_come_from_its_agent(world: World) -> None:
    name = world.create_service("as-kernel")
    wait_until(lambda: world.settled(name, 1), timeout_s=40, what=lambda: world.why(name))
    # A rule that never fires: it makes the cycle keep the replica's Kernel samples.
    world.add_rule(
        name,
        {
            "metric_source": "kernel",
            "metric_name": "mem",
            "condition": "scale_out",
            "max_threshold": 1e15,
            "min_replicas": 1,
            "max_replicas": 2,
            "window_s": WINDOW_S,
        },
    )
    route = world.healthy(name)[0]

    def reading(metric: str) -> Reading:
        return metrics.replica_reading(
            MetricSource.KERNEL,
            [route.pk],
            metric,
            window_s=WINDOW_S,
            aggregation="avg",
            now=time.time(),
        )

    memory = wait_until(
        lambda: (r := reading("mem")).value and r,
        timeout_s=6 * INTERVAL_S,
        what=lambda: f"no mem sample: {reading('mem')}{world.why(name)}",
    )
    cpu = reading("cpu_util")

    # The simulator's resident memory: tens of MiB, not zero and not the machine's.
    assert 1 << 20 < memory.value < 4 << 30, memory
    assert cpu.value is not None and cpu.value >= 0, cpu
    assert reading("net_rx").value is not None
    # Nothing scaled (a "no data" event before the first sample is fine).
    scaled = ScaleEvent.objects.filter(service__name=name, outcome__startswith="scaled")
    assert not scaled.exists(), world.why(name)


def test_an_idle_service_scales_to_zero_and_the_next_request_wakes_it(world: World) -> None:
    name = world.create_service("as-zero")
    wait_until(lambda: world.settled(name, 1), timeout_s=40, what=lambda: world.why(name))
    patched_at = time.time()
    patched = world.owner.patch(
        f"/api/v1/services/{name}/", {"scale_to_zero_after_s": IDLE_S}, format="json"
    )
    assert patched.status_code == 200, patched.content

    # No request comes: after its idle period (counted from this change) it goes to 0.
    slept_at = wait_desired(world, name, 0, timeout_s=IDLE_S + SLACK_CYCLES * INTERVAL_S)
    # Its replica drains (at most the reconciler's 30 s grace when no gateway has routed yet).
    wait_until(lambda: world.settled(name, 0), timeout_s=45, what=lambda: world.why(name))
    sent_at = time.time()
    answer = LOOPBACK.post(
        f"{world.nexus.url}/serve/{name}/v1/chat/completions",
        json={"model": name, "messages": [{"role": "user", "content": "wake up"}], "max_tokens": 2},
        timeout=60,
    )
    answered_s = time.time() - sent_at

    assert answer.status_code == 200, (answer.text, world.why(name))
    assert answer.json()["choices"][0]["message"]["content"], answer.text
    assert world.desired(name) == 1
    record = wait_until(
        lambda: RoutingRecord.objects.filter(pool__slug=name).order_by("-created_at").first(),
        timeout_s=10,
        what="no history row for the woken request",
    )
    log.info(
        "slept %.1f s after the change, woke and answered in %.1f s (queue wait %.0f ms)",
        slept_at - patched_at,
        answered_s,
        record.queue_wait_ms,
    )
    # Held, not failed: the wake wait is the history row's queue wait.
    assert record.outcome == "ok"
    assert 500 < record.queue_wait_ms <= answered_s * 1000 + 1, record.queue_wait_ms
    events = [(e["outcome"], e["replicas_before"], e["replicas_after"]) for e in world.events(name)]
    assert events == [("scaled_in", 1, 0), ("scaled_out", 0, 1)], world.why(name)
    assert world.events(name)[0]["reason"].endswith("scaled to zero")
    assert world.events(name)[1]["reason"] == "1 request waiting: woken"
