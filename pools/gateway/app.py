"""The gateway's ASGI app for /v1 and /serve: authenticate, read, and hand over to the balancer.

This is the hot path. It reads only the in-memory snapshot (no database query per request),
parses a /v1 JSON body once, and relays upstream bytes chunk by chunk without buffering
(pools.gateway.flight does the routing, retries and relaying). /serve/<service>/<path> sends any
HTTP request on to one of the service's replicas as it came.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import unquote

from django.conf import settings

from nexus import scopes, upstream
from nexus.graceful import stop_part
from pools.gateway import errors
from pools.gateway.errors import GatewayError
from pools.gateway.flight import NOT_FORWARDED, Flight, Forward, Router, forwarded_headers
from pools.gateway.registry import Registry
from pools.gateway.snapshot import EMPTY, SERVE_KIND, PoolEntry, Snapshot, TokenEntry
from pools.gateway.state import GatewayState
from pools.gateway.usage import ask_for_usage
from pools.models import POOL_MODEL_PREFIX

log = logging.getLogger(__name__)

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
SERVE_PREFIX = "/serve/"
MODELS = "models"  # the request kind of GET /v1/models
# Authorization schemes a service token may come with (lowercase), as Backend.AI's clients send it.
SERVICE_SCHEMES = frozenset({b"bearer", b"backendai"})
JSON_HEADERS = [(b"content-type", b"application/json")]
# Request headers the balancer reads (continuity keys, the client's queue deadline).
ROUTING_HEADERS = frozenset(
    {b"x-nexus-session-id", b"x-msty-nexus-session-id", b"x-nexus-queue-timeout"}
)
# Request ids: a random per-process half and a counter, unique across processes, cheaper
# than uuid4 per request.
_REQUEST_ID_PREFIX = secrets.token_hex(8)
_request_numbers = itertools.count(1)
# At shutdown: how often the requests in flight are counted, and how long the ones cut at the end
# of the grace get to record themselves (history, slots) before buffers are written.
SHUTDOWN_POLL_S = 0.05
SHUTDOWN_CUT_WAIT_S = 5.0
# The gateway that serves in this process, once it routed its first request (for /healthz).
_serving: Gateway | None = None


def new_request_id() -> str:
    """Return a 32-hex-digit id for X-Nexus-Request-Id."""
    return f"{_REQUEST_ID_PREFIX}{next(_request_numbers):016x}"


class ClientGone(Exception):
    """The client disconnected before the request was complete."""


class Gateway:
    """The raw ASGI application serving /v1/* and /serve/*."""

    def __init__(self, registry: Registry | None = None, state: GatewayState | None = None):
        self.registry = registry or Registry()
        self.max_body_bytes: int = settings.NEXUS_MAX_BODY_BYTES
        self._state = state
        self._router: Router | None = None
        # Requests being answered, and whether a shutdown refuses new ones.
        self._requests: set[asyncio.Task[Any]] = set()
        self._draining = False

    @property
    def state(self) -> GatewayState:
        """Return the process's live state, built in the server's event loop on first use."""
        if self._state is None:
            self._state = GatewayState()
        return self._state

    def _current_pool(self, pool: PoolEntry) -> PoolEntry:
        """Return the pool as the latest snapshot has it (itself when it is gone)."""
        return self.registry.snapshot.pools.get(pool.slug, pool)

    def router(self) -> Router:
        global _serving
        if self._router is None:
            self._router = Router(self.state, self._current_pool)
            self.state.start(self.registry)
            _serving = self
        return self._router

    def health(self) -> dict[str, Any]:
        """Return how this gateway counts load and learns of revocations now, for /healthz."""
        ledger = self.state.ledger_status().report()
        if self.registry.revocations_announced():
            revocations = {"status": "ok", "detail": "announced to this process at once"}
        else:
            revocations = {
                "status": "degraded",
                "detail": "Redis is unreachable: revocations take effect here with the next "
                "configuration poll (about a second), and at once again when Redis returns",
            }
        degraded = "degraded" in (ledger["status"], revocations["status"])
        return {
            "status": "degraded" if degraded else "ok",
            "ledger": ledger,
            "revocations": revocations,
        }

    async def aclose(self) -> None:
        """Stop background work and write buffered history (at shutdown, and in tests)."""
        global _serving
        if _serving is self:  # /healthz no longer reports a gateway that stopped serving
            _serving = None
        if self._state is not None:
            await self._state.aclose()
        await self.registry.aclose()

    async def shutdown(self, grace_s: float) -> None:
        """Refuse new requests, let those in flight finish for up to grace_s, end the rest (a
        stream with an error event), then write what is buffered and stop background work."""
        self._draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while self._requests and loop.time() < deadline:
            await asyncio.sleep(SHUTDOWN_POLL_S)
        if self._requests:
            log.warning("%d requests still in flight after the grace: ending them",
                        len(self._requests))  # fmt: skip
            self.state.cutting = True
        for task in list(self._requests):
            task.cancel()
        if self._requests:
            await asyncio.wait(list(self._requests), timeout=SHUTDOWN_CUT_WAIT_S)
        await self.aclose()
        # Its connections to the targets, before the loop stops.
        await stop_part(upstream.close(), "connections to the targets")
        log.info("gateway stopped: history and token usage written")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = new_request_id()
        task = asyncio.current_task()
        assert task is not None
        self._requests.add(task)
        response = _Response(send)
        try:
            if self._draining:
                raise errors.shutting_down()
            await self._handle(scope, receive, response.send, request_id)
        except GatewayError as error:
            await self._respond_error(send, error, request_id)
        except ClientGone:
            return
        except asyncio.CancelledError:
            # Only the server cancels a request whose client is still there: at shutdown (ours
            # after the grace, daphne's or uvicorn's own). Tell the client before going.
            with contextlib.suppress(Exception):
                await response.cut(request_id)
            raise
        except Exception:
            log.exception("gateway request %s failed", request_id)
            # Once the answer has begun, the server can only end the connection.
            if not response.started:
                await self._respond_error(send, errors.internal_error(), request_id)
        finally:
            self._requests.discard(task)

    def refusal(
        self, method: str, path: str, headers: list[tuple[bytes, bytes]]
    ) -> GatewayError | None:
        """Return what the headers alone refuse a request with, before a byte of its body.

        For servers that read a whole body before starting the application (daphne): they ask
        this first. Authentication needs the configuration snapshot: until the first one is
        loaded, only the route and the declared length are judged.
        """
        scope: Scope = {"method": method, "path": path, "headers": headers}
        try:
            snapshot = self.registry.snapshot
            if snapshot is EMPTY:
                self._route(scope)
            else:
                _, pool, secret = self._caller(scope, snapshot)
                # A token the snapshot does not know yet may be new: the application looks it up.
                token = self._known_token(secret, snapshot) if secret is not None else None
                if token is not None:
                    _check_service_scope(token, pool)
            self._check_declared_length(scope)
        except GatewayError as error:
            return error
        return None

    def _route(self, scope: Scope) -> str:
        """Return the request kind of the path ("models", "serve" or a /v1 kind), or refuse."""
        path: str = scope["path"]
        method: str = scope["method"]
        if path == "/v1/models":
            if method != "GET":
                raise errors.method_not_allowed(method, path)
            return MODELS
        kind = ROUTES.get(path)
        if kind is None:
            if path.startswith(SERVE_PREFIX):
                return SERVE_KIND
            raise errors.unknown_route(method, path)
        if method != "POST":
            raise errors.method_not_allowed(method, path)
        return kind

    def _caller(
        self, scope: Scope, snapshot: Snapshot
    ) -> tuple[str, PoolEntry | None, bytes | None]:
        """Return the request kind, the service's pool (/serve) and the secret to check.

        The secret is None for a public service, which takes anyone: a token sent anyway is not
        even looked at. Refuses a wrong route or method, an unknown service, a missing token.
        """
        kind = self._route(scope)
        scheme, secret = _credentials(scope)
        if kind != SERVE_KIND:
            if scheme != b"bearer" or not secret:
                raise errors.missing_token()
            return kind, None, secret
        name, _ = _serve_path(scope)
        pool = snapshot.services.get(name)
        if pool is None or pool.service is None:
            raise errors.service_not_found(name)
        if pool.service.open_to_public:
            return kind, pool, None
        if scheme not in SERVICE_SCHEMES or not secret:
            raise errors.missing_service_token(pool.service.name)
        return kind, pool, secret

    async def _admit(self, scope: Scope, snapshot: Snapshot) -> tuple[str, TokenEntry | None]:
        """Return the request kind and the caller's token, judged from the headers alone."""
        kind, pool, secret = self._caller(scope, snapshot)
        if secret is None:
            return kind, None
        token = await self._usable_token(secret, snapshot)
        _check_service_scope(token, pool)
        return kind, token

    def _check_declared_length(self, scope: Scope) -> None:
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.max_body_bytes:
                raise errors.body_too_large(self.max_body_bytes)

    async def _handle(self, scope: Scope, receive: Receive, send: Send, request_id: str) -> None:
        snapshot = await self.registry.ready()
        try:
            kind, token = await self._admit(scope, snapshot)
            if kind != MODELS:
                self._check_declared_length(scope)
        except GatewayError as error:
            raise _leaving_body_unread(error, scope) from None
        if kind == MODELS:
            assert token is not None
            await self._respond_json(send, 200, self._model_list(snapshot, token), request_id)
            return
        if kind == SERVE_KIND:
            await self._serve(scope, receive, send, request_id, snapshot, token)
            return
        assert token is not None
        payload = self._parse(await self._read_body(scope, receive))
        pool = self._pool_for(payload, token, snapshot)
        if token.limits.tokens_per_minute is not None and payload.get("stream") is True:
            # A stream counts against the limit only if its answer reports its usage.
            ask_for_usage(payload)
        flight = self._flight(scope, request_id, token, pool, kind, payload)
        await self._with_disconnect_watch(receive, self.router().fly(send, flight))

    async def _serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        request_id: str,
        snapshot: Snapshot,
        token: TokenEntry | None,
    ) -> None:
        """Send /serve/<service>/<path> on to one of the service's replicas, as it came."""
        name, path = _serve_path(scope)
        pool = snapshot.services[name]
        forward = Forward(
            method=scope["method"],
            path=path,
            query=scope.get("query_string", b"").decode("latin-1"),
            headers=forwarded_headers(scope["headers"], NOT_FORWARDED),
            body=await self._read_body(scope, receive),
            client_path=scope["path"],
        )
        flight = self._flight(scope, request_id, token, pool, SERVE_KIND, {}, forward)
        await self._with_disconnect_watch(receive, self.router().fly(send, flight))

    def _flight(
        self,
        scope: Scope,
        request_id: str,
        token: TokenEntry | None,
        pool: PoolEntry,
        kind: str,
        payload: dict[str, Any],
        forward: Forward | None = None,
    ) -> Flight:
        headers = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope["headers"]
            if name in ROUTING_HEADERS
        }
        now = time.monotonic()
        wait_s = pool.max_queue_wait_s
        if (raw := headers.get("x-nexus-queue-timeout")) is not None:
            # The client may ask to wait less than the pool allows, never more.
            wait_s = min(_seconds(raw), wait_s)
        facts, session_key, prefix_key = self.state.request_facts(pool, kind, headers, payload, now)
        return Flight(
            request_id=request_id,
            token=token,
            pool=pool,
            kind=kind,
            payload=payload,
            stream=payload.get("stream") is True,
            deadline=now + wait_s,
            session_key=session_key,
            prefix_key=prefix_key,
            facts=facts,
            forward=forward,
            started=now,
        )

    @staticmethod
    async def _with_disconnect_watch(receive: Receive, work: Awaitable[None]) -> None:
        """Run the routing; a client disconnect cancels it, and with it the upstream request."""
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
            await work
        except asyncio.CancelledError:
            if not disconnected:
                raise
            task.uncancel()
        finally:
            watcher.cancel()

    async def _usable_token(self, secret: bytes, snapshot: Snapshot) -> TokenEntry:
        """Return the token with this secret, unless it is unknown, revoked or expired.

        A token issued since the snapshot was read is looked up (bounded: Registry.look_up_token),
        so it works on its first request.
        """
        token = self._known_token(secret, snapshot)
        if token is None:
            token = await self.registry.look_up_token(hashlib.sha256(secret).hexdigest())
            if token is None:
                raise errors.invalid_token()
            _check_usable(token)
        self.registry.note_token_used(token.id)
        return token

    @staticmethod
    def _known_token(secret: bytes, snapshot: Snapshot) -> TokenEntry | None:
        """Return the snapshot's token with this secret if usable; None if the snapshot has none.

        Refuses a revoked, expired or admin token.
        """
        digest = hashlib.sha256(secret).hexdigest()
        token = snapshot.tokens.get(digest)
        if token is None:
            if digest in snapshot.revoked:
                raise errors.revoked_token()
            return None
        _check_usable(token)
        return token

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        limit = self.max_body_bytes
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _leaving_body_unread(errors.body_too_large(limit), scope)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    @staticmethod
    def _parse(body: bytes) -> dict[str, Any]:
        try:
            payload = json.loads(body)
        except RecursionError:
            # The parser's own depth limit (about a thousand levels) is the cap on nesting.
            raise errors.nesting_too_deep() from None
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
        # A managed pool without a live service (being destroyed) is gone for its callers.
        if pool is None or (pool.managed and pool.service is None):
            raise errors.model_not_found(model)
        if not token.may_use(pool):
            raise errors.pool_forbidden(model, managed=pool.managed)
        return pool

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
                if token.may_use(pool)
            ],
        }

    @staticmethod
    async def _respond_json(send: Send, status: int, document: Any, request_id: str) -> None:
        await _send_bytes(send, status, json.dumps(document).encode(), request_id)

    @staticmethod
    async def _respond_error(send: Send, error: GatewayError, request_id: str) -> None:
        await _send_bytes(send, error.status, error.body(), request_id, error.headers)


class _Response:
    """The answer's progress as sent, so that a shutdown can end it properly."""

    __slots__ = ("_send", "ended", "sse", "started")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = self.ended = self.sse = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            self.sse = any(
                name.lower() == b"content-type" and value.startswith(b"text/event-stream")
                for name, value in message.get("headers", ())
            )
        elif not message.get("more_body", False):
            self.ended = True
        await self._send(message)

    async def cut(self, request_id: str) -> None:
        """End the answer now: a 503 if none began, an error event and the end of a stream."""
        if not self.started:
            error = errors.shutting_down()
            await _send_bytes(self._send, error.status, error.body(), request_id, error.headers)
        elif not self.ended:
            if self.sse:
                event = b"data: " + errors.cut_by_shutdown() + b"\n\n"
                await self._send({"type": "http.response.body", "body": event, "more_body": True})
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})


def serving_health() -> dict[str, Any] | None:
    """Return the health of the gateway serving in this process; None before its first request."""
    return _serving.health() if _serving is not None else None


def _check_usable(token: TokenEntry) -> None:
    """Refuse an expired token, and an admin token (it never calls inference)."""
    if token.expires_at is not None and token.expires_at <= time.time():
        raise errors.expired_token(token.expires_at)
    # may_call refuses it every pool and service anyway; this says why, before any routing.
    if token.scope.kind is scopes.TokenKind.ADMIN:
        raise errors.admin_token()


def _check_service_scope(token: TokenEntry, pool: PoolEntry | None) -> None:
    """Refuse a token that may not call this service (/serve); None: not a /serve request."""
    if pool is not None and pool.service is not None and not token.may_use(pool):
        raise errors.service_forbidden(pool.service.name)


def _leaving_body_unread(error: GatewayError, scope: Scope) -> GatewayError:
    """Make a refusal close the connection when the request's body (or its rest) goes unread.

    Otherwise the server would read and discard the rest of it, however large, to keep the
    connection for a next request.
    """
    if any(name in (b"content-length", b"transfer-encoding") for name, _ in scope["headers"]):
        error.headers = (*error.headers, (b"connection", b"close"))
    return error


def _credentials(scope: Scope) -> tuple[bytes, bytes]:
    """Return the Authorization header's scheme (lowercased) and credentials, empty if none."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, secret = value.partition(b" ")
            return scheme.lower(), secret.strip()
    return b"", b""


def _serve_path(scope: Scope) -> tuple[str, str]:
    """Return the service name and the raw path below it of a /serve/<name>/<path> request.

    The path keeps the client's escapes (%2F stays one segment); "." and ".." segments are
    refused, also escaped ones: resolved, they would climb out of the replica's URL to the
    node agent's other routes, which the node credential opens.
    """
    name, _, _ = scope["path"][len(SERVE_PREFIX) :].partition("/")
    raw: bytes = scope.get("raw_path") or scope["path"].encode()
    _, slash, rest = raw[len(SERVE_PREFIX) :].partition(b"/")
    path = "/" + rest.decode("latin-1") if slash else "/"
    if any(part in (".", "..") for part in unquote(path).replace("\\", "/").split("/")):
        raise errors.invalid_path(scope["path"])
    return name, path


def _seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise errors.invalid_queue_timeout(raw) from None
    if not value >= 0:  # also refuses NaN
        raise errors.invalid_queue_timeout(raw)
    return value


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
