"""Limits enforced as a request arrives, before any work: URL, headers, their pace, the body.

Two servers run the ASGI application and they differ in what reaches it (docs/reliability.md):

- uvicorn starts the application once the headers are in and hands it the body as it arrives:
  `guard(app)` refuses an oversized URL (414) or header block (431), and the gateway itself
  authenticates from the headers and counts body bytes as they come (pools.gateway.app).
- daphne (Twisted) would read a whole body (to a temporary file past 100 kB) before starting the
  application, and drops an over-long line without an answer. `install_in_daphne()` changes
  its request parsing so that the answer comes from the headers: 414/431 as JSON, 408 when the
  headers take longer than NEXUS_HEADER_TIMEOUT_S, and for /v1 and /serve a refusal by the
  gateway (401/403/404/405/413) before a byte of the body is kept; a body it accepts is held in
  memory up to NEXUS_MAX_BODY_BYTES and refused with 413 the moment it passes that; a body
  that stops arriving for NEXUS_BODY_TIMEOUT_S gets 408.
- uvicorn has no header or body timeout at all: `install_in_uvicorn()` adds both to its
  protocols (httptools, the documented one, and h11), with the same 408s.
"""

from __future__ import annotations

import io
from collections.abc import Awaitable, Callable
from typing import Any, Protocol
from urllib.parse import unquote

from django.conf import settings

from pools.gateway import errors
from pools.gateway.app import SERVE_PREFIX, new_request_id
from pools.gateway.errors import GatewayError

ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
GATEWAY_PREFIXES = ("/v1/", SERVE_PREFIX)
# The request line around its target: method, spaces and "HTTP/1.1".
REQUEST_LINE_SLACK = 32


class Refusals(Protocol):
    """What the gateway refuses from the headers alone (pools.gateway.app.Gateway.refusal)."""

    def refusal(
        self, method: str, path: str, headers: list[tuple[bytes, bytes]]
    ) -> GatewayError | None: ...


def over_limits(scope: dict[str, Any]) -> GatewayError | None:
    """Return the refusal of a request whose URL or header block is too large, else None."""
    url_limit: int = settings.NEXUS_MAX_URL_BYTES
    if len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"") > url_limit:
        return errors.url_too_long(url_limit)
    header_limit: int = settings.NEXUS_MAX_HEADER_BYTES
    # name: value\r\n, as they came on the wire.
    size = sum(len(name) + len(value) + 4 for name, value in scope["headers"])
    if size > header_limit:
        return errors.headers_too_large(header_limit)
    return None


def guard(app: ASGIApp) -> ASGIApp:
    """Wrap an HTTP ASGI app so that an oversized URL or header block is refused unread."""

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        refusal = over_limits(scope)
        if refusal is None:
            await app(scope, receive, send)
            return
        body = refusal.body()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"x-nexus-request-id", new_request_id().encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return guarded


def raw_response(error: GatewayError) -> bytes:
    """Return an HTTP/1.1 answer carrying the error, that closes the connection."""
    body = error.body()
    head = [
        f"HTTP/1.1 {error.status} {_REASONS.get(error.status, 'Error')}".encode(),
        b"content-type: application/json",
        b"content-length: %d" % len(body),
        b"x-nexus-request-id: " + new_request_id().encode(),
        b"connection: close",
        *(name + b": " + value for name, value in error.headers),
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


_REASONS = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Content Too Large",
    414: "URI Too Long",
    431: "Request Header Fields Too Large",
}


class _BoundedBody(io.BytesIO):
    """A request body held in memory that refuses (once) to grow past its limit."""

    def __init__(self, limit: int, refuse: Callable[[], None]):
        super().__init__()
        self._limit = limit
        self._refuse = refuse
        self.refused = False

    def write(self, data: Any) -> int:
        if self.refused:
            return 0
        if self.tell() + len(data) > self._limit:
            self.refused = True
            self._refuse()
            return 0
        return super().write(data)


