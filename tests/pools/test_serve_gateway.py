"""Model services through the gateway: /serve/<service>/<path> and `@pool/<service>` on /v1.

A live daphne Nexus forwards to real servers on loopback: an echo server that answers any method
with what it received (and drips server-sent events), and simulator engines for the OpenAI API.
The services' managed pools point straight at them (node-backed replicas are covered elsewhere).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import pytest
from asgiref.sync import sync_to_async
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from nexus import upstream
from nexus.models import ApiToken
from pools.gateway import revocations
from pools.gateway.app import Gateway
from pools.gateway.history import HistoryShipper
from pools.gateway.ledger import MemoryLedger
from pools.gateway.registry import Registry
from pools.gateway.state import GatewayState
from pools.models import Pool, RoutingRecord, Target
from serving import tokens
from serving.models import Service, ServiceLifecycle
from tests.support import asgi
from tests.support.http import LOOPBACK
from tests.support.live import LiveServer, running_nexus
from tests.support.simulator import Simulator, running_simulator
from tests.support.waiting import wait_until

REPLICA_CREDENTIAL = "sk-replica"
DRIP_EVENTS = 5
DRIP_INTERVAL_S = 0.15


@dataclass
class EchoServer:
    """A running echo server: its root URL and when each /drip produced its last event."""

    url: str
    drip_finished: list[float] = field(default_factory=list)  # monotonic


@contextmanager
def running_echo_server() -> Iterator[EchoServer]:
    """Answer any method at any path with what arrived, as JSON, until the block ends.

    /status/<code> answers with that status; /drip sends DRIP_EVENTS server-sent events,
    DRIP_INTERVAL_S apart.
    """
    server_state = EchoServer(url="")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            parts = urlsplit(self.path)
            if parts.path == "/drip":
                self._drip()
                return
            status = int(parts.path.split("/")[2]) if parts.path.startswith("/status/") else 200
            document = {
                "method": self.command,
                "path": parts.path,
                "query": parts.query,
                "headers": {name.lower(): value for name, value in self.headers.items()},
                "body": body.decode(),
            }
            data = json.dumps(document).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Set-Cookie", "replica=1; Path=/")
            self.send_header("X-Echo", "yes")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _drip(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for number in range(DRIP_EVENTS):
                event = f"data: {number}\n\n".encode()
                self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
                self.wfile.flush()
                if number < DRIP_EVENTS - 1:
                    time.sleep(DRIP_INTERVAL_S)
            server_state.drip_finished.append(time.monotonic())
            self.wfile.write(b"0\r\n\r\n")

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _answer  # noqa: N815

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            """Keep test output quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="echo", daemon=True)
    thread.start()
    server_state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield server_state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def make_service(
    name: str, *replicas: str, public: bool = False, desired: int = 1, **fields: Any
) -> Service:
    """Create a service whose managed pool has one target per replica root URL."""
    pool = Pool.objects.create(name=name, slug=name, managed=True)
    for number, url in enumerate(replicas, start=1):
        target = Target(pool=pool, name=f"{name}-{number}", base_url=url, model_id="demo-8b")
        target.set_credential(REPLICA_CREDENTIAL)
        target.save()
    return Service.objects.create(
        name=name, pool=pool, open_to_public=public, desired_replicas=desired, **fields
    )


def service_token(name: str, **fields: Any) -> str:
    """Issue a token for the named service, valid for a day unless told otherwise."""
    expires_at = fields.pop("expires_at", timezone.now() + timedelta(days=1))
    return ApiToken.issue(f"{name} caller", services=[name], expires_at=expires_at, **fields)[1]


@dataclass
class World:
    """A live Nexus with services in front of an echo server and simulators, and tokens."""

    nexus: LiveServer
    echo: EchoServer
    fast: Simulator
    slow: Simulator
    echo_token: str  # may call the service "echo"
    chat_token: str  # may call "chat"
    service_tokens: dict[str, str]  # a token for each other service, by name
    client_token: str  # an ordinary all-pools client token
    chat_pool_token: str  # an ordinary token naming a pool "chat"
    expired_token: str
    revoked_token: str

    def serve(
        self, method: str, path: str, token: str | None = None, *, scheme: str = "Bearer", **kw: Any
    ) -> httpx.Response:
        headers = kw.pop("headers", {})
        if token is not None:
            headers["Authorization"] = f"{scheme} {token}"
        return LOOPBACK.request(
            method, f"{self.nexus.url}/serve/{path}", headers=headers, timeout=10, **kw
        )

    def sdk(self, token: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.nexus.url}/v1", api_key=token, max_retries=0)


