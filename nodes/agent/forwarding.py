"""Inference forwarding: `/v1/*` on the agent to the local runtime that serves the body's model.

Runtimes stay bound to loopback; callers reach them only through the agent and its credential.
"""

from __future__ import annotations

import logging
import time

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from nodes.agent.bodies import parse_json_object
from nodes.agent.errors import AgentError, invalid
from nodes.agent.inventory import Inventory

logger = logging.getLogger(__name__)

# A runtime that does not accept the connection within this is unavailable.
CONNECT_TIMEOUT_S = 10.0
# Never relayed: hop-by-hop headers, the caller's credential (runtimes need none, and the node
# credential must not leak to them), and what aiohttp sets itself.
_DROPPED_REQUEST_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "cookie",
        "host",
        "content-length",
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


class Forwarder:
    """The `/v1` routes: the node's model list and forwarding to runtimes."""

    def __init__(
        self, session: aiohttp.ClientSession, inventory: Inventory, read_timeout_s: float
    ) -> None:
        self._session = session
        self._inventory = inventory
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=read_timeout_s
        )
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
        upstream = await self._open(url, model, raw, _request_headers(request))
        try:
            return await self._relay(request, upstream, url)
        except BaseException:
            # The caller went away (or the relay failed): drop the upstream connection so the
            # runtime sees the disconnect and frees the request's slot.
            upstream.close()
            raise
        finally:
            upstream.release()

    async def _open(
        self, url: str, model: str, body: bytes, headers: CIMultiDict[str]
    ) -> aiohttp.ClientResponse:
        try:
            return await self._session.post(url, data=body, headers=headers, timeout=self._timeout)
        except TimeoutError:
            raise AgentError(
                504,
                "runtime_unavailable",
                f"the runtime serving {model!r} did not answer in time",
                kind="server_error",
            ) from None
        except aiohttp.ClientError as error:
            raise AgentError(
                502,
                "runtime_unavailable",
                f"the runtime serving {model!r} is unavailable: {error}",
                kind="server_error",
            ) from None

    @staticmethod
    async def _relay(
        request: web.Request, upstream: aiohttp.ClientResponse, url: str
    ) -> web.StreamResponse:
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
