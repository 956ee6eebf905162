"""Hostile requests are refused from their headers, before any work, and the server stays healthy.

Each runs against a real server process, daphne and uvicorn alike, over raw sockets so that the
test controls every byte sent. After each, the server answers /healthz and a real chat request.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nexus.models import ApiToken
from pools.models import Pool
from tests.nexus.factories import make_pool, make_target
from tests.support import outcomes
from tests.support.http import LOOPBACK
from tests.support.live import LiveServer, running_nexus
from tests.support.simulator import Simulator, running_simulator
from tests.support.traffic import chat_body, parse_headers, send

MIB = 1024 * 1024
SERVERS = ["daphne", "uvicorn"]
# The timeouts are patched into each of uvicorn's HTTP protocols: these tests run on both.
TIMEOUT_SERVERS = [*SERVERS, "uvicorn-h11"]
HEADER_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 2.0
# A server's timer may fire this much before the test's own clock says the timeout passed:
# uvloop reads its clock once per loop turn, in milliseconds (a CI run saw a 408 after 1.9997 s).
LOOP_CLOCK_SLACK_S = 0.01
# Every exchange with a hostile client ends within this, or the test fails.
EXCHANGE_TIMEOUT_S = 10.0


@dataclass
class Stack:
    server: LiveServer
    engine: Simulator
    token: str
    tmp_dir: Path  # the server's TMPDIR: a spooled body would show up here
    name: str
    pool: str  # the slug of the pool it serves


@pytest.fixture(scope="module")
def engine() -> Iterator[Simulator]:
    with running_simulator(model="demo-8b", ttft_ms=0, tpot_ms=0) as simulator:
        yield simulator


@pytest.fixture(scope="module", params=SERVERS)
def served(
    request: pytest.FixtureRequest,
    committed_db: None,
    django_db_blocker,
    engine: Simulator,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    """One Nexus per server kind for the whole module: each test's hostile client must leave it
    serving (`stack` checks), so one start per kind tells as much as one per test did."""
    slug = f"hostile-{request.param}-{secrets.token_hex(3)}"
    tmp_path = tmp_path_factory.mktemp(f"hostile-{request.param}")
    try:
        with django_db_blocker.unblock():
            pool = make_pool(slug)
            make_target(pool, "engine", base_url=engine.base_url, model_id="demo-8b")
            _, token = ApiToken.issue(slug)
        server_tmp = tmp_path / "server-tmp"
        server_tmp.mkdir()
        env = {
            "TMPDIR": str(server_tmp),
            "NEXUS_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
            "NEXUS_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
        }
        with running_nexus(tmp_path, server=request.param, **env) as server:
            yield Stack(server, engine, token, server_tmp, request.param, slug)
    finally:
        with django_db_blocker.unblock():
            Pool.objects.filter(slug=slug).delete()
            ApiToken.objects.filter(name=slug).delete()


@pytest.fixture
def stack(served: Stack) -> Iterator[Stack]:
    """The module's server of this kind, serving before the test and still after it."""
    assert_serving(served)  # also loads the gateway's snapshot
    yield served
    assert_serving(served)


def assert_serving(stack: Stack) -> None:
    """The server is healthy: /healthz answers and a real chat request is served."""
    assert LOOPBACK.get(f"{stack.server.url}/healthz", timeout=5).status_code == 200
    answer = send(
        f"{stack.server.url}/v1/chat/completions", stack.token, chat_body(stack.pool), timeout_s=10
    )
    assert answer.status == 200, answer.content


def connect(stack: Stack) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", stack.server.port), timeout=EXCHANGE_TIMEOUT_S)
    return sock


def read_answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Read one HTTP answer (status, headers, body) until the connection closes or it is whole."""
    data = b""
    deadline = time.monotonic() + EXCHANGE_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        data += chunk
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            headers = parse_headers(head)
            if len(body) >= int(headers.get("content-length", "-1")) >= 0:
                break
    head, _, body = data.partition(b"\r\n\r\n")
    assert head, "no answer at all: the connection was dropped"
    status = int(head.split(b" ", 2)[1])
    return status, parse_headers(head), body


def assert_openai_error(status: int, headers: dict[str, str], body: bytes, code: str) -> None:
    assert headers["content-type"] == "application/json"
    assert len(headers["x-nexus-request-id"]) == 32
    error = json.loads(body)["error"]
    assert error["code"] == code, error
    assert set(error) == {"message", "type", "param", "code"}


def open_files(pid: int) -> list[str]:
    """Return what the process's file descriptors point at, sockets and pipes aside."""
    names = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:
            continue  # closed meanwhile
        if not target.startswith(("socket:", "pipe:", "anon_inode:", "/dev/")):
            names.append(target)
    return names


