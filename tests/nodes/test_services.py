"""The fleet's operations against real agents: prove, confirm, refresh, notice silence."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from nexus.models import ConfigVersion
from nodes import services
from nodes.models import Node, NodeModel, NodeStatus, NodeTrust
from nodes.services import NodeError, NodeInUse
from pools.models import Target
from tests.nexus.factories import make_pool
from tests.nodes.fleet import (
    SIM_MODEL,
    agent_args,
    serve_simulator,
    stop_process,
    trusted_node,
)
from tests.support.agent import RunningAgent, running_agent
from tests.support.http import LOOPBACK
from tests.support.ports import free_port

pytestmark = pytest.mark.django_db


@pytest.fixture
def own_agent(tmp_path: Path) -> Iterator[RunningAgent]:
    """An agent this test alone may crash and restart."""
    with running_agent(tmp_path, name="own", args=agent_args()) as agent:
        yield agent


@pytest.fixture
def replaying_agent(agent_one: RunningAgent) -> Iterator[str]:
    """An impostor at another address that replays the real agent's signed answer."""
    captured = LOOPBACK.get(
        f"{agent_one.url}/agent/v1/info",
        params={"challenge": "00" * 32},
        headers=agent_one.headers(),
        timeout=5,
    ).content

    class Replay(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(captured)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Replay)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_adding_a_node_stores_the_identity_it_proved_and_leaves_it_pending(
    agent_one: RunningAgent,
) -> None:
    node = services.add_node("gpu-1", agent_one.url + "/", agent_one.credential)

    node.refresh_from_db()
    assert node.trust == NodeTrust.PENDING
    assert node.fingerprint == agent_one.fingerprint
    assert node.address == agent_one.url
    assert node.hostname
    assert node.resources["cpu_count"] >= 1
    assert node.get_credential() == agent_one.credential
    assert agent_one.credential not in node.credential_encrypted
    assert node.trusted_at is None
    assert list(services.usable_nodes()) == []


def test_a_wrong_credential_is_refused_and_nothing_is_saved(agent_one: RunningAgent) -> None:
    with pytest.raises(NodeError) as refused:
        services.add_node("gpu-1", agent_one.url, "wrong-secret")

    assert str(refused.value) == f"The agent at {agent_one.url} refused the node credential."
    assert Node.objects.count() == 0


def test_an_unreachable_address_is_refused_in_plain_words() -> None:
    address = f"http://127.0.0.1:{free_port()}"

    with pytest.raises(NodeError) as refused:
        services.add_node("gpu-1", address, "node-secret")

    assert str(refused.value) == f"Cannot reach the agent at {address}: connection refused."
    assert Node.objects.count() == 0


def test_a_replayed_answer_does_not_prove_the_identity(replaying_agent: str) -> None:
    with pytest.raises(NodeError) as refused:
        services.add_node("impostor", replaying_agent, "anything")

    assert "did not prove its identity" in str(refused.value)
    assert "does not verify" in str(refused.value)
    assert Node.objects.count() == 0


def test_a_trusted_node_that_no_longer_proves_its_identity_goes_back_to_pending(
    agent_one: RunningAgent, replaying_agent: str
) -> None:
    node = trusted_node("gpu-1", agent_one)
    Node.objects.filter(pk=node.pk).update(address=replaying_agent)
    node.refresh_from_db()

    node = services.refresh_node(node)

    assert node.trust == NodeTrust.PENDING
    assert node.status == NodeStatus.OFFLINE
    assert node.last_error == (
        "identity not proven: the agent's signature of the identity challenge does not verify "
        "with its public key"
    )
    assert list(services.usable_nodes()) == []


def test_the_same_agent_cannot_be_added_twice(agent_one: RunningAgent) -> None:
    services.add_node("gpu-1", agent_one.url, agent_one.credential)

    with pytest.raises(NodeError, match=r"is node gpu-1 already"):
        services.add_node("gpu-1-again", agent_one.url, agent_one.credential)


def test_a_wrong_fingerprint_does_not_confirm_the_node(agent_one: RunningAgent) -> None:
    node = services.add_node("gpu-1", agent_one.url, agent_one.credential)

    with pytest.raises(NodeError, match="is not the one node gpu-1 presented"):
        services.confirm_node(node, "SHA256:" + "A" * 43)

    node.refresh_from_db()
    assert node.trust == NodeTrust.PENDING


def test_confirming_trusts_the_node_and_learns_its_models(agent_one: RunningAgent) -> None:
    process_id = serve_simulator(agent_one)
    node = services.add_node("gpu-1", agent_one.url, agent_one.credential)
    before = ConfigVersion.current()
    try:
        node = services.confirm_node(node, f"  {agent_one.fingerprint} ")
    finally:
        stop_process(agent_one, process_id)

    assert node.trust == NodeTrust.TRUSTED
    assert node.trusted_at is not None
    assert node.status == NodeStatus.ONLINE
    assert "memory_total_bytes" in node.metrics["node"]
    model = NodeModel.objects.get(node=node)
    assert (model.model_id, model.runtime, model.source) == (SIM_MODEL, "simulator", "managed")
    assert model.process_id == process_id
    assert model.base_url.startswith("http://127.0.0.1:")
    assert ConfigVersion.current() > before
    assert list(services.usable_nodes()) == [node]


