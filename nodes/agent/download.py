"""A deploy job's model: fetched from a URL or the Hugging Face hub into models/, then hashed.

A download writes `<file>.part` beside a small `<file>.part.json` (the URL and the server's
validators), resumes it with a `Range` request when the same URL is fetched again, and renames it
only once complete. A finished download is recorded in `models/.sources/<file>.json`, so fetching
the same URL again is skipped.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Protocol
from urllib.parse import quote, unquote, urlsplit

import aiohttp

from nodes.agent.errors import AgentError
from nodes.agent.paths import ensure_allowed

SOURCES = ("path", "http", "hf")
DEFAULT_HF_ENDPOINT = "https://huggingface.co"
# A server that does not accept the connection within this long is unreachable; one that stops
# sending for READ_TIMEOUT_S mid-file is stuck (the part stays for the next attempt).
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0
CHUNK_BYTES = 1024 * 1024
HASH_CHUNK_BYTES = 8 * 1024 * 1024
# How often hashing in its thread is reported as progress.
HASH_REPORT_S = 0.5
HF_REPO = re.compile(r"\w[\w.-]*/\w[\w.-]*")
_TRUE = {"1", "true", "yes", "on"}


class DownloadError(Exception):
    """A model that cannot be fetched or does not verify; the message is the job's error."""


class Reporter(Protocol):
    """Where a fetch reports its phase, progress and log lines (the job)."""

    def phase(self, phase: str, message: str) -> None: ...

    def progress(self, done: int, total: int | None, message: str) -> None: ...

    def log(self, line: str) -> None: ...


@dataclass(frozen=True)
class ModelSpec:
    """A deploy job's validated `model` object; `sha256` is lowercase hex without a prefix."""

    source: str
    location: str
    name: str
    file: str | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class Fetched:
    """A model on disk and its digest, `sha256:<hex>`."""

    path: Path
    digest: str


def url_file_name(url: str) -> str | None:
    """Return the file name a URL ends in, or None when it names no usable file."""
    name = unquote(urlsplit(url).path.rsplit("/", 1)[-1])
    return name if is_plain_name(name) else None


def is_plain_name(name: str) -> bool:
    """Return whether a name is one visible file in models/, never a path or a partial file."""
    return (
        bool(name)
        and not name.startswith(".")
        and not any(char in name for char in "/\\\0")
        and not name.endswith((".part", ".part.json"))
    )


def is_repo_path(path: str) -> bool:
    """Return whether a path inside a repo stays inside it (no absolute path, no `..`)."""
    parts = path.split("/")
    return all(
        part not in ("", ".", "..") and "\\" not in part and "\0" not in part for part in parts
    )


def destination(model: ModelSpec, models_dir: Path) -> Path | None:
    """Return where a model is downloaded to, or None for a local path."""
    if model.source == "http":
        return models_dir / (model.file or url_file_name(model.location) or "")
    if model.source == "hf":
        repo_dir = models_dir / model.location.replace("/", "--")
        return repo_dir / model.file if model.file else repo_dir
    return None


def hf_endpoint() -> str:
    """Return the Hugging Face hub's root URL (HF_ENDPOINT, else the public hub)."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_HF_ENDPOINT).rstrip("/")


async def fetch(
    model: ModelSpec, models_dir: Path, allowed_dirs: Sequence[Path], reporter: Reporter
) -> Fetched:
    """Run the downloading and verifying phases; return the model's path and digest."""
    target = destination(model, models_dir)
    known: str | None = None
    if target is None:
        reporter.phase("downloading", f"using {model.location}")
        try:
            path = ensure_allowed(model.location, allowed_dirs)
        except AgentError as error:
            raise DownloadError(error.message) from None
        if not path.exists():
            raise DownloadError(f"{path} does not exist")
    else:
        path = target
        reporter.phase("downloading", f"downloading {path.name}")
        async with _session() as session:
            if model.source == "http":
                download = _Download(session, models_dir, reporter)
                known = await download.file(model.location, path, model.sha256)
            else:
                known = await _fetch_hf(session, model, path, models_dir, reporter)

    label = path.name
    reporter.phase("verifying", f"verifying {label}")
    if known is None:
        digest = await digest_of(path, reporter, label)
    else:
        digest = known
        size = path.stat().st_size
        reporter.progress(size, size, f"verified {label}: {amount(size, size)}")
    if model.sha256 and digest != f"sha256:{model.sha256}":
        # Never delete what the operator put on disk; a download can be fetched again.
        if target is not None:
            _forget(path, models_dir)
        got = digest.removeprefix("sha256:")
        raise DownloadError(f"sha256 mismatch for {label}: expected {model.sha256}, got {got}")
    reporter.log(f"{label}: {digest}")
    return Fetched(path, digest)