def test_an_unauthenticated_300_mib_chunked_upload_is_refused_before_its_body(
    stack: Stack,
) -> None:
    pid = stack.server.process.pid
    files_before = set(open_files(pid))
    sock = connect(stack)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    started = time.monotonic()
    chunk = b"%x\r\n" % MIB + b"x" * MIB + b"\r\n"
    sent = 0
    new_files: set[str] = set()
    try:
        while sent < 300 * MIB:
            sock.sendall(chunk)
            sent += MIB
            new_files |= set(open_files(pid)) - files_before
    except (BrokenPipeError, ConnectionResetError, TimeoutError):
        pass  # the server closed the connection: the point
    refused_after = time.monotonic() - started
    status, headers, body = read_answer(sock)
    sock.close()

    assert status == 401
    assert_openai_error(status, headers, body, "invalid_api_key")
    assert headers.get("connection") == "close"
    # What the kernel's socket buffers took before the close, not what the server read.
    assert sent <= 32 * MIB, f"{sent / MIB:.0f} MiB were accepted before the refusal"
    assert new_files == set(), new_files
    assert list(stack.tmp_dir.iterdir()) == []
    outcomes.record_fault(
        "300 MiB chunked upload, no token",
        stack.name,
        1,
        0,
        refused_after,
        f"401 JSON after {sent / MIB:.0f} MiB sent (socket buffers), no file opened",
    )


def test_an_anonymous_300_mib_chunked_body_to_the_admin_api_stops_at_the_body_limit(
    stack: Stack,
) -> None:
    # Django reads a body before its authentication runs: the limit must hold without a token.
    sock = connect(stack)
    sock.sendall(
        b"POST /api/v1/pools/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    started = time.monotonic()
    chunk = b"%x\r\n" % MIB + b"x" * MIB + b"\r\n"
    sent = 0
    try:
        while sent < 300 * MIB:
            sock.sendall(chunk)
            sent += MIB
    except (BrokenPipeError, ConnectionResetError, TimeoutError):
        pass  # the server closed the connection: the point
    refused_after = time.monotonic() - started
    status, headers, body = read_answer(sock)
    sock.close()

    assert status == 413, body
    assert headers["content-type"] == "application/json"
    assert "NEXUS_MAX_BODY_BYTES" in json.loads(body)["detail"]
    # The 16 MiB limit, plus what the kernel's socket buffers took before the close.
    assert sent <= 16 * MIB + 32 * MIB, f"{sent / MIB:.0f} MiB were accepted before the refusal"
    assert list(stack.tmp_dir.iterdir()) == []
    outcomes.record_fault(
        "300 MiB chunked body to /api/v1/, no token",
        stack.name,
        1,
        0,
        refused_after,
        f"413 JSON after {sent / MIB:.0f} MiB sent (the 16 MiB limit and socket buffers)",
    )


def test_a_declared_1_gib_body_is_refused_at_once(stack: Stack) -> None:
    sock = connect(stack)
    started = time.monotonic()
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Authorization: Bearer " + stack.token.encode() + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (1 << 30)
    )
    status, headers, body = read_answer(sock)
    took = time.monotonic() - started
    sock.close()

    assert status == 413
    assert_openai_error(status, headers, body, "request_too_large")
    assert took < 2.0
    outcomes.record_fault(
        "1 GiB Content-Length, valid token",
        stack.name,
        1,
        0,
        took,
        "413 JSON from the headers alone",
    )


def test_json_nested_100k_deep_is_a_400_in_the_openai_shape(stack: Stack) -> None:
    body = b'{"model": "@pool/hostile", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"

    started = time.monotonic()
    response = LOOPBACK.post(
        f"{stack.server.url}/v1/chat/completions",
        content=body,
        headers={"Authorization": f"Bearer {stack.token}", "Content-Type": "application/json"},
        timeout=EXCHANGE_TIMEOUT_S,
    )

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"
    assert "nested too deeply" in response.json()["error"]["message"]
    outcomes.record_fault(
        "JSON nested 100k deep", stack.name, 1, 0, time.monotonic() - started, "400 JSON"
    )


def test_64_kb_of_headers_is_a_431(stack: Stack) -> None:
    sock = connect(stack)
    started = time.monotonic()
    padding = b"".join(b"X-Pad-%d: %s\r\n" % (n, b"a" * 1000) for n in range(64))
    sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n" + padding + b"\r\n")
    status, headers, body = read_answer(sock)
    sock.close()

    assert status == 431
    assert_openai_error(status, headers, body, "request_header_fields_too_large")
    outcomes.record_fault(
        "64 KB of headers", stack.name, 1, 0, time.monotonic() - started, "431 JSON"
    )


