"""Drive an ASGI application as an HTTP server would, in the test's own event loop: no socket."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

Message = dict[str, Any]
Application = Callable[
    [dict[str, Any], Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
    Awaitable[None],
]


def http_scope(
    method: str,
    path: str,
    headers: Sequence[tuple[bytes, bytes]] = (),
    *,
    query_string: bytes = b"",
) -> dict[str, Any]:
    """Return the scope of one HTTP/1.1 request from 127.0.0.1."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query_string,
        "root_path": "",
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "headers": [(b"host", b"127.0.0.1"), *headers],
    }


async def call(
    app: Application,
    scope: dict[str, Any],
    body: bytes | None = b"",
    sent: list[Message] | None = None,
) -> list[Message]:
    """Send one request and return every message the application sent back.

    The client stays connected until the answer is complete, as a server's does. With body None,
    reading the request fails the test: the answer must come unread. `sent`: the list the
    messages are appended to as they come, for a test that watches an answer in progress.
    """
    incoming = [] if body is None else [{"type": "http.request", "body": body, "more_body": False}]
    sent = [] if sent is None else sent

    async def receive() -> Message:
        if body is None:
            raise AssertionError("the application read the body")
        if incoming:
            return incoming.pop(0)
        await asyncio.Event().wait()  # a connected client: nothing more to say
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent
