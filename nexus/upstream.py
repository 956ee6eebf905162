"""The one place that builds the HTTP client used to reach targets, nodes and replicas."""

from __future__ import annotations

import asyncio

import httpx
from django.conf import settings
from httpx_aiohttp import AiohttpTransport

_clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}


def _build() -> httpx.AsyncClient:
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
    return httpx.AsyncClient(transport=transport, timeout=timeout, trust_env=False)


def client() -> httpx.AsyncClient:
    """Return this event loop's pooled client (one per process in a server)."""
    loop = asyncio.get_running_loop()
    found = _clients.get(loop)
    if found is None:
        found = _clients[loop] = _build()
    return found


async def close_client() -> None:
    """Close this event loop's client, if it has one (at shutdown, and between tests)."""
    found = _clients.pop(asyncio.get_running_loop(), None)
    if found is not None:
        await found.aclose()
