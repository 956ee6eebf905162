"""Live pools page: a change to pools or targets reaches signed-in pages over /ws/pools/."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.db import transaction
from django.test import Client

from nexus.asgi import application
from pools.models import Pool
from tests.nexus.factories import make_pool, make_target, make_user

ORIGIN = (b"origin", b"http://127.0.0.1")


def session_cookie(username: str) -> tuple[bytes, bytes]:
    """Return a Cookie header that signs in a new user."""
    client = Client()
    client.force_login(make_user(username))
    name = settings.SESSION_COOKIE_NAME
    return (b"cookie", f"{name}={client.cookies[name].value}".encode())


@pytest.fixture
async def teammate_socket(transactional_db: None) -> AsyncIterator[WebsocketCommunicator]:
    cookie = await sync_to_async(session_cookie)("teammate")
    socket = WebsocketCommunicator(application, "/ws/pools/", headers=[ORIGIN, cookie])
    connected, _ = await socket.connect()
    assert connected
    yield socket
    await socket.disconnect()


async def test_an_outsider_is_refused(transactional_db: None) -> None:
    socket = WebsocketCommunicator(application, "/ws/pools/", headers=[ORIGIN])

    connected, code = await socket.connect()

    assert (connected, code) == (False, 1000)


async def test_a_saved_pool_is_pushed_as_the_pools_table(
    teammate_socket: WebsocketCommunicator,
) -> None:
    await sync_to_async(make_pool)("chat", name="Chat models")

    fragment = await teammate_socket.receive_from(timeout=5)

    assert fragment.lstrip().startswith('<section id="pools-table" hx-swap-oob="true">')
    assert "Chat models" in fragment
    assert "@pool/chat" in fragment


async def test_a_changed_target_is_pushed_with_its_pool(
    teammate_socket: WebsocketCommunicator,
) -> None:
    pool = await sync_to_async(make_pool)("chat")
    await teammate_socket.receive_from(timeout=5)

    await sync_to_async(make_target)(pool, "gpu-a", credential="sk-secret-value")
    fragment = await teammate_socket.receive_from(timeout=5)

    assert "gpu-a" in fragment
    assert "<td>stored</td>" in fragment
    assert "sk-secret-value" not in fragment


async def test_a_rolled_back_change_is_never_pushed(
    teammate_socket: WebsocketCommunicator,
) -> None:
    def create_then_roll_back() -> None:
        with transaction.atomic():
            make_pool("ghost")
            transaction.set_rollback(True)

    await sync_to_async(create_then_roll_back)()

    assert await teammate_socket.receive_nothing(timeout=0.5)
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
        caplog.at_level(logging.WARNING, logger="pools.live"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        make_pool("chat")

    assert Pool.objects.filter(slug="chat").exists()
    assert [r.getMessage() for r in caplog.records] == [
        "could not send pools.changed to group pools"
    ]
