"""The one place that builds the HTTP client used to reach targets, nodes and replicas."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import httpx
from aiohttp.client_proto import ResponseHandler
from django.conf import settings
from httpx_aiohttp import AiohttpTransport


@dataclass
class Upstream:
    """A pooled httpx client over the aiohttp transport, and that transport for the gateway."""

    transport: AiohttpTransport
    client: httpx.AsyncClient
    timeout: dict[str, Any] = field(default_factory=dict)  # as httpx.Request extensions want it

    async def send(self, request: httpx.Request) -> httpx.Response:
        """Send a proxied request as is, streaming the response.

        A proxy applies none of the client's cookie jar (cookies from one caller's answer must
        not reach the next caller), redirects or auth; skipping them also saves a third of
        httpx's cost per request.
        """
        request.extensions["timeout"] = self.timeout
        return await self.transport.handle_async_request(request)


_by_loop: dict[asyncio.AbstractEventLoop, Upstream] = {}


def _push_read_deadline(handler: Any) -> None:
    """aiohttp's read timeout, moved lazily: a deadline pushed back by each read, one timer.

    aiohttp cancels its read timer and schedules a new one on every read from the socket: a
    TimerHandle made and a cancelled one left in the event loop's heap for every chunk of every
    stream (7 % of a streaming gateway's CPU at c=64). Here a read only moves the deadline; the
    one timer, when it fires early, sleeps again until the deadline. Same timeout, same error.
    """
    timeout = handler._read_timeout
    if not timeout:
        handler._drop_timeout()
        return
    loop = handler._loop
    handler._nexus_read_deadline = deadline = loop.time() + timeout
    if handler._read_timeout_handle is None:
        handler._read_timeout_handle = loop.call_at(deadline, _read_deadline_reached, handler)


def _read_deadline_reached(handler: Any) -> None:
    deadline = handler._nexus_read_deadline
    if handler._loop.time() < deadline:
        handler._read_timeout_handle = handler._loop.call_at(
            deadline, _read_deadline_reached, handler
        )
    else:
        handler._read_timeout_handle = None
        handler._on_read_timeout()


ResponseHandler._reschedule_timeout = _push_read_deadline  # type: ignore[method-assign,assignment]


def _build() -> Upstream:
    limits = httpx.Limits(
        max_connections=settings.NEXUS_UPSTREAM_MAX_CONNECTIONS,
        max_keepalive_connections=settings.NEXUS_UPSTREAM_MAX_CONNECTIONS,
        keepalive_expiry=30.0,
    )
    # The aiohttp transport costs about a quarter of httpx's own pool's CPU (DESIGN.md).
    transport = AiohttpTransport(limits=limits, trust_env=False)
    timeout = httpx.Timeout(
        connect=settings.NEXUS_UPSTREAM_CONNECT_TIMEOUT_S,
        read=settings.NEXUS_UPSTREAM_READ_TIMEOUT_S,
        write=60.0,
        pool=settings.NEXUS_UPSTREAM_CONNECT_TIMEOUT_S,
    )
    client = httpx.AsyncClient(transport=transport, timeout=timeout, trust_env=False)
    return Upstream(transport=transport, client=client, timeout=timeout.as_dict())


def get() -> Upstream:
    """Return this event loop's upstream (one per process in a server)."""
    loop = asyncio.get_running_loop()
    found = _by_loop.get(loop)
    if found is None:
        found = _by_loop[loop] = _build()
    return found


async def close() -> None:
    """Close this event loop's client, if it has one (at shutdown, and between tests)."""
    found = _by_loop.pop(asyncio.get_running_loop(), None)
    if found is not None:
        await found.client.aclose()
