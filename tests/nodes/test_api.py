"""The nodes admin API against real agents: who may do what, and what it never reveals."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from nexus.models import ApiToken
from nexus.scopes import TokenKind
from nodes import services
from nodes.models import Node, NodeTrust
from tests.nexus.factories import make_user
from tests.nodes.fleet import SIM_MODEL, serve_simulator, stop_process, trusted_node
from tests.support.agent import RunningAgent
from tests.support.personas import bearer
from tests.support.ports import free_port

pytestmark = pytest.mark.django_db


def add(client: APIClient, agent: RunningAgent, name: str = "gpu-1", **body: str):
    return client.post(
        "/api/v1/nodes/",
        {"name": name, "address": agent.url, "credential": agent.credential, **body},
        format="json",
    )


def test_an_owner_adds_a_node_and_sees_the_fingerprint_to_compare(
    owner: APIClient, agent_one: RunningAgent
) -> None:
    response = add(owner, agent_one)

    assert response.status_code == 201
    body = response.json()
    assert body["name"] == "gpu-1"
    assert body["trust"] == "pending"
    assert body["fingerprint"] == agent_one.fingerprint
    assert body["has_credential"] is True
    assert body["model_count"] == 0
    assert "credential" not in body


def test_the_node_credential_is_never_returned(owner: APIClient, agent_one: RunningAgent) -> None:
    add(owner, agent_one)
    node = Node.objects.get()

    responses = [
        owner.get("/api/v1/nodes/"),
        owner.get("/api/v1/nodes/gpu-1/"),
        owner.post("/api/v1/nodes/gpu-1/confirm/", {"fingerprint": agent_one.fingerprint}),
        owner.post("/api/v1/nodes/gpu-1/refresh/"),
        owner.get("/api/v1/nodes/gpu-1/models/"),
    ]

    assert [response.status_code for response in responses] == [200] * 5
    for response in responses:
        assert agent_one.credential not in response.content.decode()
    assert node.credential_encrypted and agent_one.credential not in node.credential_encrypted


def test_a_wrong_credential_is_a_clear_400(owner: APIClient, agent_one: RunningAgent) -> None:
    response = add(owner, agent_one, credential="wrong-secret")

    assert response.status_code == 400
    assert response.json() == {
        "detail": f"The agent at {agent_one.url} refused the node credential."
    }
    assert Node.objects.count() == 0


def test_an_address_nothing_answers_is_a_clear_400(owner: APIClient) -> None:
    address = f"http://127.0.0.1:{free_port()}"

    response = owner.post(
        "/api/v1/nodes/",
        {"name": "gpu-1", "address": address, "credential": "x"},
        format="json",
    )

    assert response.status_code == 400
    assert response.json() == {
        "detail": f"Cannot reach the agent at {address}: connection refused."
    }


def test_a_node_needs_a_credential_and_a_unique_slug_name(
    owner: APIClient, agent_one: RunningAgent
) -> None:
    add(owner, agent_one)

    missing = owner.post("/api/v1/nodes/", {"name": "b", "address": agent_one.url}, format="json")
    taken = add(owner, agent_one)
    bad_name = add(owner, agent_one, name="not a slug")

    assert missing.status_code == taken.status_code == bad_name.status_code == 400
    assert list(missing.json()) == ["credential"]
    assert list(taken.json()) == ["name"]
    assert list(bad_name.json()) == ["name"]


def test_a_wrong_fingerprint_does_not_confirm(owner: APIClient, agent_one: RunningAgent) -> None:
    add(owner, agent_one)

    response = owner.post(
        "/api/v1/nodes/gpu-1/confirm/", {"fingerprint": "SHA256:nope"}, format="json"
    )

    assert response.status_code == 400
    assert "is not the one node gpu-1 presented" in response.json()["detail"]
    assert Node.objects.get().trust == NodeTrust.PENDING


def test_confirming_trusts_the_node_and_lists_its_models(
    owner: APIClient, agent_one: RunningAgent
) -> None:
    process_id = serve_simulator(agent_one)
    add(owner, agent_one)
    try:
        confirmed = owner.post(
            "/api/v1/nodes/gpu-1/confirm/", {"fingerprint": agent_one.fingerprint}, format="json"
        )
    finally:
        stop_process(agent_one, process_id)
    models = owner.get("/api/v1/nodes/gpu-1/models/")

    assert confirmed.status_code == 200
    assert confirmed.json()["trust"] == "trusted"
    assert confirmed.json()["status"] == "online"
    assert confirmed.json()["model_count"] == 1
    assert models.status_code == 200
    assert [(m["model_id"], m["runtime"], m["source"]) for m in models.json()] == [
        (SIM_MODEL, "simulator", "managed")
    ]


def test_rejecting_keeps_the_node_from_any_work(owner: APIClient, agent_one: RunningAgent) -> None:
    add(owner, agent_one)

    response = owner.post("/api/v1/nodes/gpu-1/reject/")

    assert response.status_code == 200
    assert response.json()["trust"] == "rejected"
    assert list(services.usable_nodes()) == []


def test_a_refresh_of_a_silent_node_says_why_it_is_offline(
    owner: APIClient, agent_one: RunningAgent
) -> None:
    node = trusted_node("gpu-1", agent_one)
    Node.objects.filter(pk=node.pk).update(address=f"http://127.0.0.1:{free_port()}")

    response = owner.post("/api/v1/nodes/gpu-1/refresh/")

    assert response.status_code == 200
    assert response.json()["status"] == "offline"
    assert response.json()["last_error"] == "connection refused"


def test_changing_the_credential_proves_the_agent_again(
    owner: APIClient, agent_one: RunningAgent
) -> None:
    trusted_node("gpu-1", agent_one)

    wrong = owner.patch("/api/v1/nodes/gpu-1/", {"credential": "wrong"}, format="json")
    renamed = owner.patch("/api/v1/nodes/gpu-1/", {"name": "gpu-one"}, format="json")

    assert wrong.status_code == 400
    assert wrong.json() == {"detail": f"The agent at {agent_one.url} refused the node credential."}
    assert renamed.status_code == 200
    assert renamed.json()["trust"] == "trusted"
    assert Node.objects.get().get_credential() == agent_one.credential


def test_a_node_without_targets_is_removed(owner: APIClient, agent_one: RunningAgent) -> None:
    add(owner, agent_one)

    assert owner.delete("/api/v1/nodes/gpu-1/").status_code == 204
    assert Node.objects.count() == 0


def test_a_teammate_reads_nodes_but_cannot_change_them(
    teammate: APIClient, agent_one: RunningAgent
) -> None:
    services.add_node("gpu-1", agent_one.url, agent_one.credential)

    assert teammate.get("/api/v1/nodes/").json()["count"] == 1
    assert add(teammate, agent_one, name="gpu-2").status_code == 403
    assert (
        teammate.post(
            "/api/v1/nodes/gpu-1/confirm/", {"fingerprint": agent_one.fingerprint}
        ).status_code
        == 403
    )
    assert teammate.post("/api/v1/nodes/gpu-1/reject/").status_code == 403
    assert teammate.delete("/api/v1/nodes/gpu-1/").status_code == 403
    assert Node.objects.get().trust == NodeTrust.PENDING


def test_an_outsider_sees_nothing(outsider: APIClient) -> None:
    assert outsider.get("/api/v1/nodes/").status_code == 401


def test_a_read_only_admin_token_reads_the_fleet_but_cannot_change_it(
    agent_one: RunningAgent,
) -> None:
    services.add_node("gpu-1", agent_one.url, agent_one.credential)
    staff = make_user("a", staff=True)
    _, secret = ApiToken.issue("reader", kind=TokenKind.ADMIN, created_by=staff)
    _, app_secret = ApiToken.issue("app", created_by=staff)

    assert bearer(secret).get("/api/v1/nodes/gpu-1/").status_code == 200
    assert bearer(app_secret).get("/api/v1/nodes/gpu-1/").status_code == 403
    refused = bearer(secret).post("/api/v1/nodes/gpu-1/reject/")

    assert refused.status_code == 403
    assert refused.json() == {
        "detail": "This admin token may only read; changes need an admin token with write access."
    }
