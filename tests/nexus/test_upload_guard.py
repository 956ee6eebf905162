"""A request declaring a body larger than any upload gets 413 before a byte of it is read.

Through the ASGI application itself, and through both servers Nexus runs under: daphne, which
otherwise reads a whole body before starting the application, and uvicorn.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from pytest_django.fixtures import Settings

from nexus.asgi import application
from nexus.models import ApiToken
from nexus.scopes import AdminAccess, TokenKind
from serving import folders
from serving.models import ModelFolder
from tests.nexus.factories import make_user
from tests.support import asgi, processes
from tests.support.http import LOOPBACK
from tests.support.live import REPO_ROOT, running_nexus, server_environment
from tests.support.ports import free_port
from tests.support.waiting import wait_until

MIB = 1024 * 1024
GB = 1000**3
TOO_LARGE = (
    "The file is larger than the upload limit of 1.0\xa0GB (1073741824 bytes per file, set by"
    " NEXUS_MAX_UPLOAD_BYTES); nothing was written."
)
UPLOAD = "/api/v1/model-folders/llama/files/"


async def call(path: str, content_length: int, body: bytes | None = None) -> list[dict[str, Any]]:
    """Send one POST through the ASGI application; return what it sent back.

    Without a body, reading the request fails the test: the answer must come unread.
    """
    headers = [(b"content-length", str(content_length).encode())]
    return await asgi.call(application, asgi.http_scope("POST", path, headers), body)


async def test_a_body_declared_over_the_limit_is_refused_unread(
    settings: Settings,
) -> None:
    settings.NEXUS_MAX_UPLOAD_BYTES = 1024

    start, body = await call(UPLOAD, 1024 + folders.MULTIPART_SLACK_BYTES + 1)

    assert start["status"] == 413
    assert (b"content-type", b"application/json") in start["headers"]
    assert json.loads(body["body"]) == {
        "detail": "The file is larger than the upload limit of 1.0\xa0KB (1024 bytes per file,"
        " set by NEXUS_MAX_UPLOAD_BYTES); nothing was written."
    }


async def test_a_body_within_the_limit_and_its_framing_reaches_django(
    settings: Settings,
) -> None:
    settings.NEXUS_MAX_UPLOAD_BYTES = 1024
    length = 1024 + folders.MULTIPART_SLACK_BYTES

    start, *_ = await call("/no-such-page/", length, b"x" * length)

    assert start["status"] == 404


async def test_a_chunked_body_past_the_limit_is_cut_off_as_it_arrives_and_refused(
    settings: Settings,
) -> None:
    settings.NEXUS_MAX_BODY_BYTES = 4 * MIB
    sent: list[dict[str, Any]] = []
    offered = 0

    async def receive() -> dict[str, Any]:
        # An endless chunked body, a MiB at a time: only the guard can end it.
        nonlocal offered
        offered += 1
        assert offered <= 100, "the application kept reading past the limit"
        return {"type": "http.request", "body": b"x" * MIB, "more_body": True}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/api/v1/pools/", "raw_path": b"/api/v1/pools/",
        "query_string": b"", "root_path": "", "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "headers": [(b"host", b"127.0.0.1"), (b"transfer-encoding", b"chunked")],
    }  # fmt: skip
    await application(scope, receive, send)

    start, body = sent
    assert start["status"] == 413
    assert (b"connection", b"close") in start["headers"]
    assert "NEXUS_MAX_BODY_BYTES" in json.loads(body["body"])["detail"]
    # The chunk that passed the limit was the last one read.
    assert offered == 5


@contextmanager
def running_uvicorn(tmp_dir: Path) -> Iterator[str]:
    """Run uvicorn with Nexus's ASGI application until the block ends; yield its URL."""
    port = free_port()
    log_path = tmp_dir / f"uvicorn-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "nexus.asgi:application", "--host", "127.0.0.1",
             "--port", str(port), "--lifespan", "off"],
            cwd=REPO_ROOT, env=server_environment(), stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"uvicorn exited:\n{log_path.read_text()}")
        try:
            return LOOPBACK.get(f"{url}/healthz", timeout=2).status_code in (200, 503)
        except httpx.HTTPError:
            return False

    try:
        wait_until(answers, timeout_s=30, what=log_path.read_text)
        yield url
    finally:
        processes.stop(process, timeout_s=10)


@contextmanager
def running(server: str, tmp_dir: Path) -> Iterator[str]:
    """Run Nexus under the named server; yield its URL."""
    if server == "uvicorn":
        with running_uvicorn(tmp_dir) as url:
            yield url
    else:
        with running_nexus(tmp_dir) as live:
            yield live.url


def declare_without_sending(url: str, path: str, length: int, token: str) -> bytes:
    """Send only the headers of a multipart POST declaring `length` bytes; return the answer.

    The client asks to be told to go on (Expect: 100-continue), as curl does for big bodies.
    """
    port = int(url.rsplit(":", 1)[1])
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: multipart/form-data; boundary=nexus\r\nContent-Length: {length}\r\n"
        "Expect: 100-continue\r\n\r\n"
    )
    answer = b""
    # The answer must come at once, while not a byte of the body was sent.
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        connection.sendall(head.encode())
        while chunk := connection.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize("server", ["daphne", "uvicorn"])
def test_a_2_gb_upload_is_refused_at_its_headers_and_nothing_is_written(
    transactional_db: None, settings: Settings, tmp_path: Path, server: str
) -> None:
    # Given a model folder, a staff token, and Nexus under a real server (default 1 GiB limit)
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.mkdir()
    folder = folders.create_folder(ModelFolder(name="llama", owner=make_user("owner")))
    _, token = ApiToken.issue(
        "ci",
        kind=TokenKind.ADMIN,
        access=AdminAccess.WRITE,
        created_by=make_user("robot", staff=True),
    )
    with running(server, tmp_path) as url:
        # When a client declares a 2 GB upload and sends nothing more
        answer = declare_without_sending(url, UPLOAD, 2 * GB, token)

        # Then it is refused at once, saying why, and the connection is closed
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413 "), answer
        assert b"content-type: application/json" in head.lower()
        assert json.loads(body) == {"detail": TOO_LARGE}
        assert list(folder.path.iterdir()) == []

        # and an upload within the limit still goes through
        uploaded = LOOPBACK.post(
            f"{url}{UPLOAD}",
            headers={"Authorization": f"Bearer {token}"},
            files={"file": ("config.json", b"{}")},
            timeout=10,
        )
        assert uploaded.status_code == 201, uploaded.text
        assert [path.name for path in folder.path.iterdir()] == ["config.json"]
