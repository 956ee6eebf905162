"""Typed factories for nodes and deployments in the deployments tests."""

from __future__ import annotations

from typing import Any

from deployments.models import Deployment, DeploymentNode, ModelSource, NodeState, Runtime
from nodes.models import Node, NodeStatus, NodeTrust

SHA256 = "ab" * 32


def make_node(
    name: str,
    *,
    trust: str = NodeTrust.TRUSTED,
    status: str = NodeStatus.ONLINE,
    address: str = "",
    credential: str = "node-secret",
) -> Node:
    """Create a node in the given trust and status, without an agent behind it."""
    node = Node(name=name, address=address or f"http://{name}.lan:7100", trust=trust, status=status)
    node.set_credential(credential)
    node.save()
    return node


def make_deployment(name: str, nodes: dict[Node, str], **fields: Any) -> Deployment:
    """Create a deployment whose node rows are in the given states; nothing is queued."""
    deployment = Deployment.objects.create(
        name=name,
        runtime=fields.pop("runtime", Runtime.SIMULATOR),
        model_source=fields.pop("model_source", ModelSource.HTTP),
        model_location=fields.pop("model_location", "http://files.lan/demo.bin"),
        model_name=fields.pop("model_name", "demo-1b"),
        **fields,
    )
    for node, state in nodes.items():
        DeploymentNode.objects.create(
            deployment=deployment,
            node=node,
            state=state,
            error="boom" if state == NodeState.FAILED else "",
        )
    return deployment
