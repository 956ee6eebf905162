"""Folder sync jobs on a real agent job runner: a controller's folder copied file by file from a
real HTTP server (Range-resumed, checksummed), cached by digest, or used where it is shared."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import pytest

from nodes.agent.errors import AgentError
from nodes.agent.folders import FolderFile, folder_digest, parse_folder_sync
from nodes.agent.jobs import JobRunner
from nodes.agent.processes import ProcessManager
from tests.support.fileserver import serving_files

FILES = {"config.json": b'{"layers": 2}', "weights/model.bin": bytes(range(256)) * 4096}


def manifest(files: dict[str, bytes]) -> list[dict[str, Any]]:
    return [
        {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        for path, data in sorted(files.items())
    ]


def job_spec(files: dict[str, bytes], url: str, path: str = "/nowhere/llama") -> dict[str, Any]:
    listed = manifest(files)
    digest = folder_digest([FolderFile(f["path"], f["size"], f["sha256"]) for f in listed])
    return {
        "kind": "sync-folder",
        "folder": {"name": "llama", "path": path, "digest": digest, "files": listed, "url": url},
    }


@pytest.fixture
def runner(tmp_path: Path) -> JobRunner:
    return JobRunner(tmp_path / "agent", ProcessManager(tmp_path / "agent", []), [])


async def sync(runner: JobRunner, spec: dict[str, Any]) -> dict[str, Any]:
    """Submit a sync-folder job and return it once it has ended."""
    return await finished(runner, (await runner.submit(spec))["id"])


async def finished(runner: JobRunner, job_id: str) -> dict[str, Any]:
    for _ in range(400):
        job = runner.get(job_id)
        if job["state"] != "running":
            return job
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {job_id} still running")


async def test_it_downloads_verifies_and_assembles_the_folder_then_reuses_it(
    runner: JobRunner, tmp_path: Path
) -> None:
    with serving_files(FILES) as server:
        first = await sync(runner, job_spec(FILES, server.base_url))
        again = await runner.submit(job_spec(FILES, server.base_url))

    total = sum(len(data) for data in FILES.values())
    assert (first["state"], first["result"]["source"]) == ("succeeded", "download")
    assert (first["result"]["copied_bytes"], first["bytes_done"], first["percent"]) == (
        total,
        total,
        100.0,
    )
    copy = Path(first["result"]["path"])
    assert {p: (copy / p).read_bytes() for p in FILES} == FILES
    # A second job for the same digest is answered at once, copying nothing.
    assert (again["state"], again["result"]) == (
        "succeeded",
        {"path": str(copy), "source": "cache", "copied_bytes": 0},
    )
    assert len(server.requests) == 2


async def test_a_changed_file_is_the_only_one_fetched_again(runner: JobRunner) -> None:
    changed = {**FILES, "config.json": b'{"layers": 3}'}
    with serving_files(FILES) as server:
        await sync(runner, job_spec(FILES, server.base_url))
    with serving_files(changed) as server:
        job = await sync(runner, job_spec(changed, server.base_url))

    assert job["result"]["copied_bytes"] == len(changed["config.json"])
    assert [request["path"] for request in server.requests] == ["/config.json"]


async def test_a_broken_download_resumes_from_where_it_stopped(runner: JobRunner) -> None:
    weights = {"weights/model.bin": FILES["weights/model.bin"]}
    size = len(weights["weights/model.bin"])
    with serving_files(weights, cut_after_bytes=size // 2) as server:
        broken = await sync(runner, job_spec(weights, server.base_url))
        resumed = await sync(runner, job_spec(weights, server.base_url))

    assert broken["state"] == "failed"
    assert broken["error"].startswith("fetching ")
    assert resumed["state"] == "succeeded"
    assert server.ranges() == [None, f"bytes={size // 2}-"]
    assert resumed["result"]["copied_bytes"] == size - size // 2


async def test_a_file_that_does_not_match_its_checksum_fails_the_job_naming_it(
    runner: JobRunner,
) -> None:
    spec = job_spec(FILES, "")
    with serving_files({**FILES, "config.json": b"tampered"}) as server:
        spec["folder"]["url"] = server.base_url
        job = await sync(runner, spec)

    assert job["state"] == "failed"
    assert job["error"].startswith("config.json does not match its checksum: expected ")


async def test_a_folder_on_shared_storage_is_used_where_it_is(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "models" / "llama"
    for path, data in FILES.items():
        (shared / path).parent.mkdir(parents=True, exist_ok=True)
        (shared / path).write_bytes(data)
    runner = JobRunner(
        tmp_path / "agent", ProcessManager(tmp_path / "agent", []), [tmp_path / "models"]
    )

    job = await runner.submit(job_spec(FILES, "http://127.0.0.1:9/never", path=str(shared)))

    assert (job["state"], job["result"]) == (
        "succeeded",
        {"path": str(shared), "source": "shared", "copied_bytes": 0},
    )


def _digest(spec: dict[str, Any]) -> None:
    spec["folder"]["digest"] = "sha256:" + "0" * 64


def _escaping(spec: dict[str, Any]) -> None:
    spec["folder"]["files"][0]["path"] = "../etc/passwd"


def _file_url(spec: dict[str, Any]) -> None:
    spec["folder"]["url"] = "file:///etc"


def _extra(spec: dict[str, Any]) -> None:
    spec["extra"] = 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_digest, "folder.digest: does not match the files' digests"),
        (_escaping, "folder.files[0].path: must be a relative path without '..'"),
        (_file_url, "folder.url: must be an http:// or https:// URL"),
        (_extra, "extra: unknown field (kind, folder)"),
    ],
)
def test_it_refuses_a_spec_naming_the_field(change: Any, message: str) -> None:
    spec = job_spec(FILES, "http://127.0.0.1:9/f")
    change(spec)

    with pytest.raises(AgentError) as refused:
        parse_folder_sync(spec)

    assert refused.value.message == message
