"""The deployments admin API: start one on named nodes, read its rows, retry its failed nodes."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from deployments.models import Deployment, NodeState
from nexus.models import ApiToken
from nexus.scopes import AdminAccess, TokenKind
from nodes.models import NodeStatus, NodeTrust
from tests.deployments.factories import SHA256, make_deployment, make_node
from tests.nexus.factories import make_user

pytestmark = pytest.mark.django_db


def body(**fields: Any) -> dict[str, Any]:
    """Return a request to deploy the simulator from an HTTP URL onto gpu-a and gpu-b."""
    return {
        "name": "demo",
        "nodes": ["gpu-a", "gpu-b"],
        "runtime": "simulator",
        "model_source": "http",
        "model_location": "http://files.lan/demo.bin",
        "model_sha256": SHA256,
        "model_name": "demo-1b",
        **fields,
    }


@pytest.fixture
def fleet() -> None:
    make_node("gpu-a")
    make_node("gpu-b")
    make_node("gpu-new", trust=NodeTrust.PENDING)
    make_node("gpu-down", status=NodeStatus.OFFLINE)


def token_client(issuer: str, **scope: object) -> APIClient:
    """Return a client that calls with an admin token issued by a new staff user."""
    _, secret = ApiToken.issue(
        "automation", kind=TokenKind.ADMIN, created_by=make_user(issuer, staff=True), **scope
    )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def test_an_owner_starts_a_deployment_on_nodes_named_by_name(
    owner: APIClient, fleet: None, django_capture_on_commit_callbacks
) -> None:
    with django_capture_on_commit_callbacks() as queued:
        response = owner.post("/api/v1/deployments/", body(), format="json")

    assert response.status_code == 201
    created = response.json()
    assert created["state"] == "running"
    assert created["created_by"] == "owner"
    assert [(row["node"], row["state"], row["attempt"]) for row in created["nodes"]] == [
        ("gpu-a", "pending", 1),
        ("gpu-b", "pending", 1),
    ]
    assert created["nodes"][0]["log"] == []
    assert len(queued) == 2


@pytest.mark.parametrize(
    ("nodes", "reason"),
    [
        (["gpu-a", "gpu-new"], "node gpu-new is not trusted (pending confirmation)."),
        (["gpu-down"], "node gpu-down is offline."),
    ],
)
def test_a_node_that_cannot_take_work_is_refused_by_name(
    owner: APIClient, fleet: None, nodes: list[str], reason: str
) -> None:
    response = owner.post("/api/v1/deployments/", body(nodes=nodes), format="json")

    assert response.status_code == 400
    assert response.json() == {"nodes": [reason]}
    assert not Deployment.objects.exists()


def test_an_unknown_node_or_none_at_all_is_refused(owner: APIClient, fleet: None) -> None:
    unknown = owner.post("/api/v1/deployments/", body(nodes=["gpu-z"]), format="json")
    empty = owner.post("/api/v1/deployments/", body(nodes=[]), format="json")

    assert unknown.status_code == 400
    assert unknown.json() == {"nodes": ["Object with name=gpu-z does not exist."]}
    assert empty.status_code == 400
    assert list(empty.json()) == ["nodes"]


def test_a_bad_checksum_and_a_source_that_does_not_fit_are_refused(
    owner: APIClient, fleet: None
) -> None:
    response = owner.post(
        "/api/v1/deployments/",
        body(model_sha256="xyz", model_source="hf", model_location="org", model_file="a.gguf"),
        format="json",
    )

    assert response.status_code == 400
    assert response.json() == {
        "model_sha256": ["Give 64 hexadecimal digits."],
        "model_location": ["Give a Hugging Face repository as org/repo."],
    }


def test_the_detail_shows_each_node_row_with_its_log_and_the_list_without(
    teammate: APIClient,
) -> None:
    deployment = make_deployment(
        "demo", {make_node("gpu-a"): NodeState.FAILED, make_node("gpu-b"): NodeState.SUCCEEDED}
    )
    deployment.nodes.filter(node__name="gpu-a").update(log=["downloading", "boom"])

    detail = teammate.get(f"/api/v1/deployments/{deployment.pk}/").json()
    listed = teammate.get("/api/v1/deployments/").json()

    assert detail["state"] == "failed"
    assert [(row["node"], row["state"], row["error"]) for row in detail["nodes"]] == [
        ("gpu-a", "failed", "boom"),
        ("gpu-b", "succeeded", ""),
    ]
    assert detail["nodes"][0]["log"] == ["downloading", "boom"]
    assert listed["count"] == 1
    assert "log" not in listed["results"][0]["nodes"][0]


def test_retry_runs_the_failed_nodes_again_and_leaves_the_others(
    owner: APIClient, django_capture_on_commit_callbacks
) -> None:
    deployment = make_deployment(
        "demo", {make_node("gpu-a"): NodeState.FAILED, make_node("gpu-b"): NodeState.SUCCEEDED}
    )

    with django_capture_on_commit_callbacks():
        response = owner.post(f"/api/v1/deployments/{deployment.pk}/retry/")

    assert response.status_code == 200
    assert response.json()["state"] == "running"
    assert [(row["node"], row["state"], row["attempt"]) for row in response.json()["nodes"]] == [
        ("gpu-a", "pending", 2),
        ("gpu-b", "succeeded", 1),
    ]


def test_retry_with_no_failed_node_is_a_conflict(owner: APIClient) -> None:
    deployment = make_deployment("demo", {make_node("gpu-a"): NodeState.SUCCEEDED})

    response = owner.post(f"/api/v1/deployments/{deployment.pk}/retry/")

    assert response.status_code == 409
    assert response.json() == {
        "detail": "No node of this deployment failed; there is nothing to retry."
    }


def test_a_teammate_reads_deployments_but_cannot_start_or_retry_them(
    teammate: APIClient, fleet: None
) -> None:
    deployment = make_deployment("demo", {make_node("gpu-c"): NodeState.FAILED})

    assert teammate.get("/api/v1/deployments/").status_code == 200
    assert teammate.post("/api/v1/deployments/", body(), format="json").status_code == 403
    assert teammate.post(f"/api/v1/deployments/{deployment.pk}/retry/").status_code == 403
    assert deployment.nodes.get().state == NodeState.FAILED
    assert Deployment.objects.count() == 1


def test_an_outsider_sees_nothing(outsider: APIClient) -> None:
    deployment = make_deployment("demo", {make_node("gpu-a"): NodeState.FAILED})

    assert outsider.get("/api/v1/deployments/").status_code == 401
    assert outsider.get(f"/api/v1/deployments/{deployment.pk}/").status_code == 401
    assert outsider.post(f"/api/v1/deployments/{deployment.pk}/retry/").status_code == 401


def test_a_staff_write_token_starts_one_but_a_read_token_only_reads(fleet: None) -> None:
    writer = token_client("robot", access=AdminAccess.WRITE)
    reader = token_client("reader", access=AdminAccess.READ)

    assert writer.post("/api/v1/deployments/", body(), format="json").status_code == 201
    refused = reader.post("/api/v1/deployments/", body(), format="json")
    assert refused.status_code == 403
    assert reader.get("/api/v1/deployments/").json()["count"] == 1
