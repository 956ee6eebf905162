"""Traffic to a pool target on a node, end to end: the openai SDK -> a live Nexus -> the agent.

The node starts pending; each test moves it where it needs it and waits for the gateway to
notice (it rebuilds its snapshot within about a second of a configuration change).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import httpx
import openai
import pytest

from nexus.models import ApiToken
from nodes import services
from nodes.models import Node, NodeStatus, NodeTrust
from pools.models import Pool, Target
from tests.nodes.fleet import SIM_MODEL, agent_args, serve_simulator
from tests.support.agent import RunningAgent, running_agent
from tests.support.http import LOOPBACK
from tests.support.live import LiveServer, running_nexus
from tests.support.waiting import wait_until

T = TypeVar("T")


@dataclass
class World:
    """A live Nexus whose pool "fleet" has one target, on the agent's node gpu-1."""

    nexus: LiveServer
    agent: RunningAgent
    token: str
    committed: Callable[[Callable[[], object]], object]

    def node(self) -> Node:
        return self.committed(lambda: Node.objects.get(name="gpu-1"))  # type: ignore[return-value]

    def sdk(self) -> openai.OpenAI:
        # The SDK retries 5xx by itself; the tests want to see each answer.
        return openai.OpenAI(base_url=f"{self.nexus.url}/v1", api_key=self.token, max_retries=0)

    def chat(self) -> httpx.Response:
        return LOOPBACK.post(
            f"{self.nexus.url}/v1/chat/completions",
            json={"model": "@pool/fleet", "messages": [{"role": "user", "content": "Hi"}]},
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=10,
        )


@pytest.fixture(scope="module")
def world(committed_db, django_db_blocker, tmp_path_factory) -> Iterator[World]:
    def committed(work: Callable[[], T]) -> T:
        with django_db_blocker.unblock():
            return work()

    tmp = tmp_path_factory.mktemp("traffic")
    with running_agent(tmp, name="gpu-1", args=agent_args()) as agent:
        serve_simulator(agent)

        def setup() -> str:
            node = services.add_node("gpu-1", agent.url, agent.credential)
            pool = Pool.objects.create(name="Fleet", slug="fleet")
            Target.objects.create(pool=pool, name="on-gpu-1", node=node, model_id=SIM_MODEL)
            return ApiToken.issue("fleet")[1]

        token = committed(setup)
        try:
            with running_nexus(tmp, NEXUS_LEDGER="memory") as nexus:
                yield World(nexus, agent, token, committed)
        finally:

            def teardown() -> None:
                Pool.objects.all().delete()
                Node.objects.all().delete()
                ApiToken.objects.all().delete()

            committed(teardown)


def trust(world: World) -> None:
    """Confirm the node (again) if it is not trusted, and wait until the gateway routes to it."""
    node = world.node()
    if node.trust != NodeTrust.TRUSTED:
        world.committed(lambda: services.confirm_node(node, world.agent.fingerprint))
    wait_until(lambda: world.chat().status_code == 200, timeout_s=10, what="no route to gpu-1")


def test_a_pending_nodes_target_gets_no_traffic(world: World) -> None:
    assert world.node().trust == NodeTrust.PENDING

    response = world.chat()

    assert response.status_code == 503
    assert response.json()["error"]["code"] == "no_target_available"
    assert "on-gpu-1 (node gpu-1 is not trusted" in response.json()["error"]["message"]
    assert world.committed(lambda: list(services.usable_nodes())) == []


def test_a_confirmed_node_answers_the_pool_through_the_openai_sdk(world: World) -> None:
    trust(world)

    raw = world.sdk().chat.completions.with_raw_response.create(
        model="@pool/fleet", messages=[{"role": "user", "content": "Hello"}], max_tokens=5
    )
    completion = raw.parse()

    assert raw.headers["x-nexus-target"] == "on-gpu-1"
    assert completion.model == SIM_MODEL
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.completion_tokens == 5


def test_a_node_target_streams_through_the_openai_sdk(world: World) -> None:
    trust(world)

    stream = world.sdk().chat.completions.create(
        model="@pool/fleet",
        messages=[{"role": "user", "content": "Count"}],
        max_tokens=6,
        stream=True,
    )
    deltas = [chunk.choices[0].delta.content for chunk in stream if chunk.choices]
    pieces = [delta for delta in deltas if delta]

    assert len(pieces) == 6


def test_a_crashed_agent_takes_its_target_out_until_it_answers_again(world: World) -> None:
    trust(world)
    node = world.node()

    world.agent.kill()
    node = world.committed(lambda: services.refresh_node(node))  # type: ignore[assignment]

    assert node.status == NodeStatus.OFFLINE
    # Requests sent before the gateway's snapshot catches up may find the agent silent.
    wait_until(
        lambda: "on-gpu-1 (node gpu-1 is offline)" in world.chat().text,
        timeout_s=10,
        what="the gateway never said the node is offline",
    )

    world.agent.start()
    node = world.committed(lambda: services.refresh_node(node))  # type: ignore[assignment]

    assert node.status == NodeStatus.ONLINE
    wait_until(lambda: world.chat().status_code == 200, timeout_s=10, what="gpu-1 not back")