@pytest.fixture(scope="module")
def world(committed_db, django_db_blocker, tmp_path_factory) -> Iterator[World]:
    with (
        running_echo_server() as echo,
        running_echo_server() as other_echo,
        running_simulator(model="demo-8b", ttft_ms=0, tpot_ms=1) as fast,
        running_simulator(model="demo-8b", ttft_ms=0, tpot_ms=40) as slow,
    ):
        with django_db_blocker.unblock():
            make_service("echo", echo.url)
            make_service("twice", echo.url, other_echo.url)
            make_service("open", echo.url, public=True)
            make_service("chat", fast.root_url)
            make_service("slowchat", slow.root_url, public=True)
            make_service("idle", desired=2)
            make_service("gone", echo.url, lifecycle=ServiceLifecycle.DESTROYED)
            plain = Pool.objects.create(name="Plain", slug="plain")
            Target.objects.create(pool=plain, name="p", base_url=fast.base_url, model_id="demo-8b")
            echo_token = service_token("echo")
            chat_token = service_token("chat")
            others = {name: service_token(name) for name in ("twice", "idle", "gone")}
            expired = service_token("echo", expires_at=timezone.now() - timedelta(hours=1))
            revoked_row, revoked = ApiToken.issue(
                "old", services=["echo"], expires_at=timezone.now() + timedelta(days=1)
            )
            revoked_row.revoke()
            _, client_token = ApiToken.issue("everything")
            _, chat_pool_token = ApiToken.issue("chat pool", pools=["chat"])
        tmp = tmp_path_factory.mktemp("serve")
        try:
            with running_nexus(tmp, NEXUS_LEDGER="memory") as nexus:
                yield World(
                    nexus, echo, fast, slow, echo_token, chat_token, others, client_token,
                    chat_pool_token, expired, revoked,
                )  # fmt: skip
        finally:
            with django_db_blocker.unblock():
                Service.objects.all().delete()
                Pool.objects.all().delete()
                ApiToken.objects.all().delete()


def _error(response: httpx.Response) -> dict[str, Any]:
    return response.json()["error"]


# Forwarding


def test_it_forwards_a_get_with_its_path_and_query_to_a_replica(world: World) -> None:
    response = world.serve("GET", "echo/some/where?q=1&name=a%20b", world.echo_token)

    echoed = response.json()
    assert response.status_code == 200
    assert (echoed["method"], echoed["path"], echoed["query"]) == (
        "GET", "/some/where", "q=1&name=a%20b",
    )  # fmt: skip
    assert response.headers["x-nexus-target"] == "echo-1"
    assert len(response.headers["x-nexus-request-id"]) == 32


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_it_forwards_any_method_with_its_body(world: World, method: str) -> None:
    response = world.serve(method, "echo/items/7", world.echo_token, content=b'{"a": 1}')

    echoed = response.json()
    assert (echoed["method"], echoed["path"], echoed["body"]) == (method, "/items/7", '{"a": 1}')


def test_it_forwards_the_root_of_a_service(world: World) -> None:
    assert world.serve("GET", "echo", world.echo_token).json()["path"] == "/"
    assert world.serve("GET", "echo/", world.echo_token).json()["path"] == "/"


def test_it_keeps_escapes_in_the_path(world: World) -> None:
    response = world.serve("GET", "echo/models/org%2Fname/files", world.echo_token)

    assert response.json()["path"] == "/models/org%2Fname/files"


def test_it_replaces_the_client_credential_and_drops_hop_by_hop_headers(world: World) -> None:
    response = world.serve(
        "GET",
        "echo/headers",
        world.echo_token,
        headers={
            "X-Custom": "kept",
            "Cookie": "session=abc",
            "Connection": "keep-alive, X-Private",
            "X-Private": "dropped",
            "Proxy-Authorization": "Basic c2VjcmV0",
        },
    )

    headers = response.json()["headers"]
    assert headers["authorization"] == f"Bearer {REPLICA_CREDENTIAL}"
    assert headers["x-custom"] == "kept"
    assert headers["cookie"] == "session=abc"
    assert "x-private" not in headers
    assert "proxy-authorization" not in headers
    assert headers["host"] == urlsplit(world.echo.url).netloc


def test_it_relays_the_replica_own_headers(world: World) -> None:
    response = world.serve("GET", "echo/", world.echo_token)

    assert response.headers["set-cookie"] == "replica=1; Path=/"
    assert response.headers["x-echo"] == "yes"
    assert response.headers["content-type"] == "application/json"


