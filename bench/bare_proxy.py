"""The floor for any httpx-based proxy: forward the body to one URL and relay the answer.

No authentication, no JSON, no routing: what remains is the ASGI server, httpx and the aiohttp
transport. bench/gateway_overhead.py runs it beside Nexus to show what the gateway itself adds.
The upstream URL comes from BARE_PROXY_UPSTREAM.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from httpx_aiohttp import AiohttpTransport

UPSTREAM = os.environ.get("BARE_PROXY_UPSTREAM", "http://127.0.0.1:9101/v1/chat/completions")
_client: httpx.AsyncClient | None = None


async def application(
    scope: dict[str, Any],
    receive: Callable[[], Awaitable[dict[str, Any]]],
    send: Callable[[dict[str, Any]], Awaitable[None]],
) -> None:
    """Relay POSTs to UPSTREAM chunk by chunk."""
    global _client
    if scope["type"] != "http":
        return
    if _client is None:
        _client = httpx.AsyncClient(transport=AiohttpTransport(trust_env=False), trust_env=False)
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    request = _client.build_request(
        "POST", UPSTREAM, content=b"".join(chunks), headers={"content-type": "application/json"}
    )
    response = await _client.send(request, stream=True)
    try:
        headers = [(b"content-type", response.headers["content-type"].encode())]
        await send(
            {"type": "http.response.start", "status": response.status_code, "headers": headers}
        )
        async for chunk in response.aiter_raw():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    finally:
        await response.aclose()
