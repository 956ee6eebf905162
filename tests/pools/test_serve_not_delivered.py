"""A request the node's agent says never reached a replica moves on, whatever its method.

A live daphne Nexus in front of a real agent: a service's two replicas are echo processes on
it, reached through the agent's process proxy as pool_sync builds their URLs. One is stopped
while its target stays in the pool, so the agent answers 503 `process_not_running` with
`X-Nexus-Not-Delivered: 1` for it. A hosted (non-node) target sending the same header is not
believed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from nexus.models import ApiToken
from pools.models import Pool, Strategy, Target
from serving.models import Service
from tests.deployments.factories import make_node
from tests.nodes.agent.test_process_proxy import ECHO
from tests.nodes.agent.test_processes_api import python, wait_for_log
from tests.pools.test_serve_gateway import make_service, service_token
from tests.serving.test_probes import stop_process
from tests.support.agent import RunningAgent, running_agent
from tests.support.http import LOOPBACK
from tests.support.live import LiveServer, running_nexus

POSTS = 6


@dataclass
class World:
    nexus: LiveServer
    agent: RunningAgent
    stopped_id: str  # the stopped replica's process
    replicas_token: str  # may call "replicas": two node-backed replicas, one stopped
    hosted_token: str  # may call "hosted": two plain targets that claim "not delivered"
    hosted_hits: list[int]  # requests each hosted target received, by target

    def post(self, path: str, token: str) -> httpx.Response:
        return LOOPBACK.post(
            f"{self.nexus.url}/serve/{path}",
            headers={"Authorization": f"Bearer {token}"},
            content=b'{"order": 1}',
            timeout=10,
        )


class _Liar(BaseHTTPRequestHandler):
    """Answer 503 with the agent's "not delivered" header, counting what arrived."""

    protocol_version = "HTTP/1.1"
    hits: list[int]
    index: int

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.hits[self.index] += 1
        body = b'{"error": "busy"}'
        self.send_response(503)
        self.send_header("X-Nexus-Not-Delivered", "1")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        """Keep test output quiet."""


def _liars(hits: list[int]) -> list[ThreadingHTTPServer]:
    servers = []
    for index in range(len(hits)):
        handler = type("Liar", (_Liar,), {"hits": hits, "index": index})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    return servers


def _start_echo(agent: RunningAgent) -> str:
    with httpx.Client(base_url=agent.url, headers=agent.headers(), timeout=10) as client:
        response = client.post("/agent/v1/processes", json={"argv": [*python(ECHO), "${PORT}"]})
        assert response.status_code == 201, response.text
        process_id: str = response.json()["id"]
        wait_for_log(client, process_id, "ready")
    return process_id


@pytest.fixture(scope="module")
def world(committed_db, django_db_blocker, tmp_path_factory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("not-delivered")
    hits = [0, 0]
    liars = _liars(hits)
    try:
        with running_agent(tmp) as agent:
            stopped, running = _start_echo(agent), _start_echo(agent)
            stop_process(agent, stopped)
            with django_db_blocker.unblock():
                node = make_node("replicas-node", address=agent.url, credential=agent.credential)
                replicas = make_service("replicas", desired=2)
                # Round robin, so the stopped replica certainly gets its turns.
                Pool.objects.filter(pk=replicas.pool_id).update(strategy=Strategy.ROUND_ROBIN)
                for number, process_id in enumerate((stopped, running), start=1):
                    Target.objects.create(
                        pool=replicas.pool,
                        node=node,
                        name=f"replicas-{number}",
                        base_url=f"{agent.url}/agent/v1/processes/{process_id}/http",
                        model_id="demo-8b",
                    )
                make_service("hosted", *(f"http://127.0.0.1:{s.server_address[1]}" for s in liars))
                replicas_token = service_token("replicas")
                hosted_token = service_token("hosted")
            try:
                with running_nexus(tmp, NEXUS_LEDGER="memory") as nexus:
                    yield World(nexus, agent, stopped, replicas_token, hosted_token, hits)
            finally:
                with django_db_blocker.unblock():
                    Service.objects.all().delete()
                    Pool.objects.all().delete()
                    ApiToken.objects.filter(name__in=["replicas caller", "hosted caller"]).delete()
                    node.delete()
    finally:
        for server in liars:
            server.shutdown()
            server.server_close()


def test_every_post_to_a_service_with_a_stopped_replica_succeeds_on_the_other(
    world: World,
) -> None:
    responses = [world.post("replicas/orders", world.replicas_token) for _ in range(POSTS)]

    assert [r.status_code for r in responses] == [200] * POSTS
    assert {r.json()["method"] for r in responses} == {"POST"}
    assert {r.headers["x-nexus-target"] for r in responses} == {"replicas-2"}
    # Those whose turn fell on the stopped replica moved on.
    assert "2" in {r.headers["x-nexus-attempts"] for r in responses}


def test_a_hosted_target_cannot_make_a_post_retry_with_the_agents_header(world: World) -> None:
    response = world.post("hosted/orders", world.hosted_token)

    assert response.status_code == 503
    assert response.headers["x-nexus-attempts"] == "1"
    assert response.json() == {"error": "busy"}  # the target's own answer, relayed
    assert sum(world.hosted_hits) == 1
