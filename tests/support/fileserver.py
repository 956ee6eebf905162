"""A loopback HTTP file server for download tests: Range requests, throttling, a request record.

    with serving_file(b"..." * 1000, name="model.gguf", rate_bytes_per_s=64_000) as server:
        server.url          # http://127.0.0.1:<port>/model.gguf
        server.requests     # [{"method": "GET", "path": "/model.gguf", "range": "bytes=10-"}, ...]

`serving_files` serves several paths at once (a fake Hugging Face hub, say).
"""

from __future__ import annotations

import email.utils
import hashlib
import re
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import quote, unquote, urlsplit

# Throttled bodies are sent in slices this many times a second.
_SLICES_PER_S = 20
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")
_LAST_MODIFIED = email.utils.formatdate(1_700_000_000, usegmt=True)


@dataclass
class FileServer:
    """A running file server: the first file's URL, its root and every request it was sent."""

    url: str
    base_url: str
    requests: list[dict[str, Any]] = field(default_factory=list)

    def ranges(self) -> list[str | None]:
        """Return each request's Range header (None when it had none), in order."""
        return [request["range"] for request in self.requests]


@contextmanager
def serving_file(
    content: bytes,
    *,
    name: str = "model.bin",
    rate_bytes_per_s: int | None = None,
    cut_after_bytes: int | None = None,
) -> Iterator[FileServer]:
    """Serve one file at `/<name>`; see `serving_files`."""
    with serving_files(
        {name: content}, rate_bytes_per_s=rate_bytes_per_s, cut_after_bytes=cut_after_bytes
    ) as server:
        yield server


@contextmanager
def serving_files(
    files: Mapping[str, bytes],
    *,
    rate_bytes_per_s: int | None = None,
    cut_after_bytes: int | None = None,
) -> Iterator[FileServer]:
    """Serve each `path: content` at `/<path>` on 127.0.0.1 until the block ends.

    `rate_bytes_per_s` throttles every body; `cut_after_bytes` makes the first full (200)
    response close its connection after that many body bytes, as a network failure would.
    Anything else answers 404.
    """
    contents = {"/" + path.lstrip("/"): bytes(data) for path, data in files.items()}
    requests: list[dict[str, Any]] = []
    cut = {"remaining": cut_after_bytes}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_HEAD(self) -> None:  # noqa: N802 (the name http.server calls)
            self._answer(body=False)

        def do_GET(self) -> None:  # noqa: N802
            self._answer(body=True)

        def _answer(self, *, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            with lock:
                requests.append(
                    {"method": self.command, "path": path, "range": self.headers.get("Range")}
                )
            content = contents.get(path)
            if content is None:
                self._send(404, b"not found\n", {}, body=body)
                return
            etag = '"' + hashlib.sha256(content).hexdigest()[:16] + '"'
            headers = {"ETag": etag, "Last-Modified": _LAST_MODIFIED, "Accept-Ranges": "bytes"}
            wanted = _RANGE.match(self.headers.get("Range") or "")
            if_range = self.headers.get("If-Range")
            if wanted and (if_range is None or if_range in (etag, _LAST_MODIFIED)):
                start = int(wanted.group(1))
                end = int(wanted.group(2)) if wanted.group(2) else len(content) - 1
                if start >= len(content):
                    headers["Content-Range"] = f"bytes */{len(content)}"
                    self._send(416, b"", headers, body=body)
                    return
                end = min(end, len(content) - 1)
                headers["Content-Range"] = f"bytes {start}-{end}/{len(content)}"
                self._send(206, content[start : end + 1], headers, body=body)
                return
            limit = None
            with lock:
                if cut["remaining"] is not None and body:
                    limit, cut["remaining"] = cut["remaining"], None
            self._send(200, content, headers, body=body, limit=limit)

        def _send(
            self,
            status: int,
            data: bytes,
            headers: dict[str, str],
            *,
            body: bool,
            limit: int | None = None,
        ) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            if limit is not None:
                self.send_header("Connection", "close")
            self.end_headers()
            if not body:
                return
            try:
                self._write_body(data if limit is None else data[:limit])
            except (BrokenPipeError, ConnectionResetError):
                # The client went away (a cancelled download); nothing left to do.
                self.close_connection = True
                return
            if limit is not None:
                self.close_connection = True

        def _write_body(self, data: bytes) -> None:
            if rate_bytes_per_s is None:
                self.wfile.write(data)
                return
            step = max(1, rate_bytes_per_s // _SLICES_PER_S)
            for offset in range(0, len(data), step):
                self.wfile.write(data[offset : offset + step])
                self.wfile.flush()
                time.sleep(step / rate_bytes_per_s)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            """Keep test output quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    # Do not wait for throttled transfers a test has stopped caring about.
    server.block_on_close = False
    thread = threading.Thread(target=server.serve_forever, name="fileserver", daemon=True)
    thread.start()
    port = server.server_address[1]
    base_url = f"http://127.0.0.1:{port}"
    first = next(iter(contents), "/")
    try:
        yield FileServer(url=base_url + quote(first), base_url=base_url, requests=requests)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
