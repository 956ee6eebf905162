"""The one typed gateway from deployment progress to the deployment pages' channel layer groups."""

from __future__ import annotations

import logging
from typing import Literal, TypedDict

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.template.loader import render_to_string

from deployments.models import Deployment, DeploymentNode

logger = logging.getLogger(__name__)

# The detail page's partials that a push swaps in by their ids (templates/deployments/).
NODE_ROW = "deployments/deployment_detail.html#node-row"
SUMMARY = "deployments/deployment_detail.html#deployment-summary"


class NodeChanged(TypedDict):
    """A node row and the deployment's summary, re-rendered for the page to swap in by id."""

    type: Literal["deployment.node_changed"]
    html: str


def group_name(deployment_id: int) -> str:
    """Return the channel layer group of one deployment's open pages."""
    return f"deployment-{deployment_id}"


def send(group: str, message: NodeChanged) -> None:
    """Send a message to a group; a missing channel layer must not fail the caller's work."""
    try:
        layer = get_channel_layer()
        if layer is not None:  # None only without CHANNEL_LAYERS, which settings always set
            async_to_sync(layer.group_send)(group, dict(message))
    except Exception:
        logger.warning("could not send %s to group %s", message["type"], group, exc_info=True)


def node_changed(row_id: int) -> None:
    """Push a node row as it is now, with its deployment's summary, to the deployment's pages."""
    row = DeploymentNode.objects.select_related("node").filter(pk=row_id).first()
    if row is None:
        return
    deployment = Deployment.objects.prefetch_related("nodes").get(pk=row.deployment_id)
    html = render_to_string(NODE_ROW, {"row": row, "oob": True}) + render_to_string(
        SUMMARY, {"deployment": deployment, "oob": True}
    )
    send(group_name(deployment.pk), {"type": "deployment.node_changed", "html": html})
