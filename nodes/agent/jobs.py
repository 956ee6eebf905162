"""Deploy jobs: install a runtime, fetch and verify a model, serve it, wait until it answers.

Each job runs as an asyncio task and is persisted to `<data_dir>/jobs/<id>.json` at each phase
change and at most every PROGRESS_SAVE_S while it makes progress, so a caller polling the agent
and an agent restarted mid-job both see where it got to.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import re
import secrets
import tempfile
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from nodes.agent import folders, runtimes
from nodes.agent.download import (
    HF_REPO,
    SOURCES,
    DownloadError,
    Fetched,
    ModelSpec,
    destination,
    fetch,
    is_plain_name,
    is_repo_path,
    url_file_name,
)
from nodes.agent.errors import AgentError, invalid, not_found
from nodes.agent.inventory import managed_base_url
from nodes.agent.paths import ensure_allowed
from nodes.agent.processes import ProcessManager
from nodes.agent.runtimes import InstallError, RuntimeSpec

logger = logging.getLogger(__name__)

JOBS_DIR = "jobs"
LOG_LINES = 50
MAX_LOG_LINE = 1000
# Progress arrives per chunk; the file is rewritten at most this often (GET reads memory).
PROGRESS_SAVE_S = 0.5
READY_POLL_S = 0.5
# One readiness probe; a runtime still loading may hold the request open.
READY_PROBE_TIMEOUT_S = 5.0
# A job that fails or is cancelled after starting its runtime stops it, this gracefully.
STOP_GRACE_S = 5.0
EXIT_LOG_LINES = 20
MAX_NAME_LENGTH = 200
RESTARTED = "the agent restarted while this job ran"
STOPPED = "the agent stopped"

SPEC_FIELDS = ("kind", "runtime", "model")
RUNTIME_FIELDS = ("name", "requirement", "argv")
MODEL_FIELDS = ("source", "location", "file", "sha256", "name")
SHA256 = re.compile(r"[0-9a-fA-F]{64}")


@dataclass(frozen=True)
class DeployRequest:
    """A validated deploy job spec."""

    runtime: RuntimeSpec
    model: ModelSpec


class _RuntimeFailed(Exception):
    """A runtime that would not start, exited or did not list its model in time; says which."""


def parse_deploy(spec: Any, allowed_dirs: Sequence[Path]) -> DeployRequest:
    """Check every field of a deploy spec, naming the first one that is wrong (400, or 403)."""
    _object(spec, "body", SPEC_FIELDS, "")
    if spec.get("kind") is None:
        raise invalid("kind", "required")
    if spec["kind"] != "deploy":
        raise invalid("kind", f"unknown kind {spec['kind']!r} (deploy)")
    runtime = _parse_runtime(spec.get("runtime"))
    model = _parse_model(spec.get("model"), allowed_dirs)
    if runtime.name == "llama-cpp" and model.source == "hf" and not model.file:
        raise invalid("model.file", "required for llama.cpp, which serves one .gguf file")
    return DeployRequest(runtime=runtime, model=model)


def _object(value: Any, field: str, fields: Sequence[str], prefix: str) -> Mapping[str, Any]:
    if value is None:
        raise invalid(field, "required")
    if not isinstance(value, Mapping):
        raise invalid(field, "must be a JSON object")
    for key in value:
        if key not in fields:
            # A misspelt `sha256` must not quietly skip the check it asked for.
            raise invalid(f"{prefix}{key}", f"unknown field ({', '.join(fields)})")
    return value


def _text(value: Any, field: str, *, required: bool) -> str | None:
    """Return a string field; absent, null and "" are all None."""
    if value is None or value == "":
        if required:
            raise invalid(field, "required")
        return None
    if not isinstance(value, str):
        raise invalid(field, "must be a string")
    if "\0" in value:
        raise invalid(field, "must not contain a NUL character")
    return value


def _parse_runtime(value: Any) -> RuntimeSpec:
    runtime = _object(value, "runtime", RUNTIME_FIELDS, "runtime.")
    name = _text(runtime.get("name"), "runtime.name", required=True)
    if name not in runtimes.NAMES:
        raise invalid("runtime.name", f"unknown runtime {name!r} ({', '.join(runtimes.NAMES)})")
    requirement = _text(runtime.get("requirement"), "runtime.requirement", required=False)
    argv = runtime.get("argv")
    if name != "custom":
        if requirement is not None:
            raise invalid("runtime.requirement", f"only for the custom runtime, not {name}")
        if argv not in (None, []):
            raise invalid("runtime.argv", f"only for the custom runtime, not {name}")
        return RuntimeSpec(name=name)
    if requirement is not None and requirement.startswith("-"):
        raise invalid("runtime.requirement", "must be a pip requirement, not an option")
    if argv is None:
        raise invalid("runtime.argv", "required for the custom runtime")
    if not isinstance(argv, list) or not argv:
        raise invalid("runtime.argv", "must be a non-empty list of strings")
    for index, item in enumerate(argv):
        if not isinstance(item, str) or "\0" in item:
            raise invalid(f"runtime.argv[{index}]", "must be a string")
    if not argv[0]:
        raise invalid("runtime.argv[0]", "must not be empty")
    if not any("${PORT}" in item for item in argv):
        # The agent learns where the runtime listens only by giving it the port.
        raise invalid("runtime.argv", "must contain ${PORT}, where the runtime is to listen")
    return RuntimeSpec(name=name, requirement=requirement, argv=tuple(argv))


def _parse_model(value: Any, allowed_dirs: Sequence[Path]) -> ModelSpec:
    model = _object(value, "model", MODEL_FIELDS, "model.")
    source = _text(model.get("source"), "model.source", required=True)
    if source not in SOURCES:
        raise invalid("model.source", f"unknown source {source!r} ({', '.join(SOURCES)})")
    location = _text(model.get("location"), "model.location", required=True)
    assert location is not None
    file = _text(model.get("file"), "model.file", required=False)
    sha256 = _text(model.get("sha256"), "model.sha256", required=False)
    if sha256 is not None:
        sha256 = sha256.removeprefix("sha256:")
        if not SHA256.fullmatch(sha256):
            raise invalid("model.sha256", "must be 64 hex digits")
        sha256 = sha256.lower()
    name = _text(model.get("name"), "model.name", required=False)
    if name is not None and (len(name) > MAX_NAME_LENGTH or not name.isprintable()):
        raise invalid("model.name", f"must be printable, at most {MAX_NAME_LENGTH} characters")

    if source == "http":
        if not _is_http_url(location):
            raise invalid("model.location", "must be an http:// or https:// URL")
        if file is not None and not is_plain_name(file):
            raise invalid("model.file", "must be a plain file name (no directories, no dot first)")
        file_name = file or url_file_name(location)
        if file_name is None:
            raise invalid("model.location", "the URL ends in no file name; give model.file")
        default_name = file_name
    elif source == "hf":
        if not HF_REPO.fullmatch(location):
            raise invalid("model.location", "must be a Hugging Face repo id, org/name")
        if file is not None and not is_repo_path(file):
            raise invalid("model.file", "must be a path inside the repo, without ..")
        if file is None and sha256 is not None:
            raise invalid("model.sha256", "checks one file; give model.file too")
        default_name = location
    else:
        if file is not None:
            raise invalid("model.file", "only for the http and hf sources")
        if not Path(location).expanduser().is_absolute():
            raise invalid("model.location", "must be an absolute path on the node")
        path = ensure_allowed(location, allowed_dirs)
        if not path.exists():
            raise invalid("model.location", f"{location} does not exist")
        if path.is_dir() and sha256 is not None:
            raise invalid("model.sha256", f"checks one file; {location} is a directory")
        location = str(path)
        default_name = path.name
    return ModelSpec(
        source=source, location=location, name=name or default_name, file=file, sha256=sha256
    )


def _is_http_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _Job:
    """One job's state, kept in memory and written to its file."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data
        self._saved_at = 0.0

    @classmethod
    def create(
        cls, jobs_dir: Path, job_id: str, kind: str = "deploy", phase: str = "installing"
    ) -> _Job:
        now = _now()
        data = {
            "id": job_id,
            "kind": kind,
            "state": "running",
            "phase": phase,
            "bytes_done": 0,
            "bytes_total": None,
            "percent": None,
            "message": "accepted",
            "error": None,
            "log": [],
            "result": None,
            "created_at": now,
            "updated_at": now,
        }
        return cls(jobs_dir / f"{job_id}.json", data)

    @property
    def id(self) -> str:
        return str(self.data["id"])

    @property
    def running(self) -> bool:
        return self.data["state"] == "running"

    def as_dict(self) -> dict[str, Any]:
        """Return a copy callers may keep: the task goes on changing the original."""
        copied = dict(self.data)
        copied["log"] = list(self.data["log"])
        if copied["result"] is not None:
            copied["result"] = dict(copied["result"])
        return copied

    def save(self) -> None:
        """Write the job atomically: a crash leaves the old file or the new, never half of one."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp", delete=False
        ) as file:
            json.dump(self.data, file)
        Path(file.name).replace(self.path)
        self._saved_at = time.monotonic()

    def log(self, line: str) -> None:
        """Add a line to the job's log, keeping the last LOG_LINES."""
        log = self.data["log"]
        log.append(line if len(line) <= MAX_LOG_LINE else line[:MAX_LOG_LINE] + "…")
        del log[:-LOG_LINES]
        self.data["updated_at"] = _now()

    def phase(self, phase: str, message: str) -> None:
        """Enter a phase; downloading and hashing count their bytes from nothing."""
        self.data.update(phase=phase, message=message, updated_at=_now())
        if phase in ("downloading", "verifying"):
            self.data.update(bytes_done=0, bytes_total=None, percent=None)
        self.log(message)
        self.save()

    def progress(self, done: int, total: int | None, message: str) -> None:
        """Record progress within the phase; saved at most every PROGRESS_SAVE_S."""
        percent = None
        if total:
            percent = round(min(100.0, 100.0 * done / total), 1)
        elif total == 0:
            percent = 100.0
        self.data.update(bytes_done=done, bytes_total=total, percent=percent, message=message)
        # Called per received chunk: the clock is read and the file written only now and then.
        if time.monotonic() - self._saved_at >= PROGRESS_SAVE_S:
            self.data["updated_at"] = _now()
            self.save()

    def result(self, **fields: Any) -> None:
        """Add to the job's result (the model first, then the process serving it)."""
        if self.data["result"] is None:
            self.data["result"] = dict.fromkeys(
                ("model_path", "digest", "process_id", "model_id", "base_url")
            )
        self.data["result"].update(fields)

    def succeed(self, message: str) -> None:
        self.data.update(state="succeeded", phase="ready", message=message)
        self.log(message)
        self.save()

    def fail(self, error: str) -> None:
        # The message is one line for lists and progress bars; the error keeps every line.
        first = error.splitlines()[0] if error else error
        self.data.update(state="failed", error=error, message=f"failed: {first}")
        for line in error.splitlines():
            self.log(line)
        self.save()


