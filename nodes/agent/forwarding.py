"""Forwarding to local runtimes: `/v1/*` by the body's model, and a process's own HTTP port.

Runtimes stay bound to loopback; callers reach them only through the agent and its credential.
Both routes open their request through `Upstream` and relay the answer with it, chunk by chunk.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from nodes.agent.bodies import parse_json_object
from nodes.agent.errors import AgentError, invalid
from nodes.agent.inventory import Inventory
from nodes.agent.processes import ProcessManager

logger = logging.getLogger(__name__)

# A runtime that does not accept the connection within this is unavailable.
CONNECT_TIMEOUT_S = 10.0
# Never relayed: hop-by-hop headers, the caller's credential (runtimes need none, and the node
# credential must not leak to them), what aiohttp sets itself, and Content-Encoding (aiohttp has
# already decoded the body it reads).
_DROPPED_REQUEST_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "cookie",
        "host",
        "content-length",
        "content-encoding",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
    }
)
_DROPPED_RESPONSE_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "trailer",
        "upgrade",
        "content-length",
        "date",
        "server",
        "set-cookie",
    }
)


def new_upstream_session() -> aiohttp.ClientSession:
    """Return the agent's one client session to its runtimes.

    Bodies pass through byte for byte (no decompression, no added Accept-Encoding), so a
    compressed or streamed response reaches the caller exactly as the runtime sent it.
    """
    return aiohttp.ClientSession(
        auto_decompress=False,
        skip_auto_headers=("Accept-Encoding", "User-Agent"),
        connector=aiohttp.TCPConnector(limit=0),
    )


class Upstream:
    """Requests to local runtimes over the agent's session, their answers relayed chunk by chunk."""

    def __init__(self, session: aiohttp.ClientSession, read_timeout_s: float) -> None:
        self._session = session
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=read_timeout_s
        )

    async def relay(
        self,
        request: web.Request,
        url: str | URL,
        *,
        target: str,
        body: Any = None,
        headers: CIMultiDict[str] | None = None,
    ) -> web.StreamResponse:
        """Send the request on to `url` and stream the runtime's answer back to the caller.

        `target` names the runtime in errors ("the runtime serving 'demo'"): 502 when it cannot
        be reached, 504 when it does not answer in time.
        """
        headers = _request_headers(request) if headers is None else headers
        upstream = await self._open(request.method, url, body, headers, target)
        try:
            return await _relay(request, upstream, url)
        except BaseException:
            # The caller went away (or the relay failed): drop the upstream connection so the
            # runtime sees the disconnect and frees the request's slot.
            upstream.close()
            raise
        finally:
            upstream.release()

    async def _open(
        self, method: str, url: str | URL, body: Any, headers: CIMultiDict[str], target: str
    ) -> aiohttp.ClientResponse:
        try:
            return await self._session.request(
                method, url, data=body, headers=headers, timeout=self._timeout
            )
        except TimeoutError:
            raise AgentError(
                504, "runtime_unavailable", f"{target} did not answer in time", kind="server_error"
            ) from None
        except aiohttp.ClientConnectorError as error:
            # Refused (or unresolvable, unroutable) before a byte of the request left.
            raise AgentError(
                502,
                "runtime_unavailable",
                f"{target} is unavailable: {error}",
                kind="server_error",
                not_delivered=True,
            ) from None
        except aiohttp.ClientError as error:
            raise AgentError(
                502, "runtime_unavailable", f"{target} is unavailable: {error}", kind="server_error"
            ) from None


