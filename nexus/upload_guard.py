"""Refuse a request whose declared body is larger than any upload may be, before it is read.

Django under ASGI reads the whole body before a view runs, so the model-folder upload's own check
(`serving.folders`) would refuse a 50 GB upload only once it had arrived. This guard reads the
declared Content-Length instead and answers 413 at once, in two places:

- `guard(app)`, around Django's ASGI application: enough for servers that start the application
  as soon as the headers are in (uvicorn);
- `install_in_daphne()`: daphne (on Twisted) writes the whole body to a temporary file before it
  starts the application at all, so there the refusal must come from its request's `gotLength`.

A request without a Content-Length (chunked) is left to the upload's own streaming check.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from serving.folders import MULTIPART_SLACK_BYTES, UploadTooLarge, max_upload_bytes

ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


def body_limit() -> int:
    """Return the largest body a request may declare: the largest upload, with its framing."""
    return max_upload_bytes() + MULTIPART_SLACK_BYTES


def declared_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    """Return the Content-Length the headers declare; None when absent or not a number."""
    for name, value in headers:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                # Malformed: the server or Django refuses it with its own 400.
                return None
    return None


def too_large(length: int | None) -> bool:
    """Say whether a declared length is over the limit."""
    return length is not None and length > body_limit()


def refusal_body() -> bytes:
    """Return the 413's JSON body, naming the limit and the setting that chose it."""
    return json.dumps({"detail": str(UploadTooLarge(max_upload_bytes()))}).encode()


def guard(app: ASGIApp) -> ASGIApp:
    """Wrap an HTTP ASGI app so that a request declaring too large a body gets 413 unread."""

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not too_large(declared_length(scope["headers"])):
            await app(scope, receive, send)
            return
        body = refusal_body()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    # The unread body must not be taken for the connection's next request.
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return guarded


def install_in_daphne() -> None:
    """Make daphne answer 413 and close as soon as a too large declared length arrives."""
    from daphne.http_protocol import WebRequest

    received = WebRequest.gotLength

    def got_length(request: WebRequest, length: int | None) -> None:
        # First as usual: bytes that came with the headers still have a file to go to.
        received(request, length)
        if not too_large(length):
            return
        # Twisted answers "Expect: 100-continue" right after this: it must not invite the body.
        request.requestHeaders.removeHeader(b"expect")
        body = refusal_body()
        head = (
            b"HTTP/1.1 413 Content Too Large\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
        )
        transport = request.channel.transport
        transport.write(head + body)
        # Stops reading at once: the body is never received, daphne never starts the app.
        transport.loseConnection()

    WebRequest.gotLength = got_length
