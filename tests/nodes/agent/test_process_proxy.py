"""A process's own HTTP port through the agent: real servers, the OpenAI SDK, and the refusals."""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.nodes.agent.test_processes_api import SLEEP, WAIT_S, python, wait_for_log
from tests.support.agent import RunningAgent, running_agent, start_managed_simulator
from tests.support.http import LOOPBACK
from tests.support.waiting import wait_until

MESSAGES = [{"role": "user", "content": "tell me about the fleet"}]
# The agent gives up on a runtime that sends nothing for this long (a paced stream sends a token
# every 100 ms, well within it).
UPSTREAM_TIMEOUT_S = 3
# A server that answers every method with what it received: method, raw path and query, headers
# (lower-cased names) and the body's length and digest (chunked bodies decoded, each chunk noted
# in its log as it arrives). `?status=N` sets the status of the answer.
ECHO = """
    import hashlib, json, sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import parse_qs, urlsplit

    class Echo(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def read_body(self):
            if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
                return self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = b""
            while size := int(self.rfile.readline().split(b";")[0], 16):
                body += self.rfile.read(size)
                self.rfile.readline()
                print(f"received a chunk of {size} bytes", flush=True)
            self.rfile.readline()
            return body

        def answer(self):
            body = self.read_body()
            status = int(parse_qs(urlsplit(self.path).query).get("status", ["200"])[0])
            reply = json.dumps({
                "method": self.command,
                "path": self.path,
                "headers": {name.lower(): value for name, value in self.headers.items()},
                "length": len(body),
                "sha256": hashlib.sha256(body).hexdigest(),
                "body": body.decode(errors="replace") if len(body) < 1000 else None,
            }).encode()
            self.send_response(status)
            self.send_header("X-Echo", "yes")
            if status == 204:
                self.end_headers()
                return
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(reply)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = answer

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Echo)
    print("ready", flush=True)
    server.serve_forever()
"""


class Node:
    """One agent running an echo server, `python -m http.server` and a paced simulator."""

    def __init__(self, agent: RunningAgent, files: Path) -> None:
        self.agent = agent
        self.http = httpx.Client(base_url=agent.url, headers=agent.headers(), timeout=30)
        self.echo = self.start([*python(ECHO), "${PORT}"])
        self.files = self.start(
            [sys.executable, "-m", "http.server", "${PORT}", "--bind", "127.0.0.1"],
            cwd=str(files),
        )
        self.paced = start_managed_simulator(
            agent, "paced", "--ttft-ms", "0", "--tpot-ms", "100", "--concurrency", "4"
        )
        wait_for_log(self.http, self.echo["id"], "ready")
        wait_for_log(self.http, self.files["id"], "Serving HTTP")

    def start(self, argv: list[str], **spec: Any) -> dict[str, Any]:
        response = self.http.post("/agent/v1/processes", json={"argv": argv, **spec})
        assert response.status_code == 201, response.text
        process: dict[str, Any] = response.json()
        return process

    def url(self, process: dict[str, Any], path: str = "") -> str:
        """Return the agent's URL for `path` on the process's port."""
        return f"/agent/v1/processes/{process['id']}/http{path}"

    def sdk(self, process: dict[str, Any]) -> openai.OpenAI:
        """Return an OpenAI client whose base URL is the process's /v1 through the agent."""
        return openai.OpenAI(
            base_url=f"{self.agent.url}{self.url(process, '/v1')}",
            api_key=self.agent.credential,
            max_retries=0,
            timeout=30,
        )

    def stats(self, process: dict[str, Any]) -> dict[str, Any]:
        """Return a simulator's counters, read from it directly."""
        stats: dict[str, Any] = LOOPBACK.get(f"http://127.0.0.1:{process['port']}/sim/stats").json()
        return stats


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    tmp_path = tmp_path_factory.mktemp("proxy")
    files = tmp_path / "files"
    files.mkdir()
    (files / "hello.txt").write_text("hello from the process\n")
    with running_agent(
        tmp_path,
        args=["--allow-dir", str(files)],
        env={"NEXUS_AGENT_UPSTREAM_TIMEOUT_S": str(UPSTREAM_TIMEOUT_S)},
    ) as agent:
        node = Node(agent, files)
        yield node
        node.http.close()


