"""Live nodes page: the table reaches signed-in pages over /ws/nodes/ after every change and every
refresh round, with each node's state, why it is offline, and when it was last seen."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.utils import timezone

from nexus import live
from nodes import services
from nodes.models import Node, NodeStatus
from tests.deployments.factories import make_node
from tests.support.ports import free_port
from tests.support.sockets import refusal, signed_in_socket


def silent_node(name: str) -> Node:
    """Return a trusted node, online a minute ago, whose agent no longer answers."""
    node = make_node(name, address=f"http://127.0.0.1:{free_port()}")
    Node.objects.filter(pk=node.pk).update(last_seen_at=timezone.now() - timedelta(minutes=1))
    return node


@pytest.fixture
async def teammate_socket(transactional_db: None) -> AsyncIterator[WebsocketCommunicator]:
    socket = await signed_in_socket("/ws/nodes/", "teammate")
    state = await socket.receive_from(timeout=5)
    assert '<section class="card" id="nodes-table" hx-swap-oob="true">' in state
    assert "No nodes yet" in state
    assert "Add node" not in state  # the teammate's version: they may not add one
    yield socket
    await socket.disconnect()


async def test_an_outsider_is_refused(transactional_db: None) -> None:
    assert await refusal("/ws/nodes/") == (False, 1000)


async def test_a_node_that_stops_answering_is_pushed_offline_with_why_and_last_seen(
    teammate_socket: WebsocketCommunicator,
) -> None:
    node = await sync_to_async(silent_node)("gpu-1")
    await teammate_socket.receive_from(timeout=5)  # the node, added

    summary = await sync_to_async(services.refresh_nodes)()
    fragment = await teammate_socket.receive_from(timeout=5)

    assert summary == {"offline": 1}
    row = fragment[fragment.index('<tr id="node-gpu-1"') :].split("</tr>")[0]
    assert 'data-state="offline"' in row
    assert "Offline (since just now, connection refused)" in row
    refreshed = await Node.objects.aget(pk=node.pk)
    assert refreshed.status == NodeStatus.OFFLINE
    assert f'datetime="{refreshed.last_seen_at.isoformat()}"' in row
    assert ">1 min ago</time>" in row


async def test_a_refresh_round_pushes_the_table_once_for_the_whole_fleet(
    transactional_db: None,
) -> None:
    await sync_to_async(silent_node)("gpu-1")
    await sync_to_async(silent_node)("gpu-2")
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(live.group("nodes", "view"), channel)

    await sync_to_async(services.refresh_nodes)()

    pushed = await layer.receive(channel)
    assert pushed["type"] == "live.fragments"
    assert pushed["key"] == "nodes-table"
    assert pushed["html"].count('data-state="offline"') == 2
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.5):
            await layer.receive(channel)
    await layer.group_discard(live.group("nodes", "view"), channel)
