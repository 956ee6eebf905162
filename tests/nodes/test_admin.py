"""The Django admin for nodes: browsable, never shows the credential, proves a changed agent."""

from __future__ import annotations

import pytest
from django.test import Client

from nexus.models import ConfigVersion
from nodes.models import Node, NodeTrust
from pools.models import Target
from tests.nexus.factories import make_pool, make_user
from tests.nodes.fleet import SIM_MODEL, serve_simulator, stop_process, trusted_node
from tests.support.agent import RunningAgent

pytestmark = pytest.mark.django_db


@pytest.fixture
def superuser() -> Client:
    client = Client()
    client.force_login(make_user("root", superuser=True))
    return client


def node_form(node: Node, **fields: str) -> dict[str, str]:
    """Return the Node change form's data, with no inventory rows edited."""
    return {
        "name": node.name,
        "address": node.address,
        "credential": "",
        "models-TOTAL_FORMS": str(node.models.count()),
        "models-INITIAL_FORMS": str(node.models.count()),
        "models-MIN_NUM_FORMS": "0",
        "models-MAX_NUM_FORMS": "1000",
        **{f"models-{i}-id": str(row.pk) for i, row in enumerate(node.models.all())},
        **{f"models-{i}-node": str(node.pk) for i in range(node.models.count())},
        **fields,
    }


def test_node_admin_pages_render_without_the_credential(
    superuser: Client, agent_one: RunningAgent
) -> None:
    process_id = serve_simulator(agent_one)
    try:
        node = trusted_node("gpu-1", agent_one)
    finally:
        stop_process(agent_one, process_id)
    urls = [
        "/admin/nodes/node/",
        f"/admin/nodes/node/{node.pk}/change/",
        "/admin/nodes/nodemodel/",
        "/admin/pools/target/add/",
    ]

    for url in urls:
        response = superuser.get(url)
        assert response.status_code == 200, url
        assert agent_one.credential not in response.content.decode()
    assert SIM_MODEL in superuser.get("/admin/nodes/nodemodel/").content.decode()


def test_nodes_are_added_where_their_fingerprint_is_shown(superuser: Client) -> None:
    assert superuser.get("/admin/nodes/node/add/").status_code == 403


def test_a_wrong_credential_set_in_the_admin_is_refused(
    superuser: Client, agent_one: RunningAgent
) -> None:
    node = trusted_node("gpu-1", agent_one)

    response = superuser.post(
        f"/admin/nodes/node/{node.pk}/change/", node_form(node, credential="wrong")
    )

    assert response.status_code == 200
    assert "refused the node credential" in response.content.decode()
    assert Node.objects.get().get_credential() == agent_one.credential


def test_pointing_a_node_at_another_agent_in_the_admin_needs_a_new_confirmation(
    superuser: Client, agent_one: RunningAgent, agent_two: RunningAgent
) -> None:
    node = trusted_node("gpu-1", agent_one)
    before = ConfigVersion.current()

    response = superuser.post(
        f"/admin/nodes/node/{node.pk}/change/",
        node_form(node, address=agent_two.url, credential=agent_two.credential),
    )

    assert response.status_code == 302
    node.refresh_from_db()
    assert node.trust == NodeTrust.PENDING
    assert node.fingerprint == agent_two.fingerprint
    assert ConfigVersion.current() > before


def test_a_target_on_a_node_is_added_in_the_admin_with_the_nodes_url(
    superuser: Client, agent_one: RunningAgent
) -> None:
    process_id = serve_simulator(agent_one)
    try:
        node = trusted_node("gpu-1", agent_one)
    finally:
        stop_process(agent_one, process_id)
    pool = make_pool("chat")
    form = {
        "pool": str(pool.pk),
        "name": "on-gpu-1",
        "node": str(node.pk),
        "base_url": "",
        "model_id": SIM_MODEL,
        "priority": "1",
        "capacity_weight": "4",
        "kinds": "chat",
        "enabled": "on",
        "position": "0",
    }

    wrong = superuser.post("/admin/pools/target/add/", {**form, "model_id": "other"})
    added = superuser.post("/admin/pools/target/add/", form)

    assert "Node gpu-1 does not serve other" in wrong.content.decode()
    assert added.status_code == 302
    assert Target.objects.get().base_url == f"{agent_one.url}/v1"
