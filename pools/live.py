"""The one typed gateway from Smart Balancer changes to the pages' channel layer groups."""

from __future__ import annotations

import logging
from typing import Literal, TypedDict

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.template.loader import render_to_string

from pools.views import POOLS_TABLE, pools_table_context

logger = logging.getLogger(__name__)

POOLS_GROUP = "pools"


class PoolsChanged(TypedDict):
    """The pools table, re-rendered for the pages to swap in by its id."""

    type: Literal["pools.changed"]
    html: str


def send(group: str, message: PoolsChanged) -> None:
    """Send a message to a group; a missing channel layer must not fail the caller's save."""
    try:
        layer = get_channel_layer()
        if layer is not None:  # None only without CHANNEL_LAYERS, which settings always set
            async_to_sync(layer.group_send)(group, dict(message))
    except Exception:
        logger.warning("could not send %s to group %s", message["type"], group, exc_info=True)


def pools_changed() -> None:
    """Push the current pools table to every open pools page."""
    html = render_to_string(POOLS_TABLE, {**pools_table_context(), "oob": True})
    send(POOLS_GROUP, {"type": "pools.changed", "html": html})