def _session() -> aiohttp.ClientSession:
    # No total limit (a model may take hours), but a bound on connecting and on each read.
    timeout = aiohttp.ClientTimeout(
        total=None,
        connect=CONNECT_TIMEOUT_S,
        sock_connect=CONNECT_TIMEOUT_S,
        sock_read=READ_TIMEOUT_S,
    )
    # Decompressing would change the byte offsets a Range request resumes from.
    return aiohttp.ClientSession(
        timeout=timeout, auto_decompress=False, headers={"Accept-Encoding": "identity"}
    )


def _record_path(path: Path, models_dir: Path) -> Path:
    return models_dir / ".sources" / f"{path.relative_to(models_dir)}.json"


def _part_paths(path: Path) -> tuple[Path, Path]:
    return path.with_name(path.name + ".part"), path.with_name(path.name + ".part.json")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps(data))
    partial.replace(path)


def _forget(path: Path, models_dir: Path) -> None:
    """Delete a downloaded file and its record."""
    path.unlink(missing_ok=True)
    _record_path(path, models_dir).unlink(missing_ok=True)


async def _fetch_hf(
    session: aiohttp.ClientSession,
    model: ModelSpec,
    target: Path,
    models_dir: Path,
    reporter: Reporter,
) -> str | None:
    """Download one file of a repo, or every file of it when no file is named."""
    endpoint = hf_endpoint()
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE:
        raise DownloadError(
            f"cannot reach the Hugging Face hub at {endpoint}: HF_HUB_OFFLINE is set"
        )
    headers = {}
    if os.environ.get("HF_TOKEN"):
        # aiohttp drops it when the hub redirects to its CDN on another host.
        headers["Authorization"] = f"Bearer {os.environ['HF_TOKEN']}"
    download = _Download(session, models_dir, reporter, hub=endpoint, headers=headers)
    repo = model.location
    if model.file:
        url = f"{endpoint}/{repo}/resolve/main/{quote(model.file)}"
        return await download.file(url, target, model.sha256)

    listing = f"{endpoint}/api/models/{repo}?blobs=true"
    reporter.log(f"listing {repo} at {endpoint}")
    try:
        async with session.get(listing, headers=headers) as response:
            if response.status != 200:
                raise DownloadError(_status_failure(listing, response, hub=True))
            info = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError) as error:
        raise DownloadError(_failure(listing, error, hub=endpoint)) from None
    except ValueError:
        raise DownloadError(
            f"the Hugging Face hub at {endpoint} sent a listing that is not JSON"
        ) from None
    siblings = info.get("siblings") if isinstance(info, dict) else None
    files: list[tuple[str, int | None]] = []
    for sibling in siblings if isinstance(siblings, list) else []:
        name = sibling.get("rfilename") if isinstance(sibling, dict) else None
        if not isinstance(name, str) or not is_repo_path(name):
            reporter.log(f"skipping {name!r}: not a file name inside the repo")
            continue
        size = sibling.get("size")
        files.append((name, size if isinstance(size, int) and size >= 0 else None))
    if not files:
        raise DownloadError(f"the Hugging Face hub at {endpoint} lists no files in {repo}")
    sizes = [size for _, size in files]
    download.total = None if None in sizes else sum(size or 0 for size in sizes)
    for index, (name, _) in enumerate(files, start=1):
        download.label = f"{name} ({index} of {len(files)} files)"
        await download.file(f"{endpoint}/{repo}/resolve/main/{quote(name)}", target / name, None)
    return None


