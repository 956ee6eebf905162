"""The live-page pattern through the real ASGI app (nexus.live, nexus.consumers), driven through
the style guide's socket: who may connect, the state on connect, pushes merged to about one
frame a second, and fragments per audience."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User

from nexus import live
from nexus.ui.views import KIT_TOPIC
from tests.support.sockets import refusal, signed_in_socket

PATH = "/ws/ui/kit/"


@pytest.fixture
async def owner_socket(transactional_db: None) -> AsyncIterator[WebsocketCommunicator]:
    socket = await signed_in_socket(PATH, "owner", staff=True)
    yield socket
    await socket.disconnect()


def push(key: str, html: str, **kwargs: live.Audience) -> None:
    live.push(KIT_TOPIC, key, html, **kwargs)


async def test_anonymous_and_refused_users_get_no_socket(transactional_db: None) -> None:
    assert await refusal(PATH) == (False, 1000)
    assert await refusal(PATH, "teammate") == (False, 1000)


async def test_a_page_gets_the_current_state_as_it_connects(
    owner_socket: WebsocketCommunicator,
) -> None:
    state = await owner_socket.receive_from(timeout=5)

    assert state.lstrip().startswith('<p id="kit-live" hx-swap-oob="true">Rendered by the server')


async def test_pushes_within_a_second_wait_and_are_merged_by_key_latest_last(
    owner_socket: WebsocketCommunicator,
) -> None:
    await owner_socket.receive_from(timeout=5)
    loop = asyncio.get_running_loop()
    state_at = loop.time()

    await sync_to_async(push)("a", "<p id='a'>a1</p>")
    await sync_to_async(push)("b", "<p id='b'>b1</p>")
    await sync_to_async(push)("a", "<p id='a'>a2</p>")
    frame = await owner_socket.receive_from(timeout=5)

    assert frame == "<p id='b'>b1</p><p id='a'>a2</p>"
    assert loop.time() - state_at >= 0.9
    assert await owner_socket.receive_nothing(timeout=0.3)


async def test_a_push_after_a_quiet_second_goes_out_at_once(
    owner_socket: WebsocketCommunicator,
) -> None:
    await owner_socket.receive_from(timeout=5)
    await asyncio.sleep(1.05)  # the quiet second is the behaviour under test, not an ordering
    loop = asyncio.get_running_loop()

    pushed_at = loop.time()
    await sync_to_async(push)("a", "<p id='a'>now</p>")

    assert await owner_socket.receive_from(timeout=5) == "<p id='a'>now</p>"
    assert loop.time() - pushed_at < 0.5


async def test_a_fragment_for_one_audience_reaches_only_its_pages(
    owner_socket: WebsocketCommunicator,
) -> None:
    await owner_socket.receive_from(timeout=5)

    await sync_to_async(push)("actions", "<div id='actions'>view</div>", audience="view")
    await sync_to_async(push)("actions", "<div id='actions'>manage</div>", audience="manage")

    assert await owner_socket.receive_from(timeout=5) == "<div id='actions'>manage</div>"
    assert await owner_socket.receive_nothing(timeout=1.2)


def test_a_staff_member_manages_and_anyone_else_views() -> None:
    assert live.audience_of(User(username="owner", is_staff=True)) == "manage"
    assert live.audience_of(User(username="teammate")) == "view"


async def test_a_page_that_stays_quiet_keeps_its_socket(
    owner_socket: WebsocketCommunicator,
) -> None:
    await owner_socket.receive_from(timeout=5)

    # Longer than the channel layer's blocking receive (5 s in channels_redis): a Redis read
    # timeout shorter than that once closed every socket after 2 s of quiet.
    await asyncio.sleep(6)
    await sync_to_async(push)("a", "<p id='a'>later</p>")

    assert await owner_socket.receive_from(timeout=5) == "<p id='a'>later</p>"