def echoed(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def assert_error(response: httpx.Response, status: int, code: str) -> str:
    """Assert the agent's error answer and return its message."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code
    message: str = error["message"]
    return message


# -- any method, path, query and body ------------------------------------------------------------


def test_a_get_reaches_the_process_with_its_path_and_query_unchanged(node: Node) -> None:
    response = node.http.get(node.url(node.echo, "/some/deep%2Fpath?b=2&a=1&a=%20x"))

    seen = echoed(response)
    assert (seen["method"], seen["path"]) == ("GET", "/some/deep%2Fpath?b=2&a=1&a=%20x")
    assert seen["headers"]["host"] == f"127.0.0.1:{node.echo['port']}"
    assert response.headers["X-Echo"] == "yes"


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_a_request_with_a_body_carries_method_body_and_headers(node: Node, method: str) -> None:
    response = node.http.request(
        method,
        node.url(node.echo, "/items/7?dry_run=1"),
        content=b'{"name": "seven"}',
        headers={"Content-Type": "application/json", "X-Request-Id": "r-1"},
    )

    seen = echoed(response)
    assert (seen["method"], seen["path"], seen["body"]) == (
        method,
        "/items/7?dry_run=1",
        '{"name": "seven"}',
    )
    assert seen["headers"]["content-type"] == "application/json"
    assert seen["headers"]["x-request-id"] == "r-1"
    assert seen["headers"]["content-length"] == "17"


def test_the_callers_credential_never_reaches_the_process(node: Node) -> None:
    seen = echoed(node.http.get(node.url(node.echo, "/")))

    assert "authorization" not in seen["headers"]
    assert node.agent.credential not in json.dumps(seen)


def test_the_process_root_is_reached_with_or_without_a_trailing_slash(node: Node) -> None:
    without = echoed(node.http.get(node.url(node.echo)))
    with_slash = echoed(node.http.get(node.url(node.echo, "/?x=1")))

    assert (without["path"], with_slash["path"]) == ("/", "/?x=1")


def test_the_processes_status_and_headers_come_back(node: Node) -> None:
    created = node.http.post(node.url(node.echo, "/things?status=201"), content=b"x")
    empty = node.http.delete(node.url(node.echo, "/things/1?status=204"))

    assert created.status_code == 201
    assert created.json()["body"] == "x"
    assert (empty.status_code, empty.content, empty.headers["X-Echo"]) == (204, b"", "yes")


def test_an_error_status_from_the_process_itself_is_not_marked_undelivered(node: Node) -> None:
    response = node.http.post(node.url(node.echo, "/things?status=503"), content=b"x")

    assert (response.status_code, response.headers["X-Echo"]) == (503, "yes")
    assert "X-Nexus-Not-Delivered" not in response.headers


def test_a_chunked_upload_is_streamed_on_to_the_process(node: Node) -> None:
    parts = [b"part-%d;" % index * 1000 for index in range(20)]

    seen = echoed(node.http.post(node.url(node.echo, "/upload"), content=iter(parts)))

    body = b"".join(parts)
    assert seen["headers"]["transfer-encoding"] == "chunked"
    assert (seen["length"], seen["sha256"]) == (len(body), hashlib.sha256(body).hexdigest())


def test_an_upload_reaches_the_process_while_the_caller_is_still_sending(node: Node) -> None:
    # The second part is sent only once the process has logged the first: an agent that
    # buffered the body would wait for the rest, and the wait below would fail.
    def parts() -> Iterator[bytes]:
        yield b"a" * 4321
        wait_for_log(node.http, node.echo["id"], "received a chunk of 4321 bytes")
        yield b"rest"

    seen = echoed(node.http.post(node.url(node.echo, "/upload"), content=parts()))

    assert seen["length"] == 4325


def test_a_compressed_body_reaches_the_process_decoded(node: Node) -> None:
    # The agent's server decodes request bodies, so the encoding must not be claimed again.
    body = b'{"prompt": "' + b"again " * 500 + b'"}'

    seen = echoed(
        node.http.post(
            node.url(node.echo, "/gzip"),
            content=gzip.compress(body),
            headers={"Content-Encoding": "gzip"},
        )
    )

    assert "content-encoding" not in seen["headers"]
    assert (seen["length"], seen["sha256"]) == (len(body), hashlib.sha256(body).hexdigest())


def test_a_large_body_arrives_whole(node: Node) -> None:
    body = bytes(range(256)) * 4096 * 8  # 8 MiB

    seen = echoed(node.http.put(node.url(node.echo, "/blob"), content=body))

    assert (seen["length"], seen["sha256"]) == (len(body), hashlib.sha256(body).hexdigest())


def test_a_body_over_the_agents_limit_is_refused_with_413(node: Node) -> None:
    body = b"x" * (16 * 1024 * 1024 + 1)

    declared = node.http.post(node.url(node.echo, "/blob"), content=body)
    chunked = node.http.post(
        node.url(node.echo, "/blob"), content=iter([body[: 1 << 20]] * 16 + [b"xx"])
    )

    assert_error(declared, 413, "request_too_large")
    assert_error(chunked, 413, "request_too_large")


def test_http_server_serves_a_file_and_its_listing_through_the_agent(node: Node) -> None:
    file = node.http.get(node.url(node.files, "/hello.txt"))
    head = node.http.head(node.url(node.files, "/hello.txt"))
    listing = node.http.get(node.url(node.files))

    assert (file.status_code, file.text) == (200, "hello from the process\n")
    assert file.headers["Content-Type"] == "text/plain"
    assert (head.status_code, head.headers["Content-Length"], head.content) == (200, "23", b"")
    assert "hello.txt" in listing.text


# -- a runtime through the agent ------------------------------------------------------------------


def test_the_openai_sdk_uses_the_process_through_the_agent_as_its_base_url(node: Node) -> None:
    sdk = node.sdk(node.paced)

    models = sdk.models.list()
    completion = sdk.chat.completions.create(model="paced", messages=MESSAGES, max_tokens=2)

    assert [model.id for model in models.data] == ["paced"]
    assert completion.model == "paced"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 2


def test_a_streamed_chat_is_relayed_chunk_by_chunk_while_it_is_generated(node: Node) -> None:
    # 10 tokens, 100 ms apart: the first must arrive while the runtime is still generating.
    stream = node.sdk(node.paced).chat.completions.create(
        model="paced", messages=MESSAGES, max_tokens=10, stream=True
    )
    arrivals = []
    running_at_first = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.monotonic())
            if running_at_first is None:
                running_at_first = node.stats(node.paced)["requests_running"]

    assert running_at_first == 1
    assert len(arrivals) == 10
    assert arrivals[-1] - arrivals[0] >= 0.6


def test_the_sse_framing_passes_through(node: Node) -> None:
    body = {"model": "paced", "messages": MESSAGES, "max_tokens": 2, "stream": True}

    response = node.http.post(node.url(node.paced, "/v1/chat/completions"), json=body)

    assert response.headers["Content-Type"].startswith("text/event-stream")
    events = [event for event in response.text.split("\n\n") if event]
    assert events[-1] == "data: [DONE]"
    assert all(event.startswith("data: ") for event in events)


def test_a_caller_that_disconnects_frees_the_runtimes_slot(node: Node) -> None:
    before = node.stats(node.paced)["requests_cancelled"]
    body = {"model": "paced", "messages": MESSAGES, "max_tokens": 200, "stream": True}

    with node.http.stream("POST", node.url(node.paced, "/v1/chat/completions"), json=body) as rsp:
        # Kept in a name: a dropped line iterator would close the connection at once.
        lines = rsp.iter_lines()
        first = next(lines)
        running_while_open = node.stats(node.paced)["requests_running"]
    # Leaving the block closed the connection after one line of a 20-second stream.

    wait_until(
        lambda: node.stats(node.paced)["requests_cancelled"] == before + 1,
        timeout_s=WAIT_S,
        what="the runtime sees the request cancelled",
    )
    assert first.startswith("data: ")
    assert running_while_open == 1
    assert node.stats(node.paced)["requests_running"] == 0


# -- refusals -------------------------------------------------------------------------------------


def test_an_unknown_process_is_not_found(node: Node) -> None:
    response = node.http.get("/agent/v1/processes/p-00000000/http/v1/models")

    assert assert_error(response, 404, "process_not_found") == (
        "process p-00000000 does not exist on this node"
    )


def test_a_process_that_has_ended_is_not_running(node: Node) -> None:
    exited = node.start([*python("print('bye')"), "${PORT}"])
    wait_until(
        lambda: node.http.get(f"/agent/v1/processes/{exited['id']}").json()["state"] == "exited",
        timeout_s=WAIT_S,
        what="the process exits",
    )
    stopped = node.start([*python(SLEEP), "${PORT}"])
    node.http.delete(f"/agent/v1/processes/{stopped['id']}", params={"grace": 5})

    for process, state in ((exited, "exited"), (stopped, "stopped")):
        response = node.http.post(node.url(process, "/v1/chat/completions"), json={})
        message = assert_error(response, 503, "process_not_running")
        assert message == f"process {process['id']} is {state}, not running"
        assert response.headers["X-Nexus-Not-Delivered"] == "1"


def test_a_process_without_a_port_cannot_be_reached(node: Node) -> None:
    portless = node.start(python(SLEEP))

    response = node.http.get(node.url(portless, "/health"))

    message = assert_error(response, 409, "process_has_no_port")
    assert message == f"process {portless['id']} has no port to forward to"
    assert response.headers["X-Nexus-Not-Delivered"] == "1"


def test_a_process_not_listening_on_its_port_is_a_502(node: Node) -> None:
    silent = node.start([*python(SLEEP), "${PORT}"])

    response = node.http.get(node.url(silent, "/health"))

    message = assert_error(response, 502, "runtime_unavailable")
    assert message.startswith(f"process {silent['id']} is unavailable: ")
    assert response.headers["X-Nexus-Not-Delivered"] == "1"


def test_a_process_that_does_not_answer_in_time_is_a_504(node: Node) -> None:
    hanging = start_managed_simulator(node.agent, "hanging", "--hang")
    body = {"model": "hanging", "messages": MESSAGES}

    started = time.monotonic()
    response = node.http.post(node.url(hanging, "/v1/chat/completions"), json=body)
    took = time.monotonic() - started

    message = assert_error(response, 504, "runtime_unavailable")
    assert message == f"process {hanging['id']} did not answer in time"
    assert "X-Nexus-Not-Delivered" not in response.headers  # it may be generating
    assert UPSTREAM_TIMEOUT_S - 0.1 <= took < UPSTREAM_TIMEOUT_S + 3


def test_the_proxy_needs_the_node_credential(node: Node) -> None:
    response = LOOPBACK.get(f"{node.agent.url}{node.url(node.echo, '/')}")
    sdk = openai.OpenAI(
        base_url=f"{node.agent.url}{node.url(node.paced, '/v1')}", api_key="wrong", max_retries=0
    )

    assert_error(response, 401, "invalid_credential")
    with pytest.raises(openai.AuthenticationError):
        sdk.models.list()