class JobRunner:
    """Run deploy jobs and answer for them, past ones included, from `<data_dir>/jobs/`."""

    def __init__(
        self, data_dir: Path, processes: ProcessManager, allowed_dirs: Sequence[Path]
    ) -> None:
        self._data_dir = Path(data_dir).expanduser().resolve()
        self._jobs_dir = self._data_dir / JOBS_DIR
        self._models_dir = self._data_dir / "models"
        self._processes = processes
        self._allowed_dirs = [self._data_dir]
        for directory in allowed_dirs:
            resolved = Path(directory).expanduser().resolve()
            if resolved not in self._allowed_dirs:
                self._allowed_dirs.append(resolved)
        self._jobs: dict[str, _Job] = {}
        self._folder_cache = folders.FolderCache(self._data_dir, self._allowed_dirs)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        # Two jobs must not pip into one environment, or write one download, at the same time.
        self._locks: collections.defaultdict[Path, asyncio.Lock] = collections.defaultdict(
            asyncio.Lock
        )
        self._load()

    def _load(self) -> None:
        """Read the jobs of earlier runs, oldest first; skip files that cannot be read."""
        loaded = []
        for path in self._jobs_dir.glob("*.json"):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError) as error:
                logger.warning("ignoring %s, which cannot be read: %s", path, error)
                continue
            if isinstance(data, dict) and data.get("id") == path.stem and "state" in data:
                loaded.append(_Job(path, data))
        for job in sorted(loaded, key=lambda job: str(job.data.get("created_at"))):
            self._jobs[job.id] = job

    def recover(self) -> None:
        """Mark the jobs an earlier agent left running as failed: nothing runs them now."""
        for job in self._jobs.values():
            if job.running and job.id not in self._tasks:
                job.fail(RESTARTED)

    def _new_id(self) -> str:
        job_id = "job-" + secrets.token_hex(6)
        while job_id in self._jobs:
            job_id = "job-" + secrets.token_hex(6)
        return job_id

    def _start_task(self, job: _Job, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work, name=f"nexus-agent-{job.id}")
        self._tasks[job.id] = task
        task.add_done_callback(lambda _: self._tasks.pop(job.id, None))

    async def submit(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Validate a job spec, start its job and return the job; nothing is kept if refused."""
        if isinstance(spec, Mapping) and spec.get("kind") == folders.KIND:
            return self._submit_sync(folders.parse_folder_sync(spec))
        request = parse_deploy(spec, self._allowed_dirs)
        job = _Job.create(self._jobs_dir, self._new_id())
        job_id = job.id
        job.log(
            f"deploy {request.model.name} ({request.model.source} {request.model.location}) "
            f"on {request.runtime.name}"
        )
        job.save()
        self._jobs[job_id] = job
        self._start_task(job, self._run(job, request))
        return job.as_dict()

    def _submit_sync(self, spec: folders.FolderSpec) -> dict[str, Any]:
        """Start a sync-folder job; one the node can answer at once (the folder is shared, or
        cached) is returned already succeeded."""
        job = _Job.create(self._jobs_dir, self._new_id(), folders.KIND, "downloading")
        job.log(f"sync folder {spec.name} ({spec.digest}, {len(spec.files)} files)")
        self._jobs[job.id] = job
        found = self._folder_cache.shared(spec)
        source = "shared"
        if found is None:
            found, source = self._folder_cache.cached(spec), "cache"
        if found is not None:
            self._folder_ready(job, spec, found, source, 0)
        else:
            job.save()
            self._start_task(job, self._sync(job, spec))
        return job.as_dict()

    def _folder_ready(
        self, job: _Job, spec: folders.FolderSpec, path: Path, source: str, copied: int
    ) -> None:
        total = spec.total_bytes
        job.data["result"] = {"path": str(path), "source": source, "copied_bytes": copied}
        job.data.update(bytes_done=total, bytes_total=total, percent=100.0)
        verb = {"shared": "is shared at", "cache": "is cached at", "download": "was copied to"}
        job.succeed(f"folder {spec.name} {verb[source]} {path}")

    async def _sync(self, job: _Job, spec: folders.FolderSpec) -> None:
        """Copy a folder onto the node; one digest is copied by one job at a time."""
        try:
            async with self._locks[Path(spec.digest)]:
                cached = self._folder_cache.cached(spec)
                if cached is not None:
                    self._folder_ready(job, spec, cached, "cache", 0)
                    return
                path, copied = await self._folder_cache.fetch(spec, job)
            self._folder_ready(job, spec, path, "download", copied)
        except folders.SyncError as error:
            job.fail(str(error))
        except asyncio.CancelledError:
            job.fail(STOPPED)
            raise
        except Exception as error:
            logger.exception("job %s failed unexpectedly", job.id)
            job.fail(f"unexpected error: {error!r}")

    def get(self, job_id: str) -> dict[str, Any]:
        """Return one job."""
        try:
            return self._jobs[job_id].as_dict()
        except KeyError:
            raise not_found("job_not_found", f"job {job_id}") from None

    def list(self) -> list[dict[str, Any]]:
        """Return every job, oldest first."""
        return [job.as_dict() for job in self._jobs.values()]

    async def close(self) -> None:
        """Cancel the running jobs; each is saved as failed and stops what it started."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, job: _Job, request: DeployRequest) -> None:
        """Take a job through its phases; any failure ends it failed with the reason."""
        started: dict[str, Any] | None = None
        try:
            venv = await self._install(job, request.runtime)
            target = destination(request.model, self._models_dir)
            async with self._lock(target):
                fetched = await fetch(request.model, self._models_dir, self._allowed_dirs, job)
            job.result(model_path=str(fetched.path), digest=fetched.digest)
            started = await self._start(job, request, venv, fetched)
            await self._wait_ready(job, request, started)
        except (InstallError, DownloadError, _RuntimeFailed) as error:
            reason = str(error)
        except AgentError as error:
            reason = error.message
        except asyncio.CancelledError:
            # Saved first: stopping the runtime may take its grace period, the agent may not.
            job.fail(STOPPED)
            await self._stop(job, started)
            raise
        except Exception as error:
            logger.exception("job %s failed unexpectedly", job.id)
            reason = f"unexpected error: {error!r}"
        else:
            job.succeed(f"{request.model.name} is ready at {job.data['result']['base_url']}")
            return
        # Stopped before the job says failed, so a caller that sees it failed finds nothing running.
        await self._stop(job, started)
        job.fail(reason)

    def _lock(self, key: Path | None) -> asyncio.Lock | contextlib.nullcontext[None]:
        return contextlib.nullcontext() if key is None else self._locks[key]

    async def _install(self, job: _Job, runtime: RuntimeSpec) -> Path | None:
        """The installing phase; return the runtime's virtual environment, if it has one."""
        venv = runtime.venv(self._data_dir)
        requirements = runtime.requirements()
        if venv is None:
            job.phase("installing", f"{runtime.name}: nothing to install")
            return None
        job.phase("installing", f"installing {' '.join(requirements)} into {venv}")
        reason = await runtimes.gpu_missing(runtime)
        if reason is not None:
            raise InstallError(reason)
        async with self._locks[venv]:
            await runtimes.install(venv, requirements, job.log, runtime.build_env())
        return venv

    async def _start(
        self, job: _Job, request: DeployRequest, venv: Path | None, fetched: Fetched
    ) -> dict[str, Any]:
        """The starting phase: the runtime as a managed process serving the model."""
        runtime, model = request.runtime, request.model
        job.phase("starting", f"starting {runtime.name} serving {model.name}")
        argv = runtimes.serve_argv(runtime, venv, fetched.path, model.name)
        spec = {
            "argv": argv,
            "env": runtimes.serve_env(venv),
            "name": f"{runtime.name} {model.name}",
            "model": {
                "id": model.name,
                "runtime": runtime.name,
                "digest": fetched.digest,
                "health_path": "/v1/models",
            },
        }
        try:
            process = await self._processes.start(spec)
        except AgentError as error:
            raise _RuntimeFailed(f"cannot start {runtime.name}: {error.message}") from None
        job.result(
            process_id=process["id"],
            model_id=model.name,
            base_url=managed_base_url(process["port"]),
        )
        job.log("$ " + " ".join(process["argv"]))
        job.log(
            f"process {process['id']} (pid {process['pid']}) is to listen on port {process['port']}"
        )
        job.save()
        return process

    async def _wait_ready(self, job: _Job, request: DeployRequest, process: dict[str, Any]) -> None:
        """Wait, bounded, until the runtime lists the model; fail if its process ends first."""
        name = request.model.name
        timeout_s = request.runtime.ready_timeout_s()
        url = f"http://127.0.0.1:{process['port']}/v1/models"
        job.data["message"] = f"waiting for {request.runtime.name} to list {name} at {url}"
        job.save()
        deadline = time.monotonic() + timeout_s
        probe_timeout = aiohttp.ClientTimeout(total=READY_PROBE_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=probe_timeout) as session:
            while True:
                current = self._processes.get(process["id"])
                if current["state"] != "running":
                    raise _RuntimeFailed(self._exit_reason(request.runtime.name, current))
                if await _lists_model(session, url, name):
                    return
                if time.monotonic() >= deadline:
                    raise _RuntimeFailed(
                        f"{request.runtime.name} did not list {name} at {url} "
                        f"within {timeout_s:g} s"
                    )
                await asyncio.sleep(READY_POLL_S)

    def _exit_reason(self, runtime: str, process: Mapping[str, Any]) -> str:
        code = process.get("exit_code")
        ended = f"exited with code {code}" if code is not None else f"ended ({process['state']})"
        lines = (process.get("log_tail") or "").splitlines()[-EXIT_LOG_LINES:]
        if not lines:
            return f"{runtime} {ended} before it was ready, printing nothing"
        return f"{runtime} {ended} before it was ready; its last lines:\n" + "\n".join(lines)

    async def _stop(self, job: _Job, process: Mapping[str, Any] | None) -> None:
        """Stop the process a failed job started, so nothing is left half-running."""
        if process is None:
            return
        try:
            await self._processes.stop(process["id"], STOP_GRACE_S)
        except Exception:
            logger.exception("job %s could not stop process %s", job.id, process["id"])
            return
        job.log(f"stopped process {process['id']}")
        job.save()


async def _lists_model(session: aiohttp.ClientSession, url: str, name: str) -> bool:
    """Return whether the runtime's /v1/models lists the model now."""
    try:
        async with session.get(url) as response:
            if response.status != 200:
                return False
            body = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return False
    data = body.get("data") if isinstance(body, dict) else None
    return isinstance(data, list) and any(
        isinstance(entry, dict) and entry.get("id") == name for entry in data
    )