def test_a_20_kb_path_is_a_414(stack: Stack) -> None:
    sock = connect(stack)
    started = time.monotonic()
    sock.sendall(b"GET /v1/" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    status, headers, body = read_answer(sock)
    sock.close()

    assert status == 414
    assert_openai_error(status, headers, body, "uri_too_long")
    outcomes.record_fault("20 KB path", stack.name, 1, 0, time.monotonic() - started, "414 JSON")


@pytest.mark.parametrize("served", TIMEOUT_SERVERS, indirect=True)
def test_a_slowloris_connection_is_closed_after_the_header_timeout(stack: Stack) -> None:
    sock = connect(stack)
    started = time.monotonic()
    sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    closed_after = None
    # One header byte every 0.25 s: never idle long enough for an idle timeout to fire.
    while time.monotonic() - started < HEADER_TIMEOUT_S + 5:
        try:
            sock.sendall(b"X")
        except (BrokenPipeError, ConnectionResetError):
            closed_after = time.monotonic() - started
            break
        time.sleep(0.25)
    sock.close()

    assert closed_after is not None, "the connection was still open"
    assert closed_after < HEADER_TIMEOUT_S + 2
    outcomes.record_fault(
        "slowloris (1 header byte / 0.25 s)",
        stack.name,
        1,
        0,
        closed_after,
        f"closed after {closed_after:.1f} s (header timeout {HEADER_TIMEOUT_S:g} s)",
    )


@pytest.mark.parametrize("served", TIMEOUT_SERVERS, indirect=True)
def test_a_body_that_stops_arriving_gets_a_408_after_the_body_timeout(stack: Stack) -> None:
    body = json.dumps(chat_body(stack.pool)).encode()
    sock = connect(stack)
    started = time.monotonic()
    # The headers and half the body, then nothing more.
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Authorization: Bearer " + stack.token.encode() + b"\r\n"
        b"Content-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body[: len(body) // 2]
    )
    status, headers, answer = read_answer(sock)
    answered_after = time.monotonic() - started
    sock.close()

    assert status == 408
    assert_openai_error(status, headers, answer, "request_timeout")
    assert "NEXUS_BODY_TIMEOUT_S" in json.loads(answer)["error"]["message"]
    assert BODY_TIMEOUT_S - LOOP_CLOCK_SLACK_S <= answered_after < BODY_TIMEOUT_S + 3
    outcomes.record_fault(
        "body stops after half",
        stack.name,
        1,
        0,
        answered_after,
        f"408 JSON after {answered_after:.1f} s (body timeout {BODY_TIMEOUT_S:g} s)",
    )


@pytest.mark.parametrize("served", TIMEOUT_SERVERS, indirect=True)
def test_a_body_that_keeps_arriving_slowly_is_not_cut_off(stack: Stack) -> None:
    body = json.dumps(chat_body(stack.pool)).encode()
    sock = connect(stack)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Authorization: Bearer " + stack.token.encode() + b"\r\n"
        b"Content-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    # Slower in all than the timeout, but never idle for as long: an idle timeout, as nginx's.
    pieces = [body[i : i + len(body) // 6 + 1] for i in range(0, len(body), len(body) // 6 + 1)]
    for piece in pieces:
        time.sleep(BODY_TIMEOUT_S / 3)
        sock.sendall(piece)
    status, _, answer = read_answer(sock)
    sock.close()

    assert status == 200, answer
    assert json.loads(answer)["choices"][0]["message"]["content"]


def test_a_client_that_reads_slowly_gets_the_whole_stream_in_order(stack: Stack) -> None:
    # Several MiB of stream to a client that reads nothing for a second through a 4 KiB window:
    # the server's socket buffer fills, so its writes go both straight out and through its own
    # buffer (nexus.eager_writes under daphne), and the bytes must still come in order.
    body = chat_body(stack.pool, max_tokens=30_000, seed=7)
    answer = send(f"{stack.server.url}/v1/chat/completions", stack.token, body, timeout_s=30)
    assert answer.status == 200, answer.content
    expected = json.loads(answer.content)["choices"][0]["message"]["content"]
    payload = json.dumps({**body, "stream": True}).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(EXCHANGE_TIMEOUT_S)
    sock.connect(("127.0.0.1", stack.server.port))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        b"Authorization: Bearer " + stack.token.encode() + b"\r\n"
        b"Content-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(payload) + payload
    )
    time.sleep(1.0)
    received = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        piece = sock.recv(65536)
        if not piece:
            break
        received.append(piece)
    sock.close()
    head, _, chunked = b"".join(received).partition(b"\r\n\r\n")

    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"transfer-encoding: chunked" in head.lower(), head
    events = dechunk(chunked).decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""], events[-3:]
    deltas = [json.loads(event[len("data: ") :])["choices"] for event in events[:-2]]
    streamed = "".join(c[0]["delta"].get("content") or "" for c in deltas if c)
    assert len(streamed) > 4 * MIB // 30  # several MiB of events, not a short answer
    assert streamed == expected


def dechunk(body: bytes) -> bytes:
    """Return the payload of a chunked HTTP body, checking every chunk's framing."""
    payload = []
    position = 0
    while True:
        size_line, _, _ = body[position:].partition(b"\r\n")
        size = int(size_line, 16)
        start = position + len(size_line) + 2
        assert body[start + size : start + size + 2] == b"\r\n", f"bad framing at {start + size}"
        if size == 0:
            assert start + 2 == len(body), "bytes after the last chunk"
            return b"".join(payload)
        payload.append(body[start : start + size])
        position = start + size + 2
