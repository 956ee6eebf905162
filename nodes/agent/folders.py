"""Model folders that follow their replicas: a controller's folder copied onto this node.

A `sync-folder` job names the folder's files (path, size, sha256) and where the controller
serves them (a signed URL). The node then uses, in this order:

1. the folder itself, when it lies at the same path inside the allowed directories with every
   file of the same size (shared storage): nothing is copied;
2. its cache, `<data_dir>/folders/<digest>/`, complete from an earlier job: nothing is copied;
3. a download: each file missing from `<data_dir>/blobs/sha256/<hex>` is fetched into
   `<hex>.part` (resumed with a Range request), checked against its sha256 and kept; the
   folder is then assembled from hard links to the blobs and renamed into the cache whole.

So a second replica, or a new revision whose files did not change, copies nothing; a changed
file is the only one fetched again.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp

from nodes.agent.download import CHUNK_BYTES, CONNECT_TIMEOUT_S, READ_TIMEOUT_S, Reporter, amount
from nodes.agent.errors import AgentError, invalid
from nodes.agent.paths import ensure_allowed

KIND = "sync-folder"
FOLDER_FIELDS = ("name", "path", "digest", "files", "url")
FILE_FIELDS = ("path", "size", "sha256")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
SHA256 = re.compile(r"[0-9a-f]{64}")
COMPLETE_MARK = ".nexus-complete"


class SyncError(Exception):
    """A folder that cannot be copied or does not verify; the message is the job's error."""


@dataclass(frozen=True)
class FolderFile:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class FolderSpec:
    """A validated `sync-folder` job: the controller's folder and where to fetch its files."""

    name: str
    path: str
    digest: str
    files: tuple[FolderFile, ...]
    url: str

    @property
    def total_bytes(self) -> int:
        return sum(file.size for file in self.files)


def parse_folder_sync(spec: Mapping[str, Any]) -> FolderSpec:
    """Check a sync-folder job spec, naming the first field that is wrong."""
    for key in spec:
        if key not in ("kind", "folder"):
            raise invalid(str(key), "unknown field (kind, folder)")
    folder = spec.get("folder")
    if not isinstance(folder, Mapping):
        raise invalid("folder", "required: an object")
    for key in folder:
        if key not in FOLDER_FIELDS:
            raise invalid(f"folder.{key}", f"unknown field ({', '.join(FOLDER_FIELDS)})")
    for key in ("name", "path", "digest", "url"):
        if not isinstance(folder.get(key), str) or not folder[key]:
            raise invalid(f"folder.{key}", "required: a string")
    if not DIGEST.fullmatch(folder["digest"]):
        raise invalid("folder.digest", "must be sha256:<64 lowercase hex digits>")
    if urlsplit(folder["url"]).scheme not in ("http", "https"):
        raise invalid("folder.url", "must be an http:// or https:// URL")
    files = folder.get("files")
    if not isinstance(files, list):
        raise invalid("folder.files", "required: a list")
    parsed = []
    for index, entry in enumerate(files):
        field = f"folder.files[{index}]"
        if not isinstance(entry, Mapping) or set(entry) != set(FILE_FIELDS):
            raise invalid(field, f"must be an object with {', '.join(FILE_FIELDS)}")
        path, size, sha256 = entry["path"], entry["size"], entry["sha256"]
        if not isinstance(path, str) or not _is_inside(path):
            raise invalid(f"{field}.path", "must be a relative path without '..'")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise invalid(f"{field}.size", "must be an integer, 0 or more")
        if not isinstance(sha256, str) or not SHA256.fullmatch(sha256):
            raise invalid(f"{field}.sha256", "must be 64 lowercase hex digits")
        parsed.append(FolderFile(path, size, sha256))
    if folder_digest(parsed) != folder["digest"]:
        raise invalid("folder.digest", "does not match the files' digests")
    return FolderSpec(
        folder["name"], folder["path"], folder["digest"], tuple(parsed), folder["url"]
    )


def _is_inside(path: str) -> bool:
    pure = PurePosixPath(path)
    return bool(pure.parts) and not pure.is_absolute() and ".." not in pure.parts


def folder_digest(files: Sequence[FolderFile]) -> str:
    """Return a folder's digest: the sha256 of one `<sha256>  <path>` line per file, by path
    (the same rule as a downloaded repository's, nodes/agent/download.py)."""
    lines = "".join(f"{f.sha256}  {f.path}\n" for f in sorted(files, key=lambda f: f.path))
    return "sha256:" + hashlib.sha256(lines.encode()).hexdigest()