def install_in_daphne(gateway: Refusals) -> None:
    """Make daphne judge every request from its headers first (see the module docstring)."""
    from daphne.http_protocol import WebRequest
    from twisted.web.http import HTTPChannel

    url_limit: int = settings.NEXUS_MAX_URL_BYTES
    header_limit: int = settings.NEXUS_MAX_HEADER_BYTES
    header_timeout_s: float = settings.NEXUS_HEADER_TIMEOUT_S
    body_timeout_s: float = settings.NEXUS_BODY_TIMEOUT_S
    body_limit: int = settings.NEXUS_MAX_BODY_BYTES
    # Twisted's own limits, raised so that ours, which answer, always come first.
    HTTPChannel.MAX_LENGTH = max(url_limit + REQUEST_LINE_SLACK, header_limit) + 1
    HTTPChannel.totalHeadersSize = url_limit + header_limit + 2 * REQUEST_LINE_SLACK

    def refuse(channel: Any, error: GatewayError) -> None:
        """Answer and close; nothing more is read from the connection."""
        channel._nexus_refused = True
        if channel.requests:
            channel.requests[-1]._nexus_refused = True
        transport = channel.transport
        if transport is not None and not transport.disconnecting:
            transport.write(raw_response(error))
            transport.loseConnection()

    def headers_late(channel: Any) -> None:
        channel._nexus_header_timer = None
        if channel._buffer or channel._receivedHeaderSize:
            refuse(channel, errors.headers_too_slow(header_timeout_s))
        elif channel.transport is not None:
            channel.transport.loseConnection()  # idle between requests: just close

    def arm_header_timer(channel: Any) -> None:
        disarm_header_timer(channel)
        channel._nexus_header_timer = channel.callLater(header_timeout_s, headers_late, channel)
        channel._nexus_header_bytes = 0

    def disarm_header_timer(channel: Any) -> None:
        timer = getattr(channel, "_nexus_header_timer", None)
        if timer is not None and timer.active():
            timer.cancel()
        channel._nexus_header_timer = None

    connection_made = HTTPChannel.connectionMade
    line_received = HTTPChannel.lineReceived
    all_headers_received = HTTPChannel.allHeadersReceived
    request_done = HTTPChannel.requestDone
    connection_lost = HTTPChannel.connectionLost
    data_received = HTTPChannel.dataReceived
    timeout_connection = HTTPChannel.timeoutConnection

    def on_connection_made(channel: Any) -> None:
        # Twisted's idle timeout (reset by every read, off while a request is handled) is the
        # body timeout: the header timer is the one that runs before the body.
        channel.timeOut = body_timeout_s
        connection_made(channel)
        arm_header_timer(channel)

    def on_timeout_connection(channel: Any) -> None:
        in_body = channel.requests and not channel.line_mode and not channel._handlingRequest
        if in_body:
            refuse(channel, errors.body_too_slow(body_timeout_s))
        else:
            timeout_connection(channel)

    def on_data_received(channel: Any, data: bytes) -> None:
        if getattr(channel, "_nexus_refused", False):
            return
        data_received(channel, data)

    def on_line_received(channel: Any, line: bytes) -> None:
        if getattr(channel, "_nexus_refused", False):
            return
        if channel._HTTPChannel__first_line:
            if len(line) > url_limit + REQUEST_LINE_SLACK:
                refuse(channel, errors.url_too_long(url_limit))
                return
        else:
            channel._nexus_header_bytes += len(line) + 2
            if channel._nexus_header_bytes > header_limit:
                refuse(channel, errors.headers_too_large(header_limit))
                return
        line_received(channel, line)

    def on_line_length_exceeded(channel: Any, line: bytes) -> None:
        if channel._HTTPChannel__first_line:
            refuse(channel, errors.url_too_long(url_limit))
        else:
            refuse(channel, errors.headers_too_large(header_limit))

    def on_all_headers_received(channel: Any) -> None:
        disarm_header_timer(channel)
        all_headers_received(channel)

    def on_request_done(channel: Any, request: Any) -> None:
        request_done(channel, request)
        if channel.persistent and channel.transport is not None:
            arm_header_timer(channel)

    def on_connection_lost(channel: Any, reason: Any) -> None:
        disarm_header_timer(channel)
        connection_lost(channel, reason)

    HTTPChannel.connectionMade = on_connection_made  # type: ignore[method-assign]
    HTTPChannel.dataReceived = on_data_received  # type: ignore[method-assign]
    HTTPChannel.lineReceived = on_line_received  # type: ignore[method-assign]
    HTTPChannel.lineLengthExceeded = on_line_length_exceeded  # type: ignore[method-assign]
    HTTPChannel.allHeadersReceived = on_all_headers_received  # type: ignore[method-assign]
    HTTPChannel.requestDone = on_request_done  # type: ignore[method-assign]
    HTTPChannel.connectionLost = on_connection_lost  # type: ignore[method-assign]
    HTTPChannel.timeoutConnection = on_timeout_connection  # type: ignore[method-assign]

    got_length = WebRequest.gotLength
    process = WebRequest.process

    def on_got_length(request: Any, length: int | None) -> None:
        # Twisted parses a POST's Content-Type with the email package (27 µs a request) only
        # to fill request.args with form fields, which daphne never reads: the application
        # gets the body as it came (twisted.web.http.Request's parsePOSTFormSubmission).
        request._parsePOSTFormSubmission = False
        channel = request.channel
        target: bytes = channel._path
        path = target.partition(b"?")[0].decode("latin-1")
        if not path.startswith(GATEWAY_PREFIXES):
            got_length(request, length)
            return
        headers = [
            (name.lower(), value)
            for name, values in request.requestHeaders.getAllRawHeaders()
            for value in values
        ]
        refusal = gateway.refusal(channel._command.decode("latin-1"), unquote(path), headers)
        if refusal is not None:
            # No "100 Continue" must invite the body that is refused.
            request.requestHeaders.removeHeader(b"expect")
            request.content = _BoundedBody(0, lambda: None)
            refuse(channel, refusal)
            return
        # Never a temporary file: the body stays in memory, and only up to the limit.
        request.content = _BoundedBody(
            body_limit, lambda: refuse(channel, errors.body_too_large(body_limit))
        )

    def on_process(request: Any) -> Any:
        if getattr(request, "_nexus_refused", False):
            return None
        return process(request)

    WebRequest.gotLength = on_got_length
    WebRequest.process = on_process


