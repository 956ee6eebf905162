"""Model folders that follow their replicas: what the controller sends a node to copy a folder.

A revision's folder manifest (every file's path, size and sha256, and the folder's digest) is
fixed the first time one of its replicas is placed, so a folder changed later is copied for the
next revision only: an old revision's replica on a new node fails its checksum instead of
running other files. Files are hashed once: the hashes are kept in `<data dir>/manifests/`,
keyed by path, size and modification time.

Agents fetch the files from `/serving/folder-sync/<token>/<path>`, where the token is signed
with the controller's secret key for one folder digest and one node and expires: no session and
no open endpoint (docs/runtimes.md, "Folders that follow their replicas").
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core import signing

from serving import folders
from serving.models import ModelFolder

SIGNING_SALT = "nexus.serving.folder-sync"
# Long enough for a large model on a slow link; a later attempt gets a fresh token and resumes.
TOKEN_MAX_AGE_S = 6 * 3600
HASH_CHUNK_BYTES = 8 * 1024 * 1024
_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


@dataclass(frozen=True)
class Grant:
    """What a valid token lets an agent read: one folder, at one digest, for one node."""

    folder_id: int
    digest: str
    node_id: int


def manifest(folder: ModelFolder) -> dict[str, Any]:
    """Return the folder's manifest: {"digest", "files": [{"path", "size", "sha256"}]}."""
    root = folders.folder_root(folder)
    cache_path = Path(settings.DATA_DIR) / "manifests" / f"{folder.pk}.json"
    try:
        known = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        known = {}
    files = []
    fresh: dict[str, Any] = {}
    for entry in folders.list_files(folder).files:
        path = root / entry.path
        stat = path.stat()
        key = f"{entry.path}\0{stat.st_size}\0{stat.st_mtime_ns}"
        sha256 = known.get(key) or _sha256_of(path)
        fresh[key] = sha256
        files.append({"path": entry.path, "size": stat.st_size, "sha256": sha256})
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    cache_path.write_text(json.dumps(fresh))
    lines = "".join(f"{f['sha256']}  {f['path']}\n" for f in sorted(files, key=lambda f: f["path"]))
    digest = "sha256:" + hashlib.sha256(lines.encode()).hexdigest()
    return {"digest": digest, "files": files}


def _sha256_of(path: Path) -> str:
    hasher = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(HASH_CHUNK_BYTES):
            hasher.update(chunk)
    return hasher.hexdigest()


def token(folder: ModelFolder, digest: str, node_id: int) -> str:
    """Return a token that lets one node read one folder at one digest, for a while."""
    return signing.dumps(
        {"f": folder.pk, "d": digest, "n": node_id}, salt=SIGNING_SALT, compress=True
    )


def grant_of(value: str) -> Grant | None:
    """Return what a token grants, or None when it is forged, altered or expired."""
    try:
        data = signing.loads(value, salt=SIGNING_SALT, max_age=TOKEN_MAX_AGE_S)
    except signing.BadSignature:
        return None
    return Grant(folder_id=int(data["f"]), digest=str(data["d"]), node_id=int(data["n"]))


def download_url(folder: ModelFolder, digest: str, node_id: int) -> str:
    """Return where the node fetches the folder's files (each file's path appended)."""
    base = settings.NEXUS_CONTROLLER_URL.rstrip("/")
    return f"{base}/serving/folder-sync/{token(folder, digest, node_id)}"


def job_spec(folder: ModelFolder, folder_manifest: dict[str, Any], node_id: int) -> dict[str, Any]:
    """Return the agent's sync-folder job for a folder at a manifest (docs/nodes.md)."""
    return {
        "kind": "sync-folder",
        "folder": {
            "name": folder.name,
            "path": str(folder.path),
            "digest": folder_manifest["digest"],
            "files": folder_manifest["files"],
            "url": download_url(folder, folder_manifest["digest"], node_id),
        },
    }


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """Return the (start, end) of a `Range: bytes=N-[M]` header, inclusive; None for none.

    Raise ValueError for a range that is not satisfiable (416).
    """
    if not header:
        return None
    match = _RANGE.match(header.strip())
    if match is None:
        return None  # other forms (several ranges, suffixes) are answered whole
    start = int(match.group(1))
    end = int(match.group(2)) if match.group(2) else size - 1
    if start >= size or end < start:
        raise ValueError(f"bytes {start}- of a {size}-byte file")
    return start, min(end, size - 1)


def read_range(path: Path, start: int, end: int) -> Iterator[bytes]:
    """Yield the file's bytes from start to end (inclusive), a chunk at a time."""
    with path.open("rb") as file:
        file.seek(start)
        left = end - start + 1
        while left > 0:
            chunk = file.read(min(folders.CHUNK_BYTES, left))
            if not chunk:
                return
            left -= len(chunk)
            yield chunk


def file_size(path: Path) -> int:
    return os.stat(path).st_size
