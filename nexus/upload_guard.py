"""Bound every request body Django receives, by what its path may carry, as the bytes arrive.

Model-folder uploads may carry a file up to NEXUS_MAX_UPLOAD_BYTES (with multipart framing);
every other page and admin API path at most NEXUS_MAX_BODY_BYTES. Django under ASGI reads the
whole body, spooling it to a temporary file, before a view (and its authentication) runs, so
without this a chunked body of any size would be written to disk for an anonymous caller. The
limit is kept in two places:

- `guard(app)`, around Django's ASGI application: for servers that start the application as soon
  as the headers are in (uvicorn). A declared length over the limit gets 413 unread; a chunked
  body is counted as it is received and cut off (Django sees the client leave) the moment it
  passes the limit, then answered 413;
- `install_in_daphne()`: daphne (on Twisted) writes the whole body to a temporary file before it
  starts the application at all, so there the refusal comes from its request's `gotLength` (a
  declared length) or from the body file, which refuses to grow past the limit (chunked).

The gateway's paths (/v1, /serve) have their own, stricter handling in pools.gateway.limits.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from django.conf import settings
from django.template.defaultfilters import filesizeformat

from serving.folders import MULTIPART_SLACK_BYTES, UploadTooLarge, max_upload_bytes

ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]

# The page's upload form and the API's file upload: the only paths that take large bodies.
UPLOAD_PATHS = re.compile(r"^/(?:models/[^/]+/upload/|api/v1/model-folders/[^/]+/files/)")


def is_upload(path: str) -> bool:
    return UPLOAD_PATHS.match(path) is not None


def body_limit(path: str) -> int:
    """Return the largest body a request to the path may carry."""
    if is_upload(path):
        return max_upload_bytes() + MULTIPART_SLACK_BYTES
    return settings.NEXUS_MAX_BODY_BYTES


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


def refusal_body(path: str) -> bytes:
    """Return the 413's JSON body, naming the limit and the setting that chose it."""
    if is_upload(path):
        detail = str(UploadTooLarge(max_upload_bytes()))
    else:
        limit = settings.NEXUS_MAX_BODY_BYTES
        detail = (
            f"The request body is larger than {filesizeformat(limit)} ({limit} bytes, set by"
            " NEXUS_MAX_BODY_BYTES); it was not read."
        )
    return json.dumps({"detail": detail}).encode()


def refusal_response(path: str) -> bytes:
    """Return the whole 413 answer, closing the connection: the unread body is never read."""
    body = refusal_body(path)
    return (
        b"HTTP/1.1 413 Content Too Large\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
    ) + body


async def _refuse(send: Any, path: str) -> None:
    body = refusal_body(path)
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


def guard(app: ASGIApp) -> ASGIApp:
    """Wrap an HTTP ASGI app so that no request body past its path's limit is read."""

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope["path"]
        limit = body_limit(path)
        declared = declared_length(scope["headers"])
        if declared is not None:
            if declared > limit:
                await _refuse(send, path)
            else:
                await app(scope, receive, send)
            return
        received = 0
        over = False
        answered = False

        async def counted() -> dict[str, Any]:
            nonlocal received, over
            if over:
                return {"type": "http.disconnect"}
            message: dict[str, Any] = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # Django stops reading on a disconnect (RequestAborted) and answers nothing.
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def sent(message: dict[str, Any]) -> None:
            nonlocal answered
            answered = True
            await send(message)

        await app(scope, counted, sent)
        if over and not answered:
            await _refuse(send, path)

    return guarded


class _CappedFile:
    """daphne's body file for one request, which refuses (once) to grow past the limit."""

    def __init__(self, file: Any, limit: int, refuse: Callable[[], None]) -> None:
        self._file = file
        self._limit = limit
        self._refuse = refuse
        self._written = 0
        self.refused = False

    def write(self, data: bytes) -> int:
        if self.refused:
            return 0
        self._written += len(data)
        if self._written > self._limit:
            self.refused = True
            self._file.close()
            self._refuse()
            return 0
        written: int = self._file.write(data)
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


def install_in_daphne() -> None:
    """Make daphne answer 413 and close as soon as a body passes its path's limit."""
    from daphne.http_protocol import WebRequest

    received = WebRequest.gotLength

    def got_length(request: WebRequest, length: int | None) -> None:
        # First as usual: bytes that came with the headers still have a file to go to.
        received(request, length)
        channel: Any = request.channel
        path = channel._path.partition(b"?")[0].decode("latin-1")

        def refuse() -> None:
            # Seen by pools.gateway.limits' process hook: daphne never starts the app for it.
            request._nexus_refused = True
            # Twisted answers "Expect: 100-continue" right after this: it must not invite the body.
            request.requestHeaders.removeHeader(b"expect")
            transport = channel.transport
            if transport is not None and not transport.disconnecting:
                transport.write(refusal_response(path))
                # Stops reading at once: the rest of the body is never received.
                transport.loseConnection()

        limit = body_limit(path)
        if length is None:
            request.content = _CappedFile(request.content, limit, refuse)
        elif length > limit:
            refuse()

    WebRequest.gotLength = got_length
