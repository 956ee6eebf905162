"""The Nodes pages: the fleet list, adding with the fingerprint to compare, a node's detail."""

from __future__ import annotations

import pytest
from django.test import Client

from nodes import services
from nodes.models import Node, NodeTrust
from tests.nexus.factories import make_user
from tests.nodes.fleet import SIM_MODEL, serve_simulator, stop_process, trusted_node
from tests.support.agent import RunningAgent
from tests.support.ports import free_port

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(db: None) -> Client:
    client = Client()
    client.force_login(make_user("owner", staff=True))
    return client


@pytest.fixture
def member(db: None) -> Client:
    client = Client()
    client.force_login(make_user("teammate"))
    return client


def test_the_list_shows_each_node_with_its_state_and_resources(
    member: Client, agent_one: RunningAgent
) -> None:
    trusted_node("gpu-1", agent_one)
    Node.objects.create(name="gpu-2", address="http://10.0.0.9:7100")

    response = member.get("/nodes/")

    assert response.status_code == 200
    page = response.content.decode()
    assert 'aria-current="page">Nodes<' in page
    assert 'id="node-gpu-1"' in page and 'id="node-gpu-2"' in page
    assert "Trusted" in page and "Online" in page and "Pending confirmation" in page
    assert "Add node" not in page  # staff only


def test_the_list_refreshes_its_table_alone_for_htmx(member: Client) -> None:
    Node.objects.create(name="gpu-2", address="http://10.0.0.9:7100")

    response = member.get("/nodes/", headers={"HX-Request": "true"})

    assert response.content.decode().lstrip().startswith('<section class="card" id="nodes-table"')
    assert response.headers["Vary"] == "HX-Request, Cookie"


def test_adding_a_node_leads_to_its_fingerprint_to_compare(
    staff: Client, agent_one: RunningAgent
) -> None:
    response = staff.post(
        "/nodes/add/",
        {"name": "gpu-1", "address": agent_one.url, "credential": agent_one.credential},
    )

    assert response.status_code == 302
    assert response.headers["Location"] == "/nodes/gpu-1/confirm/"
    page = staff.get("/nodes/gpu-1/confirm/").content.decode()
    assert f'<p class="fingerprint" data-fingerprint>{agent_one.fingerprint}</p>' in page
    assert "Compare it with the fingerprint the agent printed" in page
    assert agent_one.credential not in page


def test_a_node_that_cannot_be_reached_is_explained_on_the_form(staff: Client) -> None:
    address = f"http://127.0.0.1:{free_port()}"

    response = staff.post("/nodes/add/", {"name": "gpu-1", "address": address, "credential": "x"})

    assert response.status_code == 400
    assert f"Cannot reach the agent at {address}: connection refused." in response.content.decode()
    assert Node.objects.count() == 0


def test_confirming_on_the_page_trusts_the_node_shown(
    staff: Client, agent_one: RunningAgent
) -> None:
    process_id = serve_simulator(agent_one)
    services.add_node("gpu-1", agent_one.url, agent_one.credential)
    try:
        response = staff.post(
            "/nodes/gpu-1/confirm/", {"fingerprint": agent_one.fingerprint}, follow=True
        )
    finally:
        stop_process(agent_one, process_id)

    assert response.redirect_chain == [("/nodes/gpu-1/", 302)]
    page = response.content.decode()
    assert "Node gpu-1 is trusted." in page
    assert f"<code>{SIM_MODEL}</code>" in page
    assert Node.objects.get().trust == NodeTrust.TRUSTED


def test_a_fingerprint_that_changed_meanwhile_is_not_confirmed(
    staff: Client, agent_one: RunningAgent
) -> None:
    services.add_node("gpu-1", agent_one.url, agent_one.credential)

    response = staff.post("/nodes/gpu-1/confirm/", {"fingerprint": "SHA256:older"})

    assert response.status_code == 400
    assert "is not the one node gpu-1 presented" in response.content.decode()
    assert Node.objects.get().trust == NodeTrust.PENDING


def test_rejecting_on_the_page(staff: Client, agent_one: RunningAgent) -> None:
    services.add_node("gpu-1", agent_one.url, agent_one.credential)

    response = staff.post("/nodes/gpu-1/reject/")

    assert response.status_code == 302
    assert Node.objects.get().trust == NodeTrust.REJECTED


def test_refresh_now_answers_htmx_with_the_nodes_state(
    staff: Client, agent_one: RunningAgent
) -> None:
    node = trusted_node("gpu-1", agent_one)
    Node.objects.filter(pk=node.pk).update(address=f"http://127.0.0.1:{free_port()}")

    response = staff.post("/nodes/gpu-1/refresh/", headers={"HX-Request": "true"})

    assert response.status_code == 200
    fragment = response.content.decode()
    assert fragment.lstrip().startswith('<div id="node-state">')
    assert '<dd class="error" data-last-error>connection refused</dd>' in fragment


def test_a_teammate_reads_a_node_but_changes_nothing(
    member: Client, agent_one: RunningAgent
) -> None:
    services.add_node("gpu-1", agent_one.url, agent_one.credential)

    assert member.get("/nodes/gpu-1/").status_code == 200
    assert member.get("/nodes/add/").status_code == 403
    assert member.get("/nodes/gpu-1/confirm/").status_code == 403
    assert member.post("/nodes/gpu-1/confirm/", {"fingerprint": "x"}).status_code == 403
    assert member.post("/nodes/gpu-1/reject/").status_code == 403
    assert member.post("/nodes/gpu-1/refresh/").status_code == 403
    assert Node.objects.get().trust == NodeTrust.PENDING


def test_an_anonymous_visitor_is_sent_to_sign_in(client: Client) -> None:
    response = client.get("/nodes/")

    assert response.status_code == 302
    assert response.headers["Location"] == "/login/?next=/nodes/"