def install_in_uvicorn() -> None:
    """Give uvicorn's HTTP protocols (httptools and h11) a header and a body timeout.

    uvicorn has neither (slowloris; a body trickled a byte at a time). The header timer starts
    with the connection and with each request's first byte, and stops when the headers are
    complete; when it fires, the client hears 408 (or, idle before any byte of a request,
    nothing) and the connection is closed. The body timer runs only while a body is still
    arriving after a read left it incomplete (a body that comes with its headers costs no
    timer), and fires after NEXUS_BODY_TIMEOUT_S without a byte: 408 unless an answer has
    begun, then the connection is closed, and the application hears that the client left.
    Time when uvicorn itself stopped reading (flow control) does not count against the client.
    Patched in place: uvicorn resolves the protocol class before it imports the application,
    so a replaced class would go unused.
    """
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools not installed: uvicorn runs h11
        pass
    else:
        _install_in_httptools(HttpToolsProtocol)
    try:
        import h11
        from uvicorn.protocols.http.h11_impl import H11Protocol
    except ImportError:  # uvicorn not installed: nothing to guard
        return
    _install_in_h11(H11Protocol, h11)


def _header_timer(protocol: Any, started: Callable[[Any], bool]) -> None:
    """(Re)start the header timer; `started` says at expiry whether a request had begun."""
    _stop_timer(protocol, "_nexus_header_timer")
    timeout_s: float = settings.NEXUS_HEADER_TIMEOUT_S

    def headers_late() -> None:
        protocol._nexus_header_timer = None
        transport = protocol.transport
        if transport is None or transport.is_closing():
            return
        if started(protocol):
            transport.write(raw_response(errors.headers_too_slow(timeout_s)))
        transport.close()

    protocol._nexus_header_timer = protocol.loop.call_later(timeout_s, headers_late)


def _body_timer(protocol: Any, in_body: Callable[[Any], bool]) -> None:
    """Start the body timer unless it runs; it fires after the timeout without a body byte."""
    if getattr(protocol, "_nexus_body_timer", None) is not None:
        return
    timeout_s: float = settings.NEXUS_BODY_TIMEOUT_S

    def body_late() -> None:
        protocol._nexus_body_timer = None
        transport = protocol.transport
        if transport is None or transport.is_closing() or not in_body(protocol):
            return
        idle_s = protocol.loop.time() - protocol._nexus_body_at
        if idle_s < timeout_s or protocol.flow.read_paused:
            wait_s = timeout_s - idle_s if idle_s < timeout_s else timeout_s
            protocol._nexus_body_timer = protocol.loop.call_later(wait_s, body_late)
            return
        cycle = protocol.cycle
        if cycle is not None and not cycle.response_started:
            transport.write(raw_response(errors.body_too_slow(timeout_s)))
        transport.close()

    protocol._nexus_body_timer = protocol.loop.call_later(timeout_s, body_late)