def test_a_refresh_drops_models_that_vanished(agent_one: RunningAgent) -> None:
    process_id = serve_simulator(agent_one, "short-lived")
    node = trusted_node("gpu-1", agent_one)
    assert services.inventory_ids(node) == ["short-lived"]

    stop_process(agent_one, process_id)
    services.refresh_node(node)

    assert services.inventory_ids(node) == []


def test_a_refresh_that_changes_nothing_leaves_the_configuration_alone(
    agent_one: RunningAgent,
) -> None:
    node = trusted_node("gpu-1", agent_one)
    before = ConfigVersion.current()

    services.refresh_node(node)

    assert ConfigVersion.current() == before


def test_pending_and_rejected_nodes_are_not_contacted(agent_one: RunningAgent) -> None:
    pending = services.add_node("gpu-1", agent_one.url, agent_one.credential)
    Node.objects.filter(pk=pending.pk).update(address=f"http://127.0.0.1:{free_port()}")
    pending.refresh_from_db()

    services.refresh_node(pending)
    services.reject_node(pending)
    services.refresh_node(pending)

    pending.refresh_from_db()
    assert pending.trust == NodeTrust.REJECTED
    assert pending.status == NodeStatus.ONLINE  # as at add: nobody asked it since
    assert pending.last_error == ""


def test_a_silent_node_is_offline_at_once_and_online_when_it_answers_again(
    own_agent: RunningAgent, caplog: pytest.LogCaptureFixture
) -> None:
    node = trusted_node("gpu-1", own_agent)
    before = ConfigVersion.current()

    own_agent.kill()
    with caplog.at_level(logging.INFO):
        node = services.refresh_node(node)

    assert node.status == NodeStatus.OFFLINE
    assert node.last_error == "connection refused"
    assert node.status_changed_at is not None
    assert list(services.usable_nodes()) == []
    assert ConfigVersion.current() > before
    assert "node gpu-1 is offline: connection refused" in caplog.text
    assert own_agent.credential not in caplog.text

    own_agent.start()
    node = services.refresh_node(node)

    assert node.status == NodeStatus.ONLINE
    assert node.last_error == ""
    assert list(services.usable_nodes()) == [node]


def test_a_node_whose_key_changed_goes_back_to_pending_with_the_reason(tmp_path: Path) -> None:
    port = free_port()
    with running_agent(tmp_path, name="first", port=port) as first:
        node = trusted_node("gpu-1", first)
        old = first.fingerprint
    with running_agent(tmp_path, name="second", port=port) as second:
        node = services.refresh_node(node)

        assert node.trust == NodeTrust.PENDING
        assert node.trusted_at is None
        assert node.fingerprint == second.fingerprint != old
        assert node.last_error.startswith(
            f"identity changed: the agent at {second.url} now presents {second.fingerprint} "
            f"instead of {old}"
        )
        assert list(services.usable_nodes()) == []

        # The operator compares the new fingerprint with what the new agent printed.
        node = services.confirm_node(node, second.fingerprint)
        assert node.trust == NodeTrust.TRUSTED
        assert node.last_error == ""


def test_refreshing_the_fleet_reads_every_trusted_node(
    agent_one: RunningAgent, agent_two: RunningAgent
) -> None:
    trusted_node("one", agent_one)
    trusted_node("two", agent_two)
    dead = f"http://127.0.0.1:{free_port()}"
    Node.objects.create(name="gone", address=dead, trust=NodeTrust.TRUSTED)
    Node.objects.create(name="unconfirmed", address=dead)

    summary = services.refresh_nodes()

    assert summary == {"online": 2, "offline": 1}
    assert Node.objects.get(name="gone").last_error == "connection refused"
    assert Node.objects.get(name="unconfirmed").status == NodeStatus.UNKNOWN


def test_the_credential_and_address_change_is_proven_again(
    agent_one: RunningAgent, agent_two: RunningAgent
) -> None:
    node = trusted_node("gpu-1", agent_one)

    with pytest.raises(NodeError, match="refused the node credential"):
        services.update_node(node, credential="wrong")
    moved = services.update_node(node, address=agent_two.url, credential=agent_two.credential)

    assert moved.trust == NodeTrust.PENDING
    assert moved.fingerprint == agent_two.fingerprint
    assert moved.last_error.startswith("identity changed:")
    assert moved.get_credential() == agent_two.credential


def test_a_node_used_by_a_pool_target_cannot_be_removed(agent_one: RunningAgent) -> None:
    node = services.add_node("gpu-1", agent_one.url, agent_one.credential)
    Target.objects.create(
        pool=make_pool("chat"), name="on-gpu-1", node=node, model_id=SIM_MODEL, base_url=""
    )

    with pytest.raises(NodeInUse, match="used by target chat/on-gpu-1; remove it first"):
        services.delete_node(node)

    assert Node.objects.filter(pk=node.pk).exists()


def test_the_refresh_task_reports_what_it_found(agent_one: RunningAgent) -> None:
    from nodes.tasks import refresh_nodes

    trusted_node("gpu-1", agent_one)

    assert refresh_nodes() == "{'online': 1}"


@pytest.mark.django_db
def test_a_node_cannot_be_named_like_the_add_page() -> None:
    with pytest.raises(services.NodeError, match="Add node page"):
        services.add_node("add", "http://127.0.0.1:9", "secret")

    assert not Node.objects.exists()
