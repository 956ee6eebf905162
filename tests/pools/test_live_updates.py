"""Live pools page: a change to pools or targets reaches staff's pages over /ws/pools/, as the
same table partial the page shows; anyone else's socket gets their projects' table as it
connects, and no pushes."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import transaction

from nodes import services
from pools.models import Pool
from tests.deployments.factories import make_node
from tests.nexus.factories import make_pool, make_target
from tests.support.ports import free_port
from tests.support.sockets import refusal, signed_in_socket


@pytest.fixture
async def staff_socket(transactional_db: None) -> AsyncIterator[WebsocketCommunicator]:
    socket = await signed_in_socket("/ws/pools/", "operator", staff=True)
    state = await socket.receive_from(timeout=5)  # the state on connect, an empty table here
    assert "No pools yet" in state
    yield socket
    await socket.disconnect()


async def test_an_outsider_is_refused(transactional_db: None) -> None:
    assert await refusal("/ws/pools/") == (False, 1000)


async def test_a_saved_pool_is_pushed_as_the_pools_table(
    staff_socket: WebsocketCommunicator,
) -> None:
    await sync_to_async(make_pool)("chat", name="Chat models")

    fragment = await staff_socket.receive_from(timeout=5)

    assert fragment.lstrip().startswith('<section id="pools-table" hx-swap-oob="true">')
    assert "Chat models" in fragment
    assert "@pool/chat" in fragment


async def test_a_changed_target_is_pushed_with_its_pool(
    staff_socket: WebsocketCommunicator,
) -> None:
    pool = await sync_to_async(make_pool)("chat")
    await staff_socket.receive_from(timeout=5)

    await sync_to_async(make_target)(pool, "gpu-a", credential="sk-secret-value")
    fragment = await staff_socket.receive_from(timeout=5)

    assert "gpu-a" in fragment
    assert "<td>stored</td>" in fragment
    assert "sk-secret-value" not in fragment


async def test_a_rolled_back_change_is_never_pushed(
    staff_socket: WebsocketCommunicator,
) -> None:
    def create_then_roll_back() -> None:
        with transaction.atomic():
            make_pool("ghost")
            transaction.set_rollback(True)

    await sync_to_async(create_then_roll_back)()

    assert await staff_socket.receive_nothing(timeout=0.5)
    assert not await Pool.objects.filter(slug="ghost").aexists()


@pytest.mark.django_db
def test_a_save_succeeds_when_the_channel_layer_is_unreachable(
    settings, caplog: pytest.LogCaptureFixture, django_capture_on_commit_callbacks
) -> None:
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [f"unix://{settings.DATA_DIR}/no-such-redis.sock"]},
        }
    }

    with (
        caplog.at_level(logging.WARNING, logger="nexus.live"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        make_pool("chat")

    assert Pool.objects.filter(slug="chat").exists()
    assert [r.getMessage() for r in caplog.records] == [
        "could not send live.fragments to group live.pools.manage",
    ]


async def test_a_target_whose_node_goes_offline_is_pushed_as_such(
    staff_socket: WebsocketCommunicator,
) -> None:
    def pool_on_a_silent_node() -> None:
        node = make_node("gpu-1", address=f"http://127.0.0.1:{free_port()}")
        make_target(make_pool("chat"), "on-gpu-1", node=node)

    await sync_to_async(pool_on_a_silent_node)()
    await staff_socket.receive_from(timeout=5)  # the pool, created

    await sync_to_async(services.refresh_nodes)()
    fragment = await staff_socket.receive_from(timeout=5)

    row = fragment[fragment.index(">on-gpu-1</td>") :].split("</tr>")[0]
    assert 'data-tone="bad" data-state="node_offline"' in row
    assert "Node offline (since just now, connection refused)" in row