# What `_Download._transfer` returns when it dropped a part the server's file no longer matches.
_RESTART = object()


class _Download:
    """Files fetched into models/ for one job, with their bytes reported as one total."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        models_dir: Path,
        reporter: Reporter,
        *,
        hub: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.session = session
        self.models_dir = models_dir
        self.reporter = reporter
        # The hub's root URL when downloading from it: not reaching it gets the hub's message.
        self.hub = hub
        self.headers = headers or {}
        # Set for several files; None means each file's own size is the total.
        self.total: int | None = None
        self.label: str | None = None
        # Bytes of the files already finished, for the running total.
        self.finished = 0

    async def file(self, url: str, path: Path, sha256: str | None) -> str | None:
        """Download a URL to a path unless it is there already; return its digest when known."""
        try:
            return await self._file(url, path, sha256)
        except (aiohttp.ClientError, TimeoutError) as error:
            raise DownloadError(_failure(url, error, hub=self.hub)) from None
        except OSError as error:
            # The disk's side: full, read-only, or models/ not writable.
            raise DownloadError(f"download of {url} failed: {error}") from None

    async def _file(self, url: str, path: Path, sha256: str | None) -> str | None:
        label = self.label or path.name
        if path.is_file():
            here, digest = await self._already_here(url, path, sha256, label)
            if here:
                self._finish(path, label)
                return digest
            _forget(path, self.models_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        part, meta_path = _part_paths(path)
        meta = _read_json(meta_path)
        if not (part.is_file() and part.stat().st_size > 0 and meta.get("url") == url):
            part.unlink(missing_ok=True)
        # At most twice: a part the server's file no longer matches is dropped and fetched whole.
        for _ in range(2):
            result = await self._transfer(url, part, meta_path, meta, label)
            if result is not _RESTART:
                break
        else:
            raise DownloadError(f"download of {url} failed: the server's file kept changing")
        meta = _read_json(meta_path)
        part.replace(path)
        _write_json(_record_path(path, self.models_dir), {**meta, "size": path.stat().st_size})
        meta_path.unlink(missing_ok=True)
        self._finish(path, label)
        return result if isinstance(result, str) else None

    async def _already_here(
        self, url: str, path: Path, sha256: str | None, label: str
    ) -> tuple[bool, str | None]:
        """Return whether the file present can be used as it is, and its digest when hashed.

        With a sha256 it must match; without one it must be what this URL gave last time.
        """
        if sha256 is not None:
            digest = await digest_of(path, self.reporter, f"the existing {label}")
            if digest == f"sha256:{sha256}":
                self.reporter.log(f"{path.name} is already here with the expected sha256")
                return True, digest
            self.reporter.log(f"the existing {path.name} has another sha256; downloading it again")
            return False, None
        record = _read_json(_record_path(path, self.models_dir))
        if record.get("url") == url and record.get("size") == path.stat().st_size:
            self.reporter.log(f"{path.name} was already downloaded from {url}")
            return True, None
        return False, None

    async def _transfer(
        self, url: str, part: Path, meta_path: Path, meta: dict[str, Any], label: str
    ) -> str | object | None:
        """Fetch the rest of the part (all of it when there is none).

        Return the digest when the whole file passed through here, None when it was resumed
        (it is hashed from the start later), or _RESTART when the part was dropped.
        """
        offset = part.stat().st_size if part.is_file() else 0
        headers = dict(self.headers)
        if offset:
            headers["Range"] = f"bytes={offset}-"
            validator = _if_range(meta)
            if validator:
                # A changed file then comes whole (200) rather than as a mismatched tail.
                headers["If-Range"] = validator
            self.reporter.log(f"resuming {part.name} from byte {offset} of {url}")
        else:
            self.reporter.log(f"fetching {url}")
        async with self.session.get(url, headers=headers) as response:
            if offset and response.status == 416:
                length = _content_range_total(response.headers.get("Content-Range"))
                if length is None or length == offset:
                    self.reporter.log(f"the server has no bytes after {offset}: the part is whole")
                    return None
                self.reporter.log(f"the server's file has {length} bytes, the part {offset}")
                part.unlink()
                return _RESTART
            if response.status == 206 and offset:
                start = _content_range_start(response.headers.get("Content-Range"))
                if start != offset:
                    raise DownloadError(
                        f"download of {url} failed: asked for the bytes from {offset}, "
                        f"got a range starting at {start}"
                    )
            elif response.status == 200:
                if offset:
                    self.reporter.log("the server sent the whole file; starting over")
                offset = 0
            else:
                raise DownloadError(_status_failure(url, response, hub=self.hub is not None))
            # Written before any byte, so a part on disk always says where it came from.
            _write_json(
                meta_path,
                {
                    "url": url,
                    "etag": response.headers.get("ETag"),
                    "last_modified": response.headers.get("Last-Modified"),
                },
            )
            length = response.content_length
            size = None if length is None else offset + length
            hasher = hashlib.sha256() if offset == 0 else None
            done = await self._stream(response, part, offset, size, hasher, label, url)
        if size is not None and done != size:
            raise DownloadError(_broke_off(url, done, size))
        return f"sha256:{hasher.hexdigest()}" if hasher is not None else None

    def _finish(self, path: Path, label: str) -> None:
        self.finished += path.stat().st_size
        total = self.total if self.total is not None else self.finished
        self.reporter.progress(
            self.finished, total, f"downloaded {label}: {amount(self.finished, total)}"
        )

    async def _stream(
        self,
        response: aiohttp.ClientResponse,
        part: Path,
        offset: int,
        size: int | None,
        hasher: hashlib._Hash | None,
        label: str,
        url: str,
    ) -> int:
        """Append the body to the part; return the part's size when the body ends."""
        done = offset
        total = self.total if self.total is not None else size
        # Page-cache writes of a chunk take microseconds; a thread per chunk would cost more.
        with part.open("ab" if offset else "wb") as out:
            try:
                async for chunk in response.content.iter_chunked(CHUNK_BYTES):
                    out.write(chunk)
                    if hasher is not None:
                        hasher.update(chunk)
                    done += len(chunk)
                    current = self.finished + done
                    self.reporter.progress(
                        current, total, f"downloading {label}: {amount(current, total)}"
                    )
            except aiohttp.ClientPayloadError:
                out.flush()
                raise DownloadError(_broke_off(url, done, size)) from None
        return done


