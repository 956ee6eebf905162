"""Pool targets on nodes: named by node, checked against its inventory, routed only when usable."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rest_framework.test import APIClient

from nodes import services
from nodes.models import Node, NodeStatus
from pools.gateway.snapshot import load_snapshot
from pools.models import Target
from tests.nexus.factories import make_pool
from tests.nodes.fleet import SIM_MODEL, serve_simulator, stop_process, trusted_node
from tests.support.agent import RunningAgent

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def serving_agent(agent_one: RunningAgent) -> Iterator[RunningAgent]:
    """The first agent with the simulator model running."""
    process_id = serve_simulator(agent_one)
    yield agent_one
    stop_process(agent_one, process_id)


def node_target(node: Node, name: str = "on-node", **fields: object) -> Target:
    """Create a target on the node directly (the API checks the inventory; this does not)."""
    pool = fields.pop("pool", None) or make_pool("chat")
    return Target.objects.create(pool=pool, name=name, node=node, model_id=SIM_MODEL, **fields)


def test_an_owner_puts_a_target_on_a_node_by_name(
    owner: APIClient, serving_agent: RunningAgent
) -> None:
    trusted_node("gpu-1", serving_agent)
    make_pool("chat")

    response = owner.post(
        "/api/v1/targets/",
        {"pool": "chat", "name": "gpu-1-sim", "node": "gpu-1", "model_id": SIM_MODEL},
        format="json",
    )

    assert response.status_code == 201, response.json()
    assert response.json()["node"] == "gpu-1"
    assert response.json()["base_url"] == f"{serving_agent.url}/v1"
    assert response.json()["has_credential"] is False
    assert Target.objects.get().node.name == "gpu-1"


def test_a_target_needs_a_model_of_the_nodes_inventory(
    owner: APIClient, serving_agent: RunningAgent
) -> None:
    trusted_node("gpu-1", serving_agent)
    make_pool("chat")

    response = owner.post(
        "/api/v1/targets/",
        {"pool": "chat", "name": "x", "node": "gpu-1", "model_id": "llama-70b"},
        format="json",
    )

    assert response.status_code == 400
    assert response.json() == {
        "model_id": [f"Node gpu-1 does not serve llama-70b (its models: {SIM_MODEL})."]
    }


def test_a_pending_node_has_no_known_models_yet(
    owner: APIClient, serving_agent: RunningAgent
) -> None:
    services.add_node("gpu-1", serving_agent.url, serving_agent.credential)
    make_pool("chat")

    response = owner.post(
        "/api/v1/targets/",
        {"pool": "chat", "name": "x", "node": "gpu-1", "model_id": SIM_MODEL},
        format="json",
    )

    assert response.status_code == 400
    assert "Node gpu-1 is not trusted yet" in response.json()["model_id"][0]


def test_a_node_target_takes_no_credential_of_its_own(
    owner: APIClient, serving_agent: RunningAgent
) -> None:
    trusted_node("gpu-1", serving_agent)
    make_pool("chat")

    response = owner.post(
        "/api/v1/targets/",
        {
            "pool": "chat",
            "name": "x",
            "node": "gpu-1",
            "model_id": SIM_MODEL,
            "credential": "sk-other",
        },
        format="json",
    )

    assert response.status_code == 400
    assert list(response.json()) == ["credential"]


def test_a_target_without_a_node_still_needs_a_base_url(owner: APIClient) -> None:
    make_pool("chat")

    response = owner.post(
        "/api/v1/targets/", {"pool": "chat", "name": "x", "model_id": "m"}, format="json"
    )

    assert response.status_code == 400
    assert response.json() == {"base_url": ["Give a base URL, or a node."]}


def test_the_snapshot_routes_a_usable_node_target_through_its_agent(
    serving_agent: RunningAgent,
) -> None:
    node = trusted_node("gpu-1", serving_agent)
    node_target(node)

    entry = load_snapshot().pools["chat"].targets[0]

    assert entry.enabled is True
    assert entry.unavailable == ""
    assert entry.base_url == f"{serving_agent.url}/v1"
    assert str(entry.urls["chat"]) == f"{serving_agent.url}/v1/chat/completions"
    assert entry.authorization == f"Bearer {serving_agent.credential}"


@pytest.mark.parametrize(
    ("trust", "status", "reason"),
    [
        ("pending", "online", "node gpu-1 is not trusted (pending confirmation)"),
        ("rejected", "online", "node gpu-1 is not trusted (rejected)"),
        ("trusted", "offline", "node gpu-1 is offline"),
        ("trusted", "unknown", "node gpu-1 has not answered a refresh yet"),
    ],
)
def test_a_node_target_is_out_while_its_node_is_not_usable(
    trust: str, status: str, reason: str
) -> None:
    node = Node.objects.create(name="gpu-1", address="http://10.0.0.5:7100", trust=trust)
    Node.objects.filter(pk=node.pk).update(status=status)
    node_target(node)

    entry = load_snapshot().pools["chat"].targets[0]

    assert entry.enabled is False
    assert entry.unavailable == reason


def test_a_dry_run_says_which_node_keeps_a_target_out(owner: APIClient) -> None:
    node = Node.objects.create(
        name="gpu-1", address="http://10.0.0.5:7100", trust="trusted", status=NodeStatus.OFFLINE
    )
    target = node_target(node)

    response = owner.post("/api/v1/pools/chat/dry-run/", {"kind": "chat"}, format="json")

    assert response.status_code == 200
    assert response.json()["target_id"] is None
    assert response.json()["skipped"] == [
        {
            "target_id": target.pk,
            "name": "on-node",
            "reason": "disabled",
            "detail": "node gpu-1 is offline",
        }
    ]


def test_a_node_target_follows_its_nodes_address(
    serving_agent: RunningAgent, agent_two: RunningAgent
) -> None:
    node = trusted_node("gpu-1", serving_agent)
    target = node_target(node)

    services.update_node(node, address=agent_two.url, credential=agent_two.credential)

    target.refresh_from_db()
    assert target.base_url == f"{agent_two.url}/v1"
    assert load_snapshot().pools["chat"].targets[0].base_url == f"{agent_two.url}/v1"


def test_a_node_with_targets_is_not_deleted_through_the_api(
    owner: APIClient, serving_agent: RunningAgent
) -> None:
    node = trusted_node("gpu-1", serving_agent)
    node_target(node)

    response = owner.delete("/api/v1/nodes/gpu-1/")

    assert response.status_code == 409
    assert response.json() == {
        "detail": "Node gpu-1 is used by target chat/on-node; remove it first."
    }
    assert Node.objects.filter(name="gpu-1").exists()