class Forwarder:
    """The `/v1` routes: the node's model list and forwarding to runtimes."""

    def __init__(self, upstream: Upstream, inventory: Inventory) -> None:
        self._upstream = upstream
        self._inventory = inventory
        self._created = int(time.time())

    async def list_models(self, request: web.Request) -> web.Response:
        """GET /v1/models: the node's models in OpenAI's list shape."""
        seen: set[str] = set()
        data = []
        for model in await self._inventory.models():
            if model["id"] in seen:
                continue
            seen.add(model["id"])
            data.append(
                {
                    "id": model["id"],
                    "object": "model",
                    "created": self._created,
                    "owned_by": model["runtime"],
                }
            )
        return web.json_response({"object": "list", "data": data})

    async def forward(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/<path>: relay to the model's runtime, streaming its answer chunk by chunk."""
        raw = await request.read()
        model = parse_json_object(raw).get("model")
        if model is None:
            raise invalid("model", "required")
        if not isinstance(model, str):
            raise invalid("model", "expected a string")
        base_url = await self._inventory.base_url_for(model)
        if base_url is None:
            raise AgentError(404, "model_not_found", f"the model {model!r} is not served here")
        url = f"{base_url}/{request.match_info['path']}"
        if request.query_string:
            url += f"?{request.query_string}"
        return await self._upstream.relay(
            request, url, target=f"the runtime serving {model!r}", body=raw
        )


class ProcessProxy:
    """`ANY /agent/v1/processes/{id}/http/{path}`: any request to a process's loopback port."""

    def __init__(self, upstream: Upstream, processes: ProcessManager, max_body_bytes: int) -> None:
        self._upstream = upstream
        self._processes = processes
        self._max_body_bytes = max_body_bytes

    async def proxy(self, request: web.Request) -> web.StreamResponse:
        """Relay method, path, query and body (streamed) to the process; stream its answer back."""
        process_id = request.match_info["id"]
        state, port = self._processes.port_of(process_id)
        if state != "running":
            # 503, like a runtime that refuses the connection (502): a gateway in front takes
            # it as a refusal and moves the request to another replica, where a 409 would be
            # relayed to its client as the answer.
            raise AgentError(
                503,
                "process_not_running",
                f"process {process_id} is {state}, not running",
                kind="server_error",
                not_delivered=True,
            )
        if port is None:
            raise AgentError(
                409,
                "process_has_no_port",
                f"process {process_id} has no port to forward to",
                not_delivered=True,
            )
        # The raw path and query, so escapes such as %2F reach the process as the caller wrote
        # them; the raw path is /agent/v1/processes/<id>/http[/<path>].
        parts = request.rel_url.raw_path.split("/", 6)
        url = URL.build(
            scheme="http",
            host="127.0.0.1",
            port=port,
            path="/" + (parts[6] if len(parts) > 6 else ""),
            query_string=request.rel_url.raw_query_string,
            encoded=True,
        )
        headers = _request_headers(request)
        body = None
        if request.body_exists:
            length = request.content_length
            if length is not None and length > self._max_body_bytes:
                raise _too_large(self._max_body_bytes)
            if length is not None and "Content-Encoding" not in request.headers:
                # Declared, so the process gets it too (not every server reads chunked bodies).
                headers["Content-Length"] = str(length)
            body = _CappedBody(request, self._max_body_bytes)
        try:
            return await self._upstream.relay(
                request, url, target=f"process {process_id}", body=body, headers=headers
            )
        except AgentError:
            # A body cut off at the limit fails the upstream request; say why.
            if body is not None and body.exceeded:
                raise _too_large(self._max_body_bytes) from None
            raise


class _CappedBody:
    """A request body streamed on as it arrives, cut off once it grows past the agent's limit.

    aiohttp reports a failing body as a connection error, so `exceeded` tells the cause.
    """

    def __init__(self, request: web.Request, limit: int) -> None:
        self._content = request.content
        self._limit = limit
        self.exceeded = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        received = 0
        async for chunk in self._content.iter_any():
            received += len(chunk)
            if received > self._limit:
                self.exceeded = True
                raise _too_large(self._limit)
            yield chunk


def _too_large(limit: int) -> AgentError:
    return AgentError(413, "request_too_large", f"the body is larger than {limit} bytes")


async def _relay(
    request: web.Request, upstream: aiohttp.ClientResponse, url: str | URL
) -> web.StreamResponse:
    """Stream the runtime's answer to the caller as it comes; a failure mid-answer cuts it off."""
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
    for name, value in upstream.headers.items():
        if name.lower() not in _DROPPED_RESPONSE_HEADERS:
            response.headers.add(name, value)
    if upstream.content_length is not None:
        response.content_length = upstream.content_length
    await response.prepare(request)
    while True:
        try:
            chunk = await upstream.content.readany()
        except (aiohttp.ClientError, TimeoutError) as error:
            logger.warning("%s failed mid-response: %r", url, error)
            _cut(request)
            return response
        if not chunk:
            break
        try:
            await response.write(chunk)
        except ConnectionResetError:
            upstream.close()
            return response
    await response.write_eof()
    return response


def _request_headers(request: web.Request) -> CIMultiDict[str]:
    return CIMultiDict(
        (name, value)
        for name, value in request.headers.items()
        if name.lower() not in _DROPPED_REQUEST_HEADERS
    )


def _cut(request: web.Request) -> None:
    """End the caller's connection without finishing the body, so it sees the truncation."""
    transport = request.transport
    if transport is not None:
        transport.close()