class FolderCache:
    """The node's copies of controllers' folders, by digest, and the blobs they are made of."""

    def __init__(self, data_dir: Path, allowed_dirs: Sequence[Path]) -> None:
        self.folders = data_dir / "folders"
        self.blobs = data_dir / "blobs" / "sha256"
        self.allowed_dirs = allowed_dirs

    def shared(self, spec: FolderSpec) -> Path | None:
        """Return the folder at its own path when this node sees it (shared storage)."""
        try:
            root = ensure_allowed(spec.path, self.allowed_dirs)
        except AgentError:
            return None
        for file in spec.files:
            path = root / file.path
            if not path.is_file() or path.stat().st_size != file.size:
                return None
        return root

    def cached(self, spec: FolderSpec) -> Path | None:
        """Return the complete cached copy of this digest, if there is one."""
        path = self.folders / spec.digest.removeprefix("sha256:")
        return path if (path / COMPLETE_MARK).is_file() else None

    async def fetch(self, spec: FolderSpec, reporter: Reporter) -> tuple[Path, int]:
        """Download what is missing, verify it and assemble the folder; return it and the
        bytes copied."""
        self.blobs.mkdir(parents=True, exist_ok=True)
        total, done, copied = spec.total_bytes, 0, 0
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S
        )
        headers = {"Accept-Encoding": "identity"}
        async with aiohttp.ClientSession(
            timeout=timeout, auto_decompress=False, headers=headers
        ) as session:
            for file in spec.files:
                blob = self.blobs / file.sha256
                if blob.is_file() and blob.stat().st_size == file.size:
                    reporter.log(f"{file.path}: already on this node")
                else:
                    url = spec.url.rstrip("/") + "/" + quote(file.path)
                    copied += await self._download(session, url, file, blob, done, total, reporter)
                done += file.size
                message = f"copying folder {spec.name}: {amount(done, total)}"
                reporter.progress(done, total, message)
        return await asyncio.to_thread(self._assemble, spec), copied

    async def _download(
        self,
        session: aiohttp.ClientSession,
        url: str,
        file: FolderFile,
        blob: Path,
        before: int,
        total: int,
        reporter: Reporter,
    ) -> int:
        """Fetch one file into its blob, resuming a part; return the bytes transferred."""
        part = blob.with_name(blob.name + ".part")
        offset = part.stat().st_size if part.is_file() else 0
        if offset > file.size:
            part.unlink()
            offset = 0
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        reporter.log(f"fetching {file.path}" + (f" from byte {offset}" if offset else ""))
        transferred = 0
        try:
            async with session.get(url, headers=headers) as response:
                if response.status == 200:
                    offset = 0
                elif response.status != 206 or not offset:
                    raise SyncError(
                        f"fetching {file.path} failed: the controller answered {response.status}"
                    )
                with part.open("ab" if offset else "wb") as out:
                    async for chunk in response.content.iter_chunked(CHUNK_BYTES):
                        out.write(chunk)
                        transferred += len(chunk)
                        done = before + offset + transferred
                        reporter.progress(
                            done, total, f"copying {file.path}: {amount(done, total)}"
                        )
        except (aiohttp.ClientError, TimeoutError) as error:
            raise SyncError(
                f"fetching {file.path} broke off after {offset + transferred} of {file.size} "
                f"bytes (the next attempt resumes): {error or type(error).__name__}"
            ) from None
        digest = await asyncio.to_thread(_sha256_of, part)
        if digest != file.sha256:
            part.unlink(missing_ok=True)
            raise SyncError(
                f"{file.path} does not match its checksum: expected {file.sha256}, got {digest} "
                "(the folder changed on the controller since this revision was made?)"
            )
        part.replace(blob)
        return transferred

    def _assemble(self, spec: FolderSpec) -> Path:
        """Link the blobs into the folder's layout and put it in the cache whole."""
        final = self.folders / spec.digest.removeprefix("sha256:")
        if (final / COMPLETE_MARK).is_file():
            return final
        staging = final.with_name(final.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        for file in spec.files:
            target = staging / file.path
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(self.blobs / file.sha256, target)
            except OSError:
                shutil.copyfile(self.blobs / file.sha256, target)
        (staging / COMPLETE_MARK).write_text(spec.digest + "\n")
        shutil.rmtree(final, ignore_errors=True)
        staging.replace(final)
        return final


def _sha256_of(path: Path) -> str:
    hasher = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(8 * 1024 * 1024):
            hasher.update(chunk)
    return hasher.hexdigest()
