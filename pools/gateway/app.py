"""The gateway's ASGI app for /v1: authenticate, pick a target, relay the answer as it arrives.

This is the hot path. It reads only the in-memory snapshot (no database query per request),
parses the JSON body once, and relays upstream bytes chunk by chunk without buffering.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import secrets
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import aiohttp
import httpx
from django.conf import settings

from nexus import upstream
from pools.balancer.strategies import round_robin
from pools.gateway import errors
from pools.gateway.errors import GatewayError
from pools.gateway.registry import Registry
from pools.gateway.snapshot import PoolEntry, Snapshot, TargetEntry, TokenEntry
from pools.models import POOL_MODEL_PREFIX

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# Client path -> request kind.
ROUTES: dict[str, str] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
}
JSON_HEADERS = [(b"content-type", b"application/json")]
# Upstream response headers worth relaying; hop-by-hop ones (transfer-encoding...) are not.
RELAYED_HEADERS = frozenset(
    {b"content-type", b"content-length", b"content-encoding", b"cache-control", b"retry-after"}
)
# A non-streaming answer up to this size is sent to the client in one piece.
WHOLE_BODY_MAX_BYTES = 1024 * 1024
# Request ids: a random per-process half and a counter, unique across processes, cheaper
# than uuid4 per request.
_REQUEST_ID_PREFIX = secrets.token_hex(8)
_request_numbers = itertools.count(1)


def new_request_id() -> str:
    """Return a 32-hex-digit id for X-Nexus-Request-Id."""
    return f"{_REQUEST_ID_PREFIX}{next(_request_numbers):016x}"


class ClientGone(Exception):
    """The client disconnected before the request was complete."""


class Gateway:
    """The raw ASGI application serving /v1/*."""

    def __init__(self, registry: Registry | None = None):
        self.registry = registry or Registry()
        self.max_body_bytes: int = settings.NEXUS_MAX_BODY_BYTES
        self._turns: dict[int, int] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = new_request_id()
        try:
            await self._handle(scope, receive, send, request_id)
        except GatewayError as error:
            await self._respond_error(send, error, request_id)
        except ClientGone:
            return

    async def _handle(self, scope: Scope, receive: Receive, send: Send, request_id: str) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        if path == "/v1/models":
            if method != "GET":
                raise errors.method_not_allowed(method, path)
            snapshot = await self.registry.ready()
            token = self._authenticate(scope, snapshot)
            await self._respond_json(send, 200, self._model_list(snapshot, token), request_id)
            return
        kind = ROUTES.get(path)
        if kind is None:
            raise errors.unknown_route(method, path)
        if method != "POST":
            raise errors.method_not_allowed(method, path)
        snapshot = await self.registry.ready()
        token = self._authenticate(scope, snapshot)
        payload = self._parse(await self._read_body(scope, receive))
        pool = self._pool_for(payload, token, snapshot)
        target = self._choose(pool, kind)
        payload["model"] = target.model_id
        await self._relay(receive, send, request_id, target, kind, payload)

    def _authenticate(self, scope: Scope, snapshot: Snapshot) -> TokenEntry:
        header = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                header = value
                break
        scheme, _, secret = header.partition(b" ")
        secret = secret.strip()
        if scheme.lower() != b"bearer" or not secret:
            raise errors.missing_token()
        token = snapshot.tokens.get(hashlib.sha256(secret).hexdigest())
        if token is None:
            raise errors.invalid_token()
        if token.expires_at is not None and token.expires_at <= time.time():
            raise errors.expired_token()
        self.registry.note_token_used(token.id)
        return token

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        limit = self.max_body_bytes
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                raise errors.body_too_large(limit)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise errors.body_too_large(limit)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    @staticmethod
    def _parse(body: bytes) -> dict[str, Any]:
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise errors.invalid_json(str(exc) if body else "the body is empty") from None
        if not isinstance(payload, dict):
            raise errors.invalid_body("The request body must be a JSON object.")
        return payload

    @staticmethod
    def _pool_for(payload: dict[str, Any], token: TokenEntry, snapshot: Snapshot) -> PoolEntry:
        model = payload.get("model")
        if model is None or model == "":
            raise errors.missing_model()
        if not isinstance(model, str):
            raise errors.invalid_body("'model' must be a string.", param="model")
        pool = None
        if model.startswith(POOL_MODEL_PREFIX):
            pool = snapshot.pools.get(model[len(POOL_MODEL_PREFIX) :])
        if pool is None:
            raise errors.model_not_found(model)
        if not token.may_use(pool.slug):
            raise errors.pool_forbidden(model)
        return pool

    def _choose(self, pool: PoolEntry, kind: str) -> TargetEntry:
        candidates = [target for target in pool.targets if kind in target.kinds]
        if not candidates:
            raise errors.no_target(pool.slug, kind)
        turn = self._turns.get(pool.id, 0)
        self._turns[pool.id] = turn + 1
        return round_robin(candidates, turn)

    async def _relay(
        self,
        receive: Receive,
        send: Send,
        request_id: str,
        target: TargetEntry,
        kind: str,
        payload: dict[str, Any],
    ) -> None:
        """Forward to the target; a client disconnect cancels the upstream request at once."""
        task = asyncio.current_task()
        assert task is not None
        disconnected = False

        async def watch_disconnect() -> None:
            nonlocal disconnected
            while (await receive())["type"] != "http.disconnect":
                pass
            disconnected = True
            task.cancel()

        watcher = asyncio.create_task(watch_disconnect())
        try:
            await self._forward(send, request_id, target, kind, payload)
        except asyncio.CancelledError:
            if not disconnected:
                raise
            task.uncancel()
        finally:
            watcher.cancel()

    async def _forward(
        self,
        send: Send,
        request_id: str,
        target: TargetEntry,
        kind: str,
        payload: dict[str, Any],
    ) -> None:
        headers = [(b"content-type", b"application/json"), (b"accept", b"*/*")]
        # The client's own Authorization never travels on; the target's credential does.
        if target.authorization is not None:
            headers.append((b"authorization", target.authorization.encode()))
        request = httpx.Request(
            "POST", target.urls[kind], headers=headers, content=json.dumps(payload).encode()
        )
        try:
            response = await upstream.get().send(request)
        except httpx.HTTPError as exc:
            raise _upstream_failure(exc, target) from None
        try:
            await self._relay_response(send, request_id, target, response)
        finally:
            await response.aclose()

    async def _relay_response(
        self, send: Send, request_id: str, target: TargetEntry, response: httpx.Response
    ) -> None:
        headers = [
            (name, value) for name, value in response.headers.raw if name.lower() in RELAYED_HEADERS
        ]
        headers.append((b"x-nexus-request-id", request_id.encode()))
        headers.append((b"x-nexus-target", target.name.encode()))
        start = {"type": "http.response.start", "status": response.status_code, "headers": headers}
        is_sse = response.headers.get("content-type", "").startswith("text/event-stream")
        length = response.headers.get("content-length", "")
        if not is_sse and length.isdigit() and int(length) <= WHOLE_BODY_MAX_BYTES:
            # One JSON document: read it and answer in one piece (fewer writes, same latency).
            # Raw bytes: the body keeps its content-encoding, which is relayed with it.
            try:
                body = b"".join([chunk async for chunk in response.aiter_raw()])
            except httpx.HTTPError as exc:
                raise _upstream_failure(exc, target) from None
            await send(start)
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        await send(start)
        try:
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.HTTPError as exc:
            # Output already reached the client: no retry; end the stream with an error.
            if is_sse:
                failure = _upstream_failure(exc, target)
                event = b"data: " + _stream_error(target, failure) + b"\n\n"
                await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _model_list(self, snapshot: Snapshot, token: TokenEntry) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": f"{POOL_MODEL_PREFIX}{pool.slug}",
                    "object": "model",
                    "created": pool.created,
                    "owned_by": "nexus",
                }
                for slug, pool in sorted(snapshot.pools.items())
                if token.may_use(slug)
            ],
        }

    @staticmethod
    async def _respond_json(send: Send, status: int, document: Any, request_id: str) -> None:
        await _send_bytes(send, status, json.dumps(document).encode(), request_id)

    @staticmethod
    async def _respond_error(send: Send, error: GatewayError, request_id: str) -> None:
        await _send_bytes(send, error.status, error.body(), request_id, error.headers)


async def _send_bytes(
    send: Send,
    status: int,
    body: bytes,
    request_id: str,
    extra_headers: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    headers = [
        *JSON_HEADERS,
        (b"content-length", str(len(body)).encode()),
        (b"x-nexus-request-id", request_id.encode()),
        *extra_headers,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _upstream_failure(exc: httpx.HTTPError, target: TargetEntry) -> GatewayError:
    """Classify a transport failure; the aiohttp transport's own mapping is too coarse."""
    cause = exc.__cause__
    timed_out = isinstance(cause, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)) or (
        cause is None and isinstance(exc, httpx.TimeoutException)
    )
    if timed_out:
        return errors.target_timeout(target.name)
    return errors.target_unreachable(target.name)


def _stream_error(target: TargetEntry, failure: GatewayError) -> bytes:
    message = f"The stream from target '{target.name}' broke off: {failure.message}"
    return errors.error_body(message, "server_error", "stream_interrupted")
