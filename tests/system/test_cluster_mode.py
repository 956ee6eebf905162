"""Multi-node replicas for real (issue 19, done-when 3): three real agents on loopback, a
simulator service whose one replica is a main and two workers on distinct nodes, placed and
started by the reconciler under a real Celery beat, serving through a real daphne. A worker
killed with SIGKILL makes the main fail; the whole replica is replaced, and once the replacement
is ready no request fails.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from openai import OpenAI
from rest_framework.test import APIClient

from nexus.models import ApiToken
from nodes.models import Node
from pools.models import Pool
from serving import folders
from serving.models import ModelFolder, Route, RoutePart, RouteState, Service, models_root
from tests.nexus.factories import make_user
from tests.nodes.fleet import trusted_node
from tests.support.agent import RunningAgent, running_agent
from tests.support.http import LOOPBACK
from tests.support.live import LiveServer, running_nexus
from tests.support.waiting import wait_until
from tests.support.worker import RunningWorker, running_worker

SERVICE = "sim-cluster"
NODES = ("cluster-a", "cluster-b", "cluster-c")
TICK_S = 0.5
# The simulator runtime's first probe is due 1 + 10 s after its start.
READY_TIMEOUT_S = 60.0
REQUESTS = 12


@dataclass
class Cluster:
    nexus: LiveServer
    worker: RunningWorker
    agents: dict[str, RunningAgent]
    token: str
    owner: APIClient

    def why(self) -> str:
        lines = []
        for route in Route.objects.filter(service__name=SERVICE).order_by("pk"):
            parts = [(p.rank, p.node.name, p.process_id) for p in route.parts.all()]
            lines.append(
                f"  route {route.pk} {route.state} on {route.node and route.node.name} "
                f"parts={parts} {route.status_message!r} {route.errors[-1:]}"
            )
        service = Service.objects.filter(name=SERVICE).first()
        status = service.status_message if service else "(no service)"
        return f"{status}\n" + "\n".join(lines) + f"\n--- worker\n{self.worker.log()[-3000:]}"

    def ready_route(self) -> Route | None:
        route = Route.objects.filter(
            service__name=SERVICE, state=RouteState.HEALTHY, target__isnull=False
        ).first()
        return route

    def chat(self, count: int) -> list[str]:
        """Send `count` chats through `@pool/<service>`; return the failures' descriptions."""
        client = OpenAI(
            base_url=f"{self.nexus.url}/v1", api_key=self.token, max_retries=0, timeout=10
        )
        failures = []
        for number in range(count):
            try:
                answer = client.chat.completions.create(
                    model=f"@pool/{SERVICE}",
                    messages=[{"role": "user", "content": f"Hello {number}"}],
                    max_tokens=3,
                    stream=number % 2 == 1,
                )
                if number % 2:
                    text = "".join(c.choices[0].delta.content or "" for c in answer if c.choices)
                else:
                    text = answer.choices[0].message.content or ""
                if not text:
                    failures.append(f"{number}: an empty answer")
            except Exception as error:  # whatever went wrong, the client saw a failure
                failures.append(f"{number}: {type(error).__name__}: {error}")
        return failures

    def process(self, node: Node, process_id: str) -> dict[str, Any]:
        agent = self.agents[node.name]
        response = LOOPBACK.get(
            f"{agent.url}/agent/v1/processes/{process_id}", headers=agent.headers(), timeout=5
        )
        return response.json()


@pytest.fixture(scope="module")
def cluster(committed_db, django_db_blocker, tmp_path_factory) -> Iterator[Cluster]:
    tmp_path = tmp_path_factory.mktemp("cluster-mode")
    suffix = uuid.uuid4().hex[:8]
    folder_name = f"cluster-{suffix}"
    with ExitStack() as stack:
        with django_db_blocker.unblock():
            user = make_user(f"owner-{suffix}", staff=True)
            owner = APIClient()
            owner.force_login(user)
        stack.callback(_remove_rows, django_db_blocker, user.pk, folder_name)
        models_root().mkdir(parents=True, exist_ok=True)
        agents = {
            name: stack.enter_context(
                running_agent(tmp_path, name=name, args=["--allow-dir", str(models_root())])
            )
            for name in NODES
        }
        with django_db_blocker.unblock():
            for name, agent in agents.items():
                trusted_node(name, agent)
        nexus = stack.enter_context(running_nexus(tmp_path, NEXUS_LEDGER="memory"))
        worker = stack.enter_context(
            running_worker(tmp_path, beat=True, NEXUS_SERVING_TICK_S=str(TICK_S))
        )
        with django_db_blocker.unblock():
            created = owner.post("/api/v1/model-folders/", {"name": folder_name}, format="json")
            assert created.status_code == 201, created.content
            declared = owner.post(
                "/api/v1/services/",
                {
                    "name": SERVICE,
                    "model_folder": folder_name,
                    "runtime_variant": "simulator",
                    "cluster_size": 3,
                    "desired_replicas": 1,
                },
                format="json",
            )
            assert declared.status_code == 201, declared.content
            expires_at = (timezone.now() + timedelta(hours=1)).isoformat()
            token = owner.post(
                f"/api/v1/services/{SERVICE}/tokens/",
                {"name": "cluster client", "expires_at": expires_at},
                format="json",
            )
            assert token.status_code == 201, token.content
            world = Cluster(nexus, worker, agents, token.json()["token"], owner)
            wait_until(world.ready_route, timeout_s=READY_TIMEOUT_S, what=world.why)
        yield world


