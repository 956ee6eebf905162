"""Send OpenAI requests to a live Nexus from test threads and keep what the client saw."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx


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
    with httpx.stream(
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
