"""What deployment progress pushes to the open deployment pages (nexus.live has the pattern)."""

from __future__ import annotations

from collections.abc import Callable

from deployments.models import Deployment, DeploymentNode
from nexus import live

# The detail page's partials that a push swaps in by their ids (templates/deployments/).
NODE_TABLE = "deployments/deployment_detail.html#node-table"
SUMMARY = "deployments/deployment_detail.html#deployment-summary"


def topic(deployment_id: int) -> str:
    """Return the live topic of one deployment's open pages."""
    return f"deployment-{deployment_id}"


def with_nodes(deployment_id: int) -> Deployment | None:
    """Return the deployment with its node rows and their nodes, or None when it is gone."""
    return Deployment.objects.prefetch_related("nodes__node").filter(pk=deployment_id).first()


def summary(deployment: Deployment, audience: live.Audience) -> str:
    """Return the deployment's summary (state, and the retry button for those who may retry)."""
    context = {"deployment": deployment, "can_manage": audience == "manage"}
    return live.fragment(SUMMARY, context)


def current(deployment_id: int, audience: live.Audience) -> str:
    """Return the nodes table and the summary as they are now, rendered for a push."""
    deployment = with_nodes(deployment_id)
    return renderer(deployment)(audience) if deployment is not None else ""


def node_changed(row_id: int) -> None:
    """Push a node row's deployment as it is now (its nodes table and summary) to its pages."""
    row = DeploymentNode.objects.filter(pk=row_id).values_list("deployment_id", flat=True)
    deployment = with_nodes(row.first() or 0)
    if deployment is not None:
        live.push_each_audience(topic(deployment.pk), "nodes", renderer(deployment))


def renderer(deployment: Deployment) -> Callable[[live.Audience], str]:
    """Return what an audience is pushed: the nodes table (the same for all) and its summary."""
    table = live.fragment(NODE_TABLE, {"deployment": deployment})
    return lambda audience: table + summary(deployment, audience)
