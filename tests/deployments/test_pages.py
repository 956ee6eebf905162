"""The deployments pages: the list, the form to start one, the detail with a row per node."""

from __future__ import annotations

import pytest
from django.test import Client

from deployments.models import Deployment, DeploymentNode, NodeState
from nodes.models import NodeStatus, NodeTrust
from tests.deployments.factories import SHA256, make_deployment, make_node
from tests.nexus.factories import make_user

pytestmark = pytest.mark.django_db

MIB = 1024 * 1024


def signed_in(username: str, *, staff: bool = False) -> Client:
    client = Client()
    client.force_login(make_user(username, staff=staff))
    return client


@pytest.fixture
def owner() -> Client:
    return signed_in("owner", staff=True)


@pytest.fixture
def teammate() -> Client:
    return signed_in("teammate")


def test_an_outsider_is_sent_to_sign_in() -> None:
    response = Client().get("/deployments/")

    assert response.status_code == 302
    assert response["Location"] == "/login/?next=/deployments/"


def test_the_list_shows_each_deployment_with_its_state_and_nodes(teammate: Client) -> None:
    make_deployment(
        "Qwen on the fleet",
        {make_node("gpu-a"): NodeState.FAILED, make_node("gpu-b"): NodeState.SUCCEEDED},
        model_name="qwen2.5-0.5b",
    )

    page = teammate.get("/deployments/").content.decode()

    for text in ["Qwen on the fleet", "qwen2.5-0.5b", "gpu-a, gpu-b", 'data-state="failed"']:
        assert text in page, text
    assert 'href="/deployments/" aria-current="page"' in page
    assert "New deployment" not in page


def test_the_form_offers_only_usable_nodes(owner: Client) -> None:
    make_node("gpu-a")
    make_node("gpu-new", trust=NodeTrust.PENDING)
    make_node("gpu-down", status=NodeStatus.OFFLINE)

    page = owner.get("/deployments/new/").content.decode()

    assert 'value="gpu-a"' in page
    assert "gpu-new" not in page
    assert "gpu-down" not in page


def test_an_owner_starts_a_deployment_from_the_form(
    owner: Client, django_capture_on_commit_callbacks
) -> None:
    make_node("gpu-a")
    make_node("gpu-b")

    with django_capture_on_commit_callbacks() as queued:
        response = owner.post(
            "/deployments/new/",
            {
                "name": "demo",
                "nodes": ["gpu-a", "gpu-b"],
                "runtime": "simulator",
                "model_source": "http",
                "model_location": "http://files.lan/demo.bin",
                "model_sha256": SHA256,
                "model_name": "demo-1b",
            },
        )

    deployment = Deployment.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/deployments/{deployment.pk}/"
    assert sorted(deployment.nodes.values_list("node__name", flat=True)) == ["gpu-a", "gpu-b"]
    assert len(queued) == 2


def test_the_form_shows_why_a_deployment_is_refused(owner: Client) -> None:
    make_node("gpu-a")

    response = owner.post(
        "/deployments/new/",
        {
            "name": "demo",
            "nodes": ["gpu-a"],
            "runtime": "custom",
            "runtime_argv": "my-server ${MODEL_PATH}",
            "model_source": "http",
            "model_location": "http://files.lan/demo.bin",
            "model_name": "demo-1b",
        },
    )

    assert response.status_code == 200
    assert "must contain ${PORT}, where it listens." in response.content.decode()
    assert not Deployment.objects.exists()


def test_a_teammate_cannot_open_the_form(teammate: Client) -> None:
    assert teammate.get("/deployments/new/").status_code == 403


def test_the_detail_shows_a_row_per_node_with_progress(teammate: Client) -> None:
    deployment = make_deployment(
        "demo", {make_node("gpu-a"): NodeState.RUNNING, make_node("gpu-b"): NodeState.FAILED}
    )
    DeploymentNode.objects.filter(node__name="gpu-a").update(
        phase="downloading", bytes_done=12 * MIB, bytes_total=48 * MIB, percent=25.0
    )
    DeploymentNode.objects.filter(node__name="gpu-b").update(
        error="sha256 mismatch", log=["verifying", "sha256 mismatch"]
    )
    a, b = deployment.nodes.order_by("node__name")

    page = teammate.get(f"/deployments/{deployment.pk}/").content.decode()

    for text in [
        f'<tr id="deployment-node-{a.pk}" data-state="running">',
        "downloading",
        '<progress max="100" value="25.0"></progress>',
        "Running (downloading, 25 %)",
        "12 MiB of 48 MiB",
        f'<tr id="deployment-node-{b.pk}" data-state="failed">',
        "sha256 mismatch",
        f'ws-connect="/ws/deployments/{deployment.pk}/"',
    ]:
        assert text in page, text
    assert "Retry failed nodes" not in page


def test_retry_is_offered_to_staff_only_when_a_node_failed(owner: Client, teammate: Client) -> None:
    failed = make_deployment("failed", {make_node("gpu-a"): NodeState.FAILED})
    running = make_deployment("running", {make_node("gpu-b"): NodeState.RUNNING})

    assert "Retry failed nodes" in owner.get(f"/deployments/{failed.pk}/").content.decode()
    assert "Retry failed nodes" not in owner.get(f"/deployments/{running.pk}/").content.decode()
    assert "Retry failed nodes" not in teammate.get(f"/deployments/{failed.pk}/").content.decode()


def test_an_htmx_request_gets_only_the_live_section(teammate: Client) -> None:
    deployment = make_deployment("demo", {make_node("gpu-a"): NodeState.PENDING})

    response = teammate.get(f"/deployments/{deployment.pk}/", headers={"HX-Request": "true"})

    assert response.content.decode().lstrip().startswith('<section id="deployment-live"')
    assert "HX-Request" in response["Vary"]


def test_the_retry_button_retries_the_failed_nodes_and_says_so(
    owner: Client, django_capture_on_commit_callbacks
) -> None:
    deployment = make_deployment(
        "demo", {make_node("gpu-a"): NodeState.FAILED, make_node("gpu-b"): NodeState.SUCCEEDED}
    )

    with django_capture_on_commit_callbacks():
        response = owner.post(f"/deployments/{deployment.pk}/retry/", follow=True)

    assert response.redirect_chain == [(f"/deployments/{deployment.pk}/", 302)]
    page = response.content.decode()
    assert '<span class="toast-text">Retrying the failed nodes: gpu-a.</span>' in page
    assert "Retry failed nodes" not in page  # none failed now
    assert [row.state for row in deployment.nodes.order_by("node__name")] == [
        "pending",
        "succeeded",
    ]


def test_retry_without_javascript_redirects_with_a_message(owner: Client) -> None:
    deployment = make_deployment("demo", {make_node("gpu-a"): NodeState.SUCCEEDED})

    response = owner.post(f"/deployments/{deployment.pk}/retry/", follow=True)

    assert response.redirect_chain == [(f"/deployments/{deployment.pk}/", 302)]
    assert "No node of this deployment failed" in response.content.decode()


def test_a_teammate_cannot_retry(teammate: Client) -> None:
    deployment = make_deployment("demo", {make_node("gpu-a"): NodeState.FAILED})

    assert teammate.post(f"/deployments/{deployment.pk}/retry/").status_code == 403
    assert deployment.nodes.get().state == NodeState.FAILED