def _stop_timer(protocol: Any, name: str) -> None:
    timer = getattr(protocol, name, None)
    if timer is not None:
        timer.cancel()
        setattr(protocol, name, None)


def _install_in_httptools(protocol_class: Any) -> None:
    def request_begun(protocol: Any) -> bool:
        return bool(getattr(protocol, "_nexus_request_begun", False))

    def in_body(protocol: Any) -> bool:
        return bool(getattr(protocol, "_nexus_in_body", False))

    connection_made = protocol_class.connection_made
    data_received = protocol_class.data_received
    message_begin = protocol_class.on_message_begin
    headers_complete = protocol_class.on_headers_complete
    body = protocol_class.on_body
    message_complete = protocol_class.on_message_complete
    connection_lost = protocol_class.connection_lost

    def on_connection_made(protocol: Any, transport: Any) -> None:
        connection_made(protocol, transport)
        protocol._nexus_request_begun = False
        _header_timer(protocol, request_begun)

    def on_data_received(protocol: Any, data: bytes) -> None:
        data_received(protocol, data)
        if in_body(protocol):
            _body_timer(protocol, in_body)

    def on_message_begin(protocol: Any) -> None:
        message_begin(protocol)
        protocol._nexus_request_begun = True
        _header_timer(protocol, request_begun)

    def on_headers_complete(protocol: Any) -> None:
        _stop_timer(protocol, "_nexus_header_timer")
        protocol._nexus_in_body = True
        protocol._nexus_body_at = protocol.loop.time()
        headers_complete(protocol)

    def on_body(protocol: Any, data: bytes) -> None:
        protocol._nexus_body_at = protocol.loop.time()
        body(protocol, data)

    def on_message_complete(protocol: Any) -> None:
        protocol._nexus_in_body = False
        _stop_timer(protocol, "_nexus_body_timer")
        message_complete(protocol)

    def on_connection_lost(protocol: Any, exc: Exception | None) -> None:
        _stop_timer(protocol, "_nexus_header_timer")
        _stop_timer(protocol, "_nexus_body_timer")
        connection_lost(protocol, exc)

    protocol_class.connection_made = on_connection_made
    protocol_class.data_received = on_data_received
    protocol_class.on_message_begin = on_message_begin
    protocol_class.on_headers_complete = on_headers_complete
    protocol_class.on_body = on_body
    protocol_class.on_message_complete = on_message_complete
    protocol_class.connection_lost = on_connection_lost


def _install_in_h11(protocol_class: Any, h11: Any) -> None:
    """h11 has no parser callbacks: the connection's state after each read tells the phase."""

    def request_begun(protocol: Any) -> bool:
        return protocol.conn.their_state is h11.IDLE and bool(protocol.conn.trailing_data[0])

    def in_body(protocol: Any) -> bool:
        return protocol.conn.their_state is h11.SEND_BODY

    connection_made = protocol_class.connection_made
    data_received = protocol_class.data_received
    connection_lost = protocol_class.connection_lost

    def on_connection_made(protocol: Any, transport: Any) -> None:
        connection_made(protocol, transport)
        _header_timer(protocol, request_begun)

    def on_data_received(protocol: Any, data: bytes) -> None:
        waiting_for_headers = protocol.conn.their_state is h11.IDLE
        data_received(protocol, data)
        state = protocol.conn.their_state
        if state is h11.IDLE:
            # A request's first bytes after an idle keep-alive connection: time its headers.
            if getattr(protocol, "_nexus_header_timer", None) is None:
                _header_timer(protocol, request_begun)
            return
        if waiting_for_headers:
            _stop_timer(protocol, "_nexus_header_timer")
        if state is h11.SEND_BODY:
            protocol._nexus_body_at = protocol.loop.time()
            _body_timer(protocol, in_body)
        else:
            _stop_timer(protocol, "_nexus_body_timer")

    def on_connection_lost(protocol: Any, exc: Exception | None) -> None:
        _stop_timer(protocol, "_nexus_header_timer")
        _stop_timer(protocol, "_nexus_body_timer")
        connection_lost(protocol, exc)

    protocol_class.connection_made = on_connection_made
    protocol_class.data_received = on_data_received
    protocol_class.connection_lost = on_connection_lost