def test_it_answers_a_head_request_without_a_body(world: World) -> None:
    response = world.serve("HEAD", "echo/", world.echo_token)

    assert response.status_code == 200
    assert response.content == b""
    assert response.headers["x-echo"] == "yes"


def test_it_relays_events_as_the_replica_produces_them(world: World) -> None:
    arrivals: list[float] = []
    with LOOPBACK.stream(
        "GET",
        f"{world.nexus.url}/serve/open/drip",
        timeout=10,
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                arrivals.append(time.monotonic())

    assert response.headers["content-type"] == "text/event-stream"
    assert len(arrivals) == DRIP_EVENTS
    # Relayed as produced, the first event arrives well before the replica writes its last one.
    assert world.echo.drip_finished[-1] - arrivals[0] >= DRIP_INTERVAL_S * (DRIP_EVENTS - 2)


def test_it_relays_a_replica_error_status_with_its_body(world: World) -> None:
    response = world.serve("GET", "echo/status/418", world.echo_token)

    assert response.status_code == 418
    assert response.json()["path"] == "/status/418"


def test_it_rejects_a_body_over_the_limit(world: World) -> None:
    response = world.serve("POST", "echo/", world.echo_token, content=b"x" * (16 * 1024 * 1024 + 1))

    assert response.status_code == 413
    assert _error(response)["code"] == "request_too_large"


@pytest.mark.parametrize("path", ["echo/a/%2e%2e/%2E%2E/agent/v1/processes", "echo/..%2F..%2Fx"])
def test_it_refuses_dot_segments_that_would_leave_the_replica(world: World, path: str) -> None:
    response = world.serve("GET", path, world.echo_token)

    assert response.status_code == 400
    assert _error(response)["code"] == "invalid_path"


def test_it_refuses_a_literal_dot_segment_sent_as_is(world: World) -> None:
    # httpx would resolve "..": write the request line by hand.
    with socket.create_connection(("127.0.0.1", world.nexus.port), timeout=5) as sock:
        sock.sendall(
            b"GET /serve/echo/x/../../../agent/v1/processes HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Authorization: Bearer " + world.echo_token.encode() + b"\r\n"
            b"Connection: close\r\n\r\n"
        )
        status_line = sock.recv(4096).split(b"\r\n", 1)[0]

    assert b" 400 " in status_line


def test_it_cancels_the_replica_request_when_the_client_disconnects(world: World) -> None:
    request = json.dumps(
        {
            "model": "demo-8b",
            "messages": [{"role": "user", "content": "a long answer please"}],
            "max_tokens": 200,
            "stream": True,
        }
    ).encode()
    with socket.create_connection(("127.0.0.1", world.nexus.port), timeout=5) as sock:
        sock.sendall(
            b"POST /serve/slowchat/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\n"
            b"Content-Length: " + str(len(request)).encode() + b"\r\n\r\n" + request
        )
        assert b"200" in sock.recv(4096).split(b"\r\n", 1)[0]
        wait_until(lambda: world.slow.stats()["requests_running"] == 1, timeout_s=5)

    # 200 tokens at 40 ms would keep the engine busy for 8 s; the disconnect frees it at once.
    wait_until(lambda: world.slow.stats()["requests_running"] == 0, timeout_s=2)


def test_it_records_the_method_and_path_in_the_history(world: World, django_db_blocker) -> None:
    response = world.serve("POST", "echo/recorded?secret=1", world.echo_token, content=b"{}")
    request_id = response.headers["x-nexus-request-id"]

    with django_db_blocker.unblock():
        record = wait_until(
            lambda: (
                RoutingRecord.objects.select_related("pool").filter(request_id=request_id).first()
            ),
            timeout_s=5,
        )

    assert record.kind == "http"
    assert record.pool.slug == "echo"
    assert record.target_name == "echo-1"
    assert record.decision["request"]["method"] == "POST"
    assert record.decision["request"]["path"] == "/serve/echo/recorded"


# Retries


def test_it_retries_an_idempotent_request_that_a_replica_refused(world: World) -> None:
    response = world.serve("GET", "twice/status/503", world.service_tokens["twice"])

    assert response.status_code == 503
    assert response.headers["x-nexus-attempts"] == "2"


def test_it_never_sends_a_post_again_once_a_replica_may_have_acted_on_it(world: World) -> None:
    response = world.serve("POST", "twice/status/503", world.service_tokens["twice"], content=b"{}")

    assert response.status_code == 503
    assert response.headers["x-nexus-attempts"] == "1"
    assert response.json()["method"] == "POST"  # the replica's own answer, relayed


# Authentication and scope


@pytest.mark.parametrize("scheme", ["Bearer", "BackendAI", "backendai"])
def test_it_accepts_a_service_token_in_either_scheme(world: World, scheme: str) -> None:
    response = world.serve("GET", "echo/", world.echo_token, scheme=scheme)

    assert response.status_code == 200


def test_it_refuses_a_request_without_a_token(world: World) -> None:
    response = world.serve("GET", "echo/")

    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert _error(response) == {
        "message": "Service 'echo' is not open to the public: send"
        " 'Authorization: BackendAI <token>' or 'Authorization: Bearer <token>'.",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }


@pytest.mark.parametrize(
    ("which", "code", "message"),
    [
        ("unknown", "invalid_api_key", "Invalid client token."),
        ("revoked", "invalid_api_key", "This token was revoked."),
        ("expired", "token_expired", "This token expired at "),
    ],
)
def test_it_refuses_unknown_revoked_and_expired_tokens_each_with_its_reason(
    world: World, which: str, code: str, message: str
) -> None:
    token = {"unknown": "nx-unknown", "revoked": world.revoked_token}.get(
        which, world.expired_token
    )

    response = world.serve("GET", "echo/", token, scheme="BackendAI")

    assert response.status_code == 401
    assert _error(response)["code"] == code
    assert _error(response)["message"].startswith(message)


def test_it_says_when_an_expired_token_expired(world: World, django_db_blocker) -> None:
    with django_db_blocker.unblock():
        expired = ApiToken.objects.get(name="echo caller", expires_at__lt=timezone.now())
    moment = expired.expires_at.isoformat(timespec="seconds").replace("+00:00", "Z")

    response = world.serve("GET", "echo/", world.expired_token)

    assert _error(response)["message"] == f"This token expired at {moment}."


def test_it_refuses_a_token_of_another_service_with_403(world: World) -> None:
    response = world.serve("GET", "echo/", world.chat_token)

    assert response.status_code == 403
    assert _error(response) == {
        "message": "This token may not call service 'echo'.",
        "type": "permission_error",
        "param": None,
        "code": "service_not_allowed",
    }


@pytest.mark.parametrize("which", ["client", "chat_pool"])
def test_it_refuses_ordinary_client_tokens_on_a_service(world: World, which: str) -> None:
    token = world.client_token if which == "client" else world.chat_pool_token

    response = world.serve("GET", "echo/", token)

    assert response.status_code == 403


def test_a_public_service_needs_no_token_and_ignores_a_bad_one(world: World) -> None:
    without = world.serve("GET", "open/x")
    with_garbage = world.serve("GET", "open/x", "nx-garbage")

    assert without.status_code == 200
    assert with_garbage.status_code == 200
    # The caller's credential never reaches the replica; the replica's does.
    assert with_garbage.json()["headers"]["authorization"] == f"Bearer {REPLICA_CREDENTIAL}"


@pytest.mark.parametrize("name", ["nope", "gone"])
def test_it_answers_404_for_an_unknown_or_destroyed_service(world: World, name: str) -> None:
    response = world.serve("GET", f"{name}/x", world.echo_token)

    assert response.status_code == 404
    assert _error(response) == {
        "message": f"Service '{name}' does not exist.",
        "type": "invalid_request_error",
        "param": None,
        "code": "service_not_found",
    }


def test_it_answers_503_when_a_service_has_no_ready_replica(world: World) -> None:
    response = world.serve("GET", "idle/x", world.service_tokens["idle"])

    assert response.status_code == 503
    assert _error(response)["message"] == "Service 'idle' has no ready replica (0 of 2 ready)."
    assert _error(response)["code"] == "no_target_available"


# @pool/<service> on /v1


def test_a_service_token_calls_the_service_pool_with_the_openai_sdk(world: World) -> None:
    raw = world.sdk(world.chat_token).chat.completions.with_raw_response.create(
        model="@pool/chat", messages=[{"role": "user", "content": "Hello"}], max_tokens=3
    )

    assert raw.parse().choices[0].message.content
    assert raw.headers["x-nexus-target"] == "chat-1"


def test_a_service_token_streams_from_the_service_pool(world: World) -> None:
    chunks = list(
        world.sdk(world.chat_token).chat.completions.create(
            model="@pool/chat", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
            stream=True,
        )
    )  # fmt: skip

    assert sum(1 for chunk in chunks if chunk.choices and chunk.choices[0].delta.content) == 4


def test_the_openai_api_of_a_service_is_also_reachable_under_serve(world: World) -> None:
    response = world.serve(
        "POST",
        "chat/v1/chat/completions",
        world.chat_token,
        scheme="BackendAI",
        json={"model": "demo-8b", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
    )

    assert response.status_code == 200
    assert response.json()["object"] == "chat.completion"


def test_models_lists_a_service_pool_only_for_its_tokens(world: World) -> None:
    for_service = [model.id for model in world.sdk(world.chat_token).models.list()]
    for_client = [model.id for model in world.sdk(world.client_token).models.list()]

    assert for_service == ["@pool/chat"]
    assert for_client == ["@pool/plain"]


@pytest.mark.parametrize("which", ["client", "chat_pool"])
def test_ordinary_tokens_cannot_call_a_service_pool(world: World, which: str) -> None:
    token = world.client_token if which == "client" else world.chat_pool_token

    with pytest.raises(openai.PermissionDeniedError) as caught:
        world.sdk(token).chat.completions.create(
            model="@pool/chat", messages=[{"role": "user", "content": "x"}]
        )

    assert caught.value.response.json()["error"]["code"] == "pool_not_allowed"


def test_a_service_token_cannot_call_an_ordinary_pool(world: World) -> None:
    with pytest.raises(openai.PermissionDeniedError):
        world.sdk(world.chat_token).chat.completions.create(
            model="@pool/plain", messages=[{"role": "user", "content": "x"}]
        )


def test_a_destroyed_service_pool_is_not_found(world: World) -> None:
    with pytest.raises(openai.NotFoundError):
        world.sdk(world.service_tokens["gone"]).chat.completions.create(
            model="@pool/gone", messages=[{"role": "user", "content": "x"}]
        )


# Revocation


def test_a_revocation_from_another_process_stops_the_token_at_once(
    world: World, django_db_blocker
) -> None:
    with django_db_blocker.unblock():
        token, secret = ApiToken.issue(
            "short-lived", services=["echo"], expires_at=timezone.now() + timedelta(days=1)
        )
    wait_until(lambda: world.serve("GET", "echo/", secret).status_code == 200, timeout_s=5)

    with django_db_blocker.unblock():
        # This test process revokes; the server learns it over Redis, not from its snapshot.
        tokens.revoke_service_token(token)
    response = world.serve("GET", "echo/", secret)

    assert response.status_code == 401
    assert _error(response)["message"] == "This token was revoked."


def test_an_announced_revocation_alone_stops_the_token_in_the_server(
    world: World, django_db_blocker
) -> None:
    # Not revoked in the database (no snapshot change): only the announcement can stop it.
    with django_db_blocker.unblock():
        token, secret = ApiToken.issue(
            "announced", services=["echo"], expires_at=timezone.now() + timedelta(days=1)
        )
    wait_until(lambda: world.serve("GET", "echo/", secret).status_code == 200, timeout_s=5)

    confirmed = revocations.announce(token.token_hash)
    response = world.serve("GET", "echo/", secret)

    assert confirmed == 1  # the server's one gateway process dropped it before announce returned
    assert response.status_code == 401


# The hot path


async def _call(app: Gateway, path: str, token: str) -> list[dict]:
    """Drive the ASGI app as a server would and return what it sent."""
    headers = [(b"authorization", f"BackendAI {token}".encode())]
    return await asgi.call(app, asgi.http_scope("GET", path, headers, query_string=b"q=1"))


@pytest.mark.django_db(transaction=True)
async def test_a_warm_serve_request_makes_no_database_query(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with running_echo_server() as echo:

        def configure() -> str:
            make_service("hot", echo.url)
            return service_token("hot")

        token = await sync_to_async(configure)()
        registry = Registry(refresh_interval_s=3600)
        # History is shipped in batches in the background, off the request path: not counted.
        history = HistoryShipper(ship_interval_s=3600, batch_size=1000)
        app = Gateway(registry, GatewayState(ledger=MemoryLedger(), history=history))
        await _call(app, "/serve/hot/x", token)  # loads the snapshot

        cursors: list[str] = []
        real_cursor = BaseDatabaseWrapper.cursor

        def counting_cursor(self: BaseDatabaseWrapper) -> Any:
            cursors.append(self.alias)
            return real_cursor(self)

        monkeypatch.setattr(BaseDatabaseWrapper, "cursor", counting_cursor)
        statuses = []
        for _ in range(20):
            sent = await _call(app, "/serve/hot/x", token)
            statuses.append(sent[0]["status"])
        monkeypatch.undo()
        await app.aclose()
        await upstream.close()

    assert statuses == [200] * 20
    assert cursors == []