def _if_range(meta: dict[str, Any]) -> str | None:
    """Return the validator for If-Range: a strong ETag, else the Last-Modified date."""
    etag = meta.get("etag")
    if isinstance(etag, str) and etag and not etag.startswith("W/"):
        return etag
    modified = meta.get("last_modified")
    return modified if isinstance(modified, str) and modified else None


def _content_range_start(header: str | None) -> int | None:
    match = re.match(r"bytes (\d+)-\d+/", header or "")
    return int(match.group(1)) if match else None


def _content_range_total(header: str | None) -> int | None:
    match = re.match(r"bytes [\d*-]+/(\d+)$", header or "")
    return int(match.group(1)) if match else None


def _broke_off(url: str, done: int, size: int | None) -> str:
    of = f" of {size}" if size is not None else ""
    return (
        f"download of {url} failed: the connection broke off after {done}{of} bytes "
        "(the next attempt resumes from there)"
    )


def _status_failure(url: str, response: aiohttp.ClientResponse, *, hub: bool) -> str:
    message = (
        f"download of {url} failed: answered {response.status} {response.reason or ''}".rstrip()
    )
    if hub and response.status in (401, 403):
        message += " (set HF_TOKEN on the node for a gated or private repo)"
    return message


def _failure(url: str, error: BaseException, *, hub: str | None) -> str:
    """Return the job's error for a failed request: the hub's message when it was not reached."""
    if isinstance(error, aiohttp.ClientConnectorError):
        os_error = error.os_error
        if isinstance(os_error.errno, int) and os_error.errno > 0:
            reason = os.strerror(os_error.errno)
        else:
            reason = os_error.strerror or str(os_error)
        reason = f"cannot connect to {error.host}:{error.port}: {reason}"
        unreachable = True
    elif isinstance(error, aiohttp.ConnectionTimeoutError):
        reason = f"no connection within {CONNECT_TIMEOUT_S:g} s"
        unreachable = True
    elif isinstance(error, TimeoutError):
        reason = f"nothing received for {READ_TIMEOUT_S:g} s"
        unreachable = False
    else:
        reason = str(error) or type(error).__name__
        unreachable = False
    if hub is not None and unreachable:
        return f"cannot reach the Hugging Face hub at {hub}: {reason}"
    return f"download of {url} failed: {reason}"