def _remove_rows(blocker: Any, user_id: int, folder_name: str) -> None:
    with blocker.unblock():
        Service.objects.filter(name=SERVICE).delete()
        Pool.objects.filter(slug=SERVICE).delete()
        Node.objects.filter(name__in=NODES).delete()
        for folder in ModelFolder.objects.filter(name=folder_name):
            folders.delete_folder(folder)
        ApiToken.objects.filter(created_by_id=user_id).delete()
        User.objects.filter(pk=user_id).delete()


@pytest.fixture(autouse=True)
def database(django_db_blocker: Any) -> Iterator[None]:
    with django_db_blocker.unblock():
        yield


def test_a_killed_worker_replaces_the_whole_replica_and_traffic_returns(cluster: Cluster) -> None:
    # Given a ready replica: its main and two workers on three distinct nodes, serving
    first = cluster.ready_route()
    assert first is not None
    parts = list(RoutePart.objects.filter(route=first).select_related("node").order_by("rank"))
    assert [part.rank for part in parts] == [1, 2]
    assert sorted([first.node.name, *(part.node.name for part in parts)]) == sorted(NODES)
    main = cluster.process(first.node, first.process_id)
    assert "--nnodes" in main["argv"] and main["dist_port"] is not None
    workers = [cluster.process(part.node, part.process_id) for part in parts]
    assert [w["argv"][-1] for w in workers] == [f"127.0.0.1:{main['dist_port']}"] * 2
    assert [w["argv"][w["argv"].index("--node-rank") + 1] for w in workers] == ["1", "2"]
    assert cluster.chat(REQUESTS) == []
    # The service page and the API show the parts
    page = cluster.owner.get(f"/serving/services/{SERVICE}/").content.decode()
    for part in parts:
        assert f'worker {part.rank}: <a href="/nodes/{part.node.name}/">' in page, page
    [shown] = [r for r in cluster.owner.get(f"/api/v1/services/{SERVICE}/").json()["routes"]
               if r["id"] == first.pk]  # fmt: skip
    assert [(p["rank"], p["node"]) for p in shown["parts"]] == [
        (part.rank, part.node.name) for part in parts
    ]

    # When worker rank 2 is killed
    killed_at = time.time()
    os.kill(workers[1]["pid"], signal.SIGKILL)

    # Then the replica fails as a whole, saying which part ended, and every part is stopped
    def ended() -> Route | None:
        route = Route.objects.get(pk=first.pk)
        return route if route.state != RouteState.HEALTHY else None

    failed = wait_until(ended, timeout_s=15, what=cluster.why)
    assert failed.state == RouteState.UNHEALTHY
    killed = [part.node.name for part in parts if part.rank == 2][0]
    message = failed.errors[-1]["message"]
    # The main (and worker 1) leave with the killed worker; whichever the tick saw, it is named.
    assert (
        f"worker rank 2 on node {killed}: the process was killed by signal 9" in message
        or message == "the process exited with code 1"
    ), failed.errors

    def replaced() -> Route | None:
        route = cluster.ready_route()
        return route if route is not None and route.pk != first.pk else None

    replacement = wait_until(replaced, timeout_s=READY_TIMEOUT_S, what=cluster.why)
    took = time.time() - killed_at
    old = [cluster.process(first.node, first.process_id)]
    old += [cluster.process(part.node, part.process_id) for part in parts]
    assert {process["state"] for process in old} <= {"stopped", "exited"}, old
    new_parts = RoutePart.objects.filter(route=replacement).select_related("node")
    assert sorted([replacement.node.name, *(p.node.name for p in new_parts)]) == sorted(NODES)
    assert replacement.restart_count == 1

    # And once the replacement is ready (the gateway learns of it within a second), nothing fails
    time.sleep(1.5)
    assert cluster.chat(REQUESTS) == []
    assert took < READY_TIMEOUT_S
