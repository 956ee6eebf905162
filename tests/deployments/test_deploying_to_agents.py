"""Deployments against real agents: a crash mid-download, a retry that resumes, clear failures.

Real agent processes, a throttled loopback file server and, where delivery and timing are the
behaviour, a real Celery worker sharing the test database.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from deployments import services
from deployments.models import Deployment, DeploymentNode, NodeState
from nodes import services as node_services
from nodes.models import Node, NodeModel
from tests.support.agent import RunningAgent, running_agent
from tests.support.fileserver import FileServer, serving_file
from tests.support.ports import free_port
from tests.support.waiting import wait_until
from tests.support.worker import running_worker

MIB = 1024 * 1024
MODEL = "demo-1b"


def fleet_node(agent: RunningAgent, name: str) -> Node:
    """Add the agent as a node and confirm the fingerprint it printed, as an operator would."""
    node = node_services.add_node(name, agent.url, agent.credential)
    return node_services.confirm_node(node, agent.fingerprint)


def row_on(deployment: Deployment, node: Node) -> DeploymentNode:
    return DeploymentNode.objects.get(deployment=deployment, node=node)


def deploy_file(server: FileServer, nodes: list[Node], sha256: str) -> Deployment:
    return services.create_deployment(
        name="demo",
        nodes=nodes,
        runtime="simulator",
        model_source="http",
        model_location=server.url,
        model_sha256=sha256,
        model_name=MODEL,
    )


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as processes:
        yield processes


def test_a_crashed_node_fails_clearly_and_its_retry_resumes_the_download(
    transactional_db: None, tmp_path: Path, stack: ExitStack
) -> None:
    content = os.urandom(4 * MIB)
    agents = [stack.enter_context(running_agent(tmp_path, name=f"agent-{x}")) for x in "abc"]
    server = stack.enter_context(serving_file(content, name="demo.bin", rate_bytes_per_s=MIB))
    worker = stack.enter_context(running_worker(tmp_path))
    nodes = [fleet_node(agent, f"node-{x}") for agent, x in zip(agents, "abc", strict=True)]
    victim, victim_agent = nodes[2], agents[2]

    def logs() -> str:
        rows = list(DeploymentNode.objects.values("node__name", "state", "phase", "error"))
        return f"{rows}\n--- worker\n{worker.log()[-4000:]}"

    deployment = deploy_file(server, nodes, hashlib.sha256(content).hexdigest())
    wait_until(lambda: row_on(deployment, victim).bytes_done > 0, timeout_s=30, what=logs)
    victim_agent.kill()

    def settled() -> bool:
        return not deployment.nodes.filter(state__in=["pending", "running"]).exists()

    wait_until(settled, timeout_s=60, what=logs)
    rows = {row.node.name: row for row in deployment.nodes.select_related("node")}
    assert [rows[name].state for name in ("node-a", "node-b", "node-c")] == [
        "succeeded",
        "succeeded",
        "failed",
    ]
    assert rows["node-c"].error == (
        "node node-c stopped answering while downloading: connection refused"
    )
    assert Deployment.objects.get(pk=deployment.pk).state == "failed"

    victim_agent.start()
    requests_before = len(server.requests)
    retried = services.retry_failed(deployment)
    assert [row.node.name for row in retried] == ["node-c"]

    wait_until(lambda: row_on(deployment, victim).state == "succeeded", timeout_s=60, what=logs)
    rows = {row.node.name: row for row in deployment.nodes.select_related("node")}
    assert [(name, row.attempt) for name, row in sorted(rows.items())] == [
        ("node-a", 1),
        ("node-b", 1),
        ("node-c", 2),
    ]
    resumed = [
        int(match.group(1))
        for header in server.ranges()[requests_before:]
        if header and (match := re.fullmatch(r"bytes=(\d+)-", header))
    ]
    assert resumed and resumed[0] > 0, server.requests
    served = NodeModel.objects.filter(model_id=MODEL).values_list("node__name", flat=True)
    assert sorted(served) == ["node-a", "node-b", "node-c"]


def test_a_checksum_mismatch_fails_naming_both_digests(db: None, tmp_path: Path) -> None:
    content = os.urandom(256 * 1024)
    wrong = "0" * 64
    with running_agent(tmp_path) as agent, serving_file(content) as server:
        node = fleet_node(agent, "node-a")
        row = deploy_file(server, [node], wrong).nodes.get()

        assert services.run_node(row.pk) == "failed"

    row.refresh_from_db()
    assert row.state == NodeState.FAILED
    assert row.phase == "verifying"
    assert row.error.startswith("sha256 mismatch")
    assert f"expected {wrong}" in row.error
    assert f"got {hashlib.sha256(content).hexdigest()}" in row.error
    assert row.log[-1] == row.error
    assert not NodeModel.objects.filter(node=node).exists()


def test_an_unreachable_hugging_face_hub_fails_saying_so(db: None, tmp_path: Path) -> None:
    hub = f"http://127.0.0.1:{free_port()}"
    with running_agent(tmp_path, env={"HF_ENDPOINT": hub}) as agent:
        node = fleet_node(agent, "node-a")
        deployment = services.create_deployment(
            name="from the hub",
            nodes=[node],
            runtime="simulator",
            model_source="hf",
            model_location="example/tiny",
            model_file="tiny.bin",
            model_name=MODEL,
        )
        row = deployment.nodes.get()

        assert services.run_node(row.pk) == "failed"

    row.refresh_from_db()
    assert row.phase == "downloading"
    assert row.error.startswith(f"cannot reach the Hugging Face hub at {hub}: "), row.error
