"""Live pages' websockets through the real ASGI app: a signed-in person's socket, or a refusal."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from nexus.asgi import application
from tests.nexus.factories import make_user

# What a browser sends: the ASGI app refuses sockets whose Origin is not the Host they came to.
ORIGIN = (b"origin", b"http://127.0.0.1")
HOST = (b"host", b"127.0.0.1")
# How long a refused socket's consumer may take to end once the browser is gone: it has nothing
# to finish, but its channel-layer receive (a blocking Redis read) outlives the disconnect, and
# the communicator would wait a full second for it before cancelling it anyway.
REFUSED_EXIT_S = 0.1


def session_cookie(username: str, *, staff: bool = False) -> tuple[bytes, bytes]:
    """Return a Cookie header that signs in a new user."""
    return cookie_of(make_user(username, staff=staff))


def cookie_of(user: User) -> tuple[bytes, bytes]:
    """Return a Cookie header that signs in the user."""
    client = Client()
    client.force_login(user)
    name = settings.SESSION_COOKIE_NAME
    return (b"cookie", f"{name}={client.cookies[name].value}".encode())


async def signed_in_socket(
    path: str, username: str, *, staff: bool = False
) -> WebsocketCommunicator:
    """Return a connected socket of a new user's page (disconnect it at the end)."""
    return await socket_of(path, await sync_to_async(make_user)(username, staff=staff))


async def socket_of(path: str, user: User) -> WebsocketCommunicator:
    """Return a connected socket of the user's page (disconnect it at the end)."""
    cookie = await sync_to_async(cookie_of)(user)
    socket = WebsocketCommunicator(application, path, headers=[ORIGIN, HOST, cookie])
    connected, _ = await socket.connect()
    assert connected, f"{user.username} could not open {path}"
    return socket


async def refusal(path: str, username: str = "", *, staff: bool = False) -> tuple[bool, int | None]:
    """Return how the socket of a page opened anonymously (or by a new user) was answered.

    The socket is then disconnected, as a browser does: nothing is left running after the test.
    """
    headers = [ORIGIN, HOST]
    if username:
        headers.append(await sync_to_async(session_cookie)(username, staff=staff))
    return await answer_to(path, headers)


async def refused_socket(path: str, user: User) -> tuple[bool, int | None]:
    """Return how the user's socket of a page was answered, as `refusal` does."""
    return await answer_to(path, [ORIGIN, HOST, await sync_to_async(cookie_of)(user)])


async def answer_to(path: str, headers: list[tuple[bytes, bytes]]) -> tuple[bool, int | None]:
    """Open the socket with these headers, then disconnect it; return how it was answered."""
    socket = WebsocketCommunicator(application, path, headers=headers)
    answer = await socket.connect()
    await socket.disconnect(timeout=REFUSED_EXIT_S if not answer[0] else 1)
    return answer