def amount(done: int, total: int | None) -> str:
    """Return bytes as people read them: "12.0 of 48.0 MiB", or "12.0 MiB" without a total."""
    scale = total if total is not None else done
    unit, size = "B", 1
    for name, step in (("KiB", 1024), ("MiB", 1024**2), ("GiB", 1024**3)):
        if scale >= step:
            unit, size = name, step
    if unit == "B":
        return f"{done} of {total} B" if total is not None else f"{done} B"
    if total is None:
        return f"{done / size:.1f} {unit}"
    return f"{done / size:.1f} of {total / size:.1f} {unit}"


class _HashState:
    """What a hashing thread has done, read by the event loop for progress."""

    def __init__(self) -> None:
        self.done = 0
        self.stop = False


def _hash_files(files: list[Path], state: _HashState) -> list[str] | None:
    """Return each file's sha256 hex, or None when told to stop."""
    digests = []
    for path in files:
        hasher = hashlib.sha256()
        with path.open("rb") as file:
            while chunk := file.read(HASH_CHUNK_BYTES):
                if state.stop:
                    return None
                hasher.update(chunk)
                state.done += len(chunk)
        digests.append(hasher.hexdigest())
    return digests


def _model_files(path: Path) -> list[Path]:
    """Return the files a model consists of: the file, or a directory's files but partial ones."""
    if path.is_file():
        return [path]
    return sorted(
        item
        for item in path.rglob("*")
        if item.is_file() and not item.name.endswith((".part", ".part.json"))
    )


async def digest_of(path: Path, reporter: Reporter, label: str) -> str:
    """Return `sha256:<hex>` of a file, hashed in a thread with its progress reported.

    A directory's digest is the sha256 of its manifest: a `<sha256>  <relative path>` line
    (as sha256sum prints) per file, sorted by path.
    """
    files = await asyncio.to_thread(_model_files, path)
    total = sum(item.stat().st_size for item in files)
    state = _HashState()
    hashing = asyncio.ensure_future(asyncio.to_thread(_hash_files, files, state))
    try:
        while not hashing.done():
            await asyncio.wait({hashing}, timeout=HASH_REPORT_S)
            reporter.progress(state.done, total, f"hashing {label}: {amount(state.done, total)}")
    except asyncio.CancelledError:
        # The thread cannot be cancelled; it stops at its next chunk.
        state.stop = True
        raise
    digests = hashing.result()
    assert digests is not None, "only a cancelled hashing stops early"
    if path.is_file():
        return f"sha256:{digests[0]}"
    manifest = "".join(
        f"{digest}  {PurePosixPath(item.relative_to(path))}\n"
        for item, digest in zip(files, digests, strict=True)
    )
    return f"sha256:{hashlib.sha256(manifest.encode()).hexdigest()}"
