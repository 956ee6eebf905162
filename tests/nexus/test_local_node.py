"""The node `local`: the agent `make run` started, trusted only once it proves the key it keeps."""

from __future__ import annotations

from pathlib import Path

import pytest

from nexus.launcher import LaunchError
from nexus.management.commands.nexus_run import ensure_local_node
from nodes import services as node_services
from nodes.agent.identity import Identity
from nodes.models import Node, NodeStatus, NodeTrust
from tests.support.agent import running_agent

pytestmark = pytest.mark.django_db


def key_fingerprint(data_dir: Path) -> str:
    """Return the fingerprint of the key in an agent's data dir, as the launcher reads it."""
    return Identity.load_or_create(data_dir).fingerprint


def test_the_local_agent_is_added_and_trusted_once_it_proves_its_key(tmp_path: Path) -> None:
    with running_agent(tmp_path, credential="first") as agent:
        node = ensure_local_node(agent.url, "first", key_fingerprint(agent.data_dir))

    assert (node.name, node.address, node.get_credential()) == ("local", agent.url, "first")
    assert (node.trust, node.status) == (NodeTrust.TRUSTED, NodeStatus.ONLINE)
    assert node.fingerprint == agent.fingerprint


def test_a_local_agent_on_another_port_and_credential_is_followed_there(tmp_path: Path) -> None:
    with running_agent(tmp_path, credential="first") as agent:
        ensure_local_node(agent.url, "first", key_fingerprint(agent.data_dir))
    # The same data dir (so the same key) behind another port and credential
    with running_agent(tmp_path, credential="second") as moved:
        node = ensure_local_node(moved.url, "second", key_fingerprint(moved.data_dir))

    assert moved.url != agent.url
    assert (node.address, node.get_credential()) == (moved.url, "second")
    assert (node.trust, node.fingerprint) == (NodeTrust.TRUSTED, agent.fingerprint)
    assert Node.objects.count() == 1


def test_a_local_node_the_operator_rejected_stays_rejected(tmp_path: Path) -> None:
    with running_agent(tmp_path, credential="first") as agent:
        node_services.reject_node(node_services.add_node("local", agent.url, "first"))

        node = ensure_local_node(agent.url, "first", key_fingerprint(agent.data_dir))

    assert node.trust == NodeTrust.REJECTED


def test_an_agent_that_does_not_hold_the_local_key_is_refused_and_nothing_saved(
    tmp_path: Path,
) -> None:
    ours = key_fingerprint(tmp_path / "ours")
    # Another program's agent answers on the port, with the credential
    with (
        running_agent(tmp_path, name="impostor", credential="first") as impostor,
        pytest.raises(LaunchError, match="another program may hold NEXUS_AGENT_PORT"),
    ):
        ensure_local_node(impostor.url, "first", ours)

    assert not Node.objects.exists()
