"""Send OpenAI requests to a live Nexus from test threads and keep what the client saw."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from tests.support.http import LOOPBACK


@dataclass
class Answer:
    """One request's answer as the client saw it, with when it began and ended (monotonic)."""

    status: int
    headers: httpx.Headers
    content: bytes  # the body of a plain answer; empty for a stream
    events: list[str]  # a stream's `data:` payloads in order; empty for a plain answer
    started: float
    finished: float

    @property
    def request_id(self) -> str:
        return self.headers["x-nexus-request-id"]

    @property
    def target(self) -> str | None:
        """Return the target that answered (X-Nexus-Target), None when none did."""
        return self.headers.get("x-nexus-target")

    @property
    def attempts(self) -> int | None:
        value = self.headers.get("x-nexus-attempts")
        return int(value) if value is not None else None

    @property
    def done(self) -> bool:
        """Return whether the stream ended with `data: [DONE]`."""
        return bool(self.events) and self.events[-1] == "[DONE]"

    @property
    def elapsed_s(self) -> float:
        return self.finished - self.started

    def json(self) -> Any:
        return json.loads(self.content)

    def error(self) -> dict[str, Any]:
        """Return the OpenAI error object of an error answer."""
        return self.json()["error"]


def chat_body(
    pool: str,
    content: str = "Hello there",
    *,
    max_tokens: int = 2,
    stream: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    """Return a chat request for `@pool/<pool>`."""
    return {
        "model": f"@pool/{pool}",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
        **extra,
    }


def send(
    url: str,
    token: str,
    body: dict[str, Any],
    *,
    headers: dict[str, str] | None = None,
    timeout_s: float = 15.0,
    started: threading.Event | None = None,
) -> Answer:
    """POST the body and read the whole answer; set `started` once the response headers arrive."""
    began = time.monotonic()
    request_headers = {"Authorization": f"Bearer {token}", **(headers or {})}
    with LOOPBACK.stream(
        "POST", url, json=body, headers=request_headers, timeout=timeout_s
    ) as response:
        if started is not None:
            started.set()
        content = b""
        events: list[str] = []
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            events = [
                line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")
            ]
        else:
            content = response.read()
    return Answer(response.status_code, response.headers, content, events, began, time.monotonic())


@contextmanager
def raw_request(
    port: int, token: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> Iterator[socket.socket]:
    """Send a chat request on a bare socket to 127.0.0.1:port; leaving the block closes it (the
    client is gone)."""
    payload = json.dumps(body).encode()
    fields = {
        "Host": "127.0.0.1",
        "Authorization": f"Bearer {token}",
        **(headers or {}),
        "Content-Type": "application/json",
        "Content-Length": str(len(payload)),
    }
    head = "".join(f"{name}: {value}\r\n" for name, value in fields.items())
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\n{head}\r\n".encode() + payload)
        yield sock


def parse_headers(head: bytes) -> dict[str, str]:
    """Return an HTTP answer's header fields (names lowercased) from its head (status line and
    fields, without the blank line)."""
    lines = head.decode("latin-1").split("\r\n")[1:]
    return {name.lower(): value.strip() for name, _, value in (h.partition(":") for h in lines)}


@contextmanager
def holding_slot(
    port: int,
    token: str,
    pool: str,
    *,
    content: str = "Hello there",
    headers: dict[str, str] | None = None,
) -> Iterator[str | None]:
    """Hold a slot of the pool with a stream that lasts until the block ends (its client leaves
    then, which gives the slot back at once), and give the block the target holding it
    (X-Nexus-Target): the block's requests find it held however slowly they arrive, where a
    stream of so many tokens ends when a loaded machine has not yet sent them (two queue tests
    failed so on a slower 2-core machine)."""
    body = chat_body(pool, content, max_tokens=5000, stream=True)
    with raw_request(port, token, body, headers) as sock:
        received = b""
        while b"data:" not in received:
            chunk = sock.recv(4096)
            assert chunk, f"the holder's stream ended before its first event: {received!r}"
            received += chunk
        yield parse_headers(received.partition(b"\r\n\r\n")[0]).get("x-nexus-target")
