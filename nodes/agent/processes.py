"""The commands the agent starts and supervises: model runtimes and replicas.

Each process runs in its own session (so it outlives the agent and is stopped as a group), writes
its output straight into `<data_dir>/logs/<id>.log` and is recorded in `<data_dir>/processes.json`.
A restarted agent re-adopts the processes still alive and reports the others lost; none is silently
forgotten. A process with pre-start actions starts as the runner of `nodes/agent/prestart.py`,
which does them and then execs the command in the same process.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import math
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple, TypeGuard

import psutil

from nodes.agent import prestart
from nodes.agent.config import CREDENTIAL_ENV
from nodes.agent.errors import AgentError, invalid, not_found
from nodes.agent.paths import ensure_allowed

logger = logging.getLogger(__name__)

STATE_FILE = "processes.json"
LOGS_DIR = "logs"
# `<id>.json`: the runner's spec (bodies and environment: secrets, hence 0600, gone once read);
# `<id>/`: the files its write_tempfile actions write. Both go when the process ends.
PRESTART_DIR = "prestart"
PORT_PLACEHOLDER = "${PORT}"
# A second allocated port: where a cluster replica's main meets its workers.
DIST_PORT_PLACEHOLDER = "${DIST_PORT}"
# The agent's own interpreter: Python runtimes (the simulator) run with the packages the agent
# has, whatever `python` on PATH is.
PYTHON_PLACEHOLDER = "${NEXUS_PYTHON}"
# How many log lines a process's record keeps once it has ended.
RECORD_TAIL_LINES = 20
MAX_TAIL_LINES = 10_000
MAX_GRACE_S = 3600.0
# After SIGKILL the kernel still has to tear the process down; a process stuck in
# uninterruptible sleep may take a while, so do not wait for it forever.
KILL_WAIT_S = 10.0
# How often exits are noticed: children are reaped and re-adopted processes looked up this often.
POLL_INTERVAL_S = 0.2
# Ended processes kept in the record (the running ones are always kept), oldest dropped first.
MAX_ENDED_RECORDS = 200
# psutil derives start times from the boot time, which the clock can nudge; a reused pid would
# differ by far more than this.
CREATE_TIME_TOLERANCE_S = 1.0
MAX_NAME_LENGTH = 200
# Reading a tail stops this far from the end, so one endless line cannot make it read everything.
MAX_TAIL_BYTES = 8 * 1024 * 1024
LOST_MESSAGE = "ended while the agent was not its parent"
UNKNOWN_EXIT_MESSAGE = "exit code unknown: the agent was not its parent"

SPEC_FIELDS = frozenset(
    {"argv", "env", "cwd", "port", "name", "model", "resources", "pre_start_actions"}
)
MODEL_FIELDS = frozenset({"id", "runtime", "digest", "health_path"})
RESOURCE_FIELDS = frozenset({"cpu_count", "memory_bytes", "gpus"})

# `ProcessManager.list` shadows the builtin inside the class, hence these names for lists there.
Records = list[dict[str, Any]]
Actions = list[dict[str, Any]]  # pre-start actions: {"action": name, "args": {...}}
Argv = list[str]


@dataclass(frozen=True)
class _Spec:
    """A validated start request, before `${PORT}` is substituted."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path | None
    port: int | None
    name: str
    model: dict[str, Any] | None
    resources: dict[str, Any]
    pre_start_actions: list[dict[str, Any]]


class ServedModel(NamedTuple):
    """A running process's model, as forwarding needs it."""

    process_id: str
    port: int
    model: Mapping[str, Any]  # the record's own: read it, never change it


@dataclass(eq=False)
class _Process:
    """One recorded process, with what the agent needs to watch it."""

    record: dict[str, Any]
    # The kernel's start time of `pid`, so a reused pid is never mistaken for this process.
    create_time: float | None
    # None for a process re-adopted after an agent restart: it is not our child.
    popen: subprocess.Popen[bytes] | None = None
    stopping: bool = False

    @property
    def running(self) -> bool:
        return self.record["state"] == "running"


class ProcessManager:
    """Start, watch, stop and remember the processes this agent runs."""

    def __init__(
        self, data_dir: Path, allowed_dirs: Sequence[Path], reserved_ports: Iterable[int] = ()
    ) -> None:
        self.reserved_ports = frozenset(reserved_ports)
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.logs_dir = self.data_dir / LOGS_DIR
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.allowed_dirs = [self.data_dir]
        for directory in allowed_dirs:
            resolved = Path(directory).expanduser().resolve()
            if resolved not in self.allowed_dirs:
                self.allowed_dirs.append(resolved)
        self._processes: dict[str, _Process] = {}
        self._watcher: asyncio.Task[None] | None = None
        self._closed = False

    def recover(self) -> None:
        """Re-adopt the recorded processes still alive; mark the ones that are gone lost."""
        for saved in _load_records(self.data_dir / STATE_FILE):
            record = {key: value for key, value in saved.items() if key != "create_time"}
            if record["id"] in self._processes:
                continue
            process = _Process(record=record, create_time=saved.get("create_time"))
            self._processes[record["id"]] = process
            if process.running and not _alive(record.get("pid"), process.create_time):
                self._finish(process, "lost", None, LOST_MESSAGE, save=False)
        self._prune()
        self._save()
        self._ensure_watching()

    async def start(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Validate the spec, start its command in a new session and return its record.

        Nothing is started or recorded unless every field is valid; without a `cwd` the command
        runs in the data dir, and relative paths of pre-start actions are taken from it.
        """
        self._ensure_watching()
        parsed = _parse_spec(spec)
        cwd = self._resolve_cwd(parsed.cwd)
        actions = self._resolve_action_paths(parsed.pre_start_actions, cwd)
        # A process that has just ended must release its port before ports are checked.
        self._poll()
        port = parsed.port
        if port is not None:
            self._claim(port)
        elif _mentions(parsed, PORT_PLACEHOLDER):
            port = self._allocate_port()
        dist_port = None
        if _mentions(parsed, DIST_PORT_PLACEHOLDER):
            dist_port = self._allocate_port(also_held={port})
        ports = {PORT_PLACEHOLDER: port, DIST_PORT_PLACEHOLDER: dist_port}
        argv = [_substitute(item, ports) for item in parsed.argv]
        env = {key: _substitute(value, ports) for key, value in parsed.env.items()}
        child_env = {**_inherited_environment(), **env}
        if actions:
            actions = [_substitute_action(action, ports) for action in actions]
            _check_executable(argv[0], child_env)

        process_id = self._new_id()
        log_path = self._log_path(process_id)
        command = argv
        if actions:
            command = self._prestart_command(process_id, argv, child_env, actions)
        try:
            # The child gets its own descriptor of the log, so its output survives the agent.
            with log_path.open("ab") as log:
                popen = subprocess.Popen(
                    command,
                    cwd=cwd,
                    env=child_env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except OSError as error:
            log_path.unlink(missing_ok=True)
            self._remove_prestart_files(process_id)
            raise _spawn_error(command[0], error) from error

        process = _Process(
            record={
                "id": process_id,
                "name": parsed.name,
                "argv": argv,
                # Only the keys: values may hold secrets and the record is served and stored.
                "env_keys": sorted(env),
                "cwd": str(cwd),
                "pid": popen.pid,
                "port": port,
                "dist_port": dist_port,
                "state": "running",
                "exit_code": None,
                "started_at": _now(),
                "ended_at": None,
                "model": parsed.model,
                "resources": parsed.resources,
                "pre_start_actions": len(actions),
                "log_tail": None,
                "message": None,
            },
            create_time=_create_time(popen.pid),
            popen=popen,
        )
        self._processes[process_id] = process
        self._save()
        return copy.deepcopy(process.record)

    def list(self) -> Records:
        """Return every recorded process, oldest first."""
        self._poll()
        return [copy.deepcopy(process.record) for process in self._processes.values()]

    def get(self, process_id: str) -> dict[str, Any]:
        """Return one process's record."""
        process = self._find(process_id)
        self._poll()
        return copy.deepcopy(process.record)

    def log_tail(self, process_id: str, lines: int) -> str:
        """Return the last `lines` lines of a process's log."""
        process = self._find(process_id)
        if not _is_int(lines) or not 1 <= lines <= MAX_TAIL_LINES:
            raise invalid("tail", f"must be an integer from 1 to {MAX_TAIL_LINES}")
        return _tail(self._log_path(process.record["id"]), lines)

    async def stop(self, process_id: str, grace_s: float) -> dict[str, Any]:
        """SIGTERM the process group, SIGKILL it after `grace_s`, and return the stopped record.

        A process that has already ended is returned unchanged.
        """
        process = self._find(process_id)
        if not _is_number(grace_s) or not 0 <= grace_s <= MAX_GRACE_S:
            raise invalid("grace", f"must be a number of seconds from 0 to {MAX_GRACE_S:g}")
        self._ensure_watching()
        self._poll_one(process)
        if not process.running:
            return copy.deepcopy(process.record)
        process.stopping = True
        pgid = process.record["pid"]
        _signal_group(pgid, signal.SIGTERM)
        ended = await self._wait_ended(process, grace_s)
        # Also after a graceful exit: members of the group that outlive their leader go too.
        _signal_group(pgid, signal.SIGKILL)
        if not ended and not await self._wait_ended(process, KILL_WAIT_S):
            self._finish(process, "stopped", None, f"still running {KILL_WAIT_S:g} s after SIGKILL")
        return copy.deepcopy(process.record)

    def port_of(self, process_id: str) -> tuple[str, int | None]:
        """Return one process's state and port, without copying its record (the proxy's path)."""
        process = self._find(process_id)
        self._ensure_watching()
        self._poll_one(process)
        return process.record["state"], process.record["port"]

    def served_models(self) -> Sequence[ServedModel]:
        """Return the running processes' models, without copying records (forwarding's path)."""
        self._poll()
        served = []
        for process in self._processes.values():
            record = process.record
            if process.running and record["model"] and record["port"] is not None:
                served.append(ServedModel(record["id"], record["port"], record["model"]))
        return served

    def running(self) -> Records:
        """Return the records of the processes running now."""
        self._poll()
        return [
            copy.deepcopy(process.record) for process in self._processes.values() if process.running
        ]

    async def close(self) -> None:
        """Stop watching; the processes keep running and a new agent re-adopts them."""
        self._closed = True
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None

    def _find(self, process_id: str) -> _Process:
        try:
            return self._processes[process_id]
        except KeyError:
            raise not_found("process_not_found", f"process {process_id}") from None

    def _resolve_cwd(self, cwd: Path | None) -> Path:
        if cwd is None:
            return self.data_dir
        resolved = ensure_allowed(cwd, self.allowed_dirs)
        if not resolved.is_dir():
            raise invalid("cwd", f"{cwd} is not a directory")
        return resolved

    def _resolve_action_paths(self, actions: Actions, cwd: Path) -> Actions:
        """Return the actions with their paths made absolute (relative ones from `cwd`).

        A path outside the allowed directories is refused with 403 naming the argument.
        """
        resolved = []
        for index, action in enumerate(actions):
            args = dict(action["args"])
            for name in prestart.path_args(action):
                try:
                    args[name] = str(ensure_allowed(cwd / args[name], self.allowed_dirs))
                except AgentError as error:
                    field = f"pre_start_actions[{index}].args.{name}"
                    raise AgentError(
                        error.status, error.code, f"{field}: {error.message}", kind=error.kind
                    ) from None
            resolved.append({"action": action["action"], "args": args})
        return resolved

    def _prestart_command(
        self,
        process_id: str,
        argv: Argv,
        env: dict[str, str],
        actions: Actions,
    ) -> Argv:
        """Write the runner's spec (mode 0600) and return the command that runs the runner."""
        directory = self.data_dir / PRESTART_DIR
        directory.mkdir(mode=0o700, exist_ok=True)
        spec_path = directory / f"{process_id}.json"
        spec = {
            "argv": argv,
            "env": env,
            "actions": actions,
            "tempdir": str(directory / process_id),
        }
        descriptor = os.open(spec_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with open(descriptor, "w") as file:
            json.dump(spec, file)
        # Isolated mode and a file path: see nodes/agent/prestart.py.
        return [sys.executable, "-I", prestart.__file__, str(spec_path)]

    def _remove_prestart_files(self, process_id: str) -> None:
        """Remove what a process's pre-start actions left: the runner's spec and tempfiles."""
        directory = self.data_dir / PRESTART_DIR
        (directory / f"{process_id}.json").unlink(missing_ok=True)
        shutil.rmtree(directory / process_id, ignore_errors=True)

    def _claim(self, port: int) -> None:
        """Refuse a port another running process holds, one reserved, or one something else
        has bound."""
        if port in self.reserved_ports:
            raise AgentError(
                409, "port_in_use", f"port {port} is reserved for another program on this node"
            )
        for process in self._processes.values():
            if process.running and process.record["port"] == port:
                raise AgentError(
                    409, "port_in_use", f"port {port} is used by process {process.record['id']}"
                )
        problem = _bind_problem(port)
        if problem is not None:
            raise AgentError(409, "port_in_use", f"port {port} is not free on 127.0.0.1: {problem}")

    def _allocate_port(self, also_held: Iterable[int | None] = ()) -> int:
        """Return a free loopback port no running process was given (it may not be bound yet)."""
        held = set(also_held) | self.reserved_ports
        for process in self._processes.values():
            if process.running:
                held |= {process.record["port"], process.record.get("dist_port")}
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", 0))
                port: int = sock.getsockname()[1]
            if port not in held:
                return port

    def _new_id(self) -> str:
        while True:
            process_id = "p-" + secrets.token_hex(4)
            if process_id not in self._processes and not self._log_path(process_id).exists():
                return process_id

    def _log_path(self, process_id: str) -> Path:
        return self.logs_dir / f"{process_id}.log"

    def _ensure_watching(self) -> None:
        """Start the background watcher when an event loop runs and none watches yet."""
        if self._closed or (self._watcher is not None and not self._watcher.done()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._watcher = loop.create_task(self._watch(), name="nexus-agent-process-watcher")

    async def _watch(self) -> None:
        while True:
            try:
                self._poll()
            except Exception:
                # One bad poll (a full disk while saving, say) must not end the watching.
                logger.exception("watching the agent's processes failed")
            await asyncio.sleep(POLL_INTERVAL_S)

    def _poll(self) -> None:
        """Notice the processes that have ended since the last look."""
        self._ensure_watching()
        for process in list(self._processes.values()):
            self._poll_one(process)

    def _poll_one(self, process: _Process) -> None:
        if not process.running:
            return
        if process.popen is not None:
            # poll() also reaps the child, so no zombie is left behind.
            exit_code = process.popen.poll()
            if exit_code is not None:
                self._finish(process, "stopped" if process.stopping else "exited", exit_code)
        elif not _alive(process.record["pid"], process.create_time):
            if process.stopping:
                self._finish(process, "stopped", None, UNKNOWN_EXIT_MESSAGE)
            else:
                self._finish(process, "lost", None, LOST_MESSAGE)

    async def _wait_ended(self, process: _Process, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the process to end; return whether it did."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._poll_one(process)
            remaining = deadline - time.monotonic()
            if not process.running or remaining <= 0:
                return not process.running
            await asyncio.sleep(min(0.05, remaining))

    def _finish(
        self,
        process: _Process,
        state: str,
        exit_code: int | None,
        message: str | None = None,
        *,
        save: bool = True,
    ) -> None:
        """Record that a process ended (once: a later notice of the same end changes nothing)."""
        if not process.running:
            return
        process.record.update(
            state=state,
            exit_code=exit_code,
            ended_at=_now(),
            message=message,
            log_tail=_tail(self._log_path(process.record["id"]), RECORD_TAIL_LINES),
        )
        process.popen = None
        self._remove_prestart_files(process.record["id"])
        if save:
            self._prune()
            self._save()

    def _prune(self) -> None:
        """Forget the ended processes that ended longest ago, beyond MAX_ENDED_RECORDS."""
        ended = sorted(
            (process for process in self._processes.values() if not process.running),
            key=lambda process: process.record["ended_at"] or "",
        )
        for process in ended[: max(len(ended) - MAX_ENDED_RECORDS, 0)]:
            del self._processes[process.record["id"]]

    def _save(self) -> None:
        """Write processes.json atomically: a crash leaves the old file or the new, never half."""
        records = [
            {**process.record, "create_time": process.create_time}
            for process in self._processes.values()
        ]
        _write_atomically(self.data_dir / STATE_FILE, json.dumps({"processes": records}, indent=1))


def kill_all(data_dir: Path) -> None:
    """SIGKILL the process group of every live process the agent in `data_dir` started.

    For test cleanup: reads processes.json, so it works whether or not that agent still runs.
    """
    groups = [
        saved["pid"]
        for saved in _load_records(Path(data_dir) / STATE_FILE)
        if _alive(saved.get("pid"), saved.get("create_time"))
    ]
    for pgid in groups:
        _signal_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    while any(_group_alive(pgid) for pgid in groups) and time.monotonic() < deadline:
        time.sleep(0.05)


def _parse_spec(spec: Mapping[str, Any]) -> _Spec:
    """Check every field of a start request, naming the first one that is wrong."""
    if not isinstance(spec, Mapping):
        raise invalid("body", "must be a JSON object")
    for key in spec:
        if key not in SPEC_FIELDS:
            raise invalid(str(key), "unknown field")
    return _Spec(
        argv=_parse_argv(spec.get("argv")),
        env=_parse_env(spec.get("env")),
        cwd=_parse_cwd(spec.get("cwd")),
        port=_parse_port(spec.get("port")),
        name=_parse_name(spec.get("name")),
        model=_parse_model(spec.get("model")),
        resources=_parse_resources(spec.get("resources")),
        pre_start_actions=_parse_pre_start_actions(spec.get("pre_start_actions")),
    )


def _parse_argv(argv: Any) -> list[str]:
    if argv is None:
        raise invalid("argv", "required")
    if not isinstance(argv, list) or not argv:
        raise invalid("argv", "must be a non-empty list of strings")
    for index, item in enumerate(argv):
        field = f"argv[{index}]"
        if not isinstance(item, str):
            raise invalid(field, "must be a string")
        if "\0" in item:
            raise invalid(field, "must not contain a NUL character")
    if not argv[0]:
        raise invalid("argv[0]", "must not be empty")
    return list(argv)


def _parse_env(env: Any) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise invalid("env", "must be an object of strings")
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise invalid("env", f"{key!r} is not a valid variable name")
        if not isinstance(value, str):
            raise invalid(f"env.{key}", "must be a string")
        if "\0" in value:
            raise invalid(f"env.{key}", "must not contain a NUL character")
    return dict(env)


def _parse_cwd(cwd: Any) -> Path | None:
    if cwd is None:
        return None
    if not isinstance(cwd, str) or not cwd or "\0" in cwd:
        raise invalid("cwd", "must be a path")
    return Path(cwd)


def _parse_port(port: Any) -> int | None:
    if port is None:
        return None
    if not _is_int(port) or not 1 <= port <= 65535:
        raise invalid("port", "must be an integer from 1 to 65535")
    return int(port)


def _parse_name(name: Any) -> str:
    if name is None:
        return ""
    if not isinstance(name, str) or len(name) > MAX_NAME_LENGTH:
        raise invalid("name", f"must be a string of at most {MAX_NAME_LENGTH} characters")
    return name


def _parse_model(model: Any) -> dict[str, Any] | None:
    if model is None:
        return None
    if not isinstance(model, Mapping):
        raise invalid("model", "must be an object")
    for key in model:
        if key not in MODEL_FIELDS:
            raise invalid(f"model.{key}", "unknown field")
    if not isinstance(model.get("id"), str) or not model["id"]:
        raise invalid("model.id", "required")
    for key in ("runtime", "digest", "health_path"):
        if model.get(key) is not None and not isinstance(model[key], str):
            raise invalid(f"model.{key}", "must be a string")
    health_path = model.get("health_path")
    if health_path is not None and not health_path.startswith("/"):
        raise invalid("model.health_path", "must start with /")
    return {
        "id": model["id"],
        "runtime": model.get("runtime"),
        "digest": model.get("digest"),
        "health_path": health_path,
    }


def _parse_resources(resources: Any) -> dict[str, Any]:
    """Return the reservation with every field present: nothing reserved by default."""
    if resources is None:
        resources = {}
    if not isinstance(resources, Mapping):
        raise invalid("resources", "must be an object")
    for key in resources:
        if key not in RESOURCE_FIELDS:
            raise invalid(f"resources.{key}", "unknown field")
    cpu_count = resources.get("cpu_count")
    if cpu_count is None:
        cpu_count = 0
    elif not _is_number(cpu_count) or cpu_count < 0:
        raise invalid("resources.cpu_count", "must be a number of at least 0")
    memory_bytes = resources.get("memory_bytes")
    if memory_bytes is None:
        memory_bytes = 0
    elif not _is_int(memory_bytes) or memory_bytes < 0:
        raise invalid("resources.memory_bytes", "must be an integer of at least 0")
    return {
        "cpu_count": cpu_count,
        "memory_bytes": memory_bytes,
        "gpus": _parse_gpus(resources.get("gpus")),
    }


def _parse_gpus(gpus: Any) -> list[int]:
    """Return the reserved GPU indexes, given as indexes or as GPU objects with an `index`."""
    if gpus is None:
        return []
    problem = "must be a list of distinct GPU indexes"
    if not isinstance(gpus, list):
        raise invalid("resources.gpus", problem)
    indexes: list[int] = []
    for gpu in gpus:
        index = gpu.get("index") if isinstance(gpu, Mapping) else gpu
        if not _is_int(index) or index < 0 or index in indexes:
            raise invalid("resources.gpus", problem)
        indexes.append(index)
    return indexes


def _parse_pre_start_actions(actions: Any) -> list[dict[str, Any]]:
    try:
        return prestart.parse_actions(actions)
    except prestart.ActionError as error:
        raise invalid(error.field, error.problem) from None


def _is_int(value: Any) -> TypeGuard[int]:
    # bool is an int subclass, but `true` is no port, line count or byte count.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _inherited_environment() -> dict[str, str]:
    """Return the agent's environment less the node credential, which no runtime needs."""
    return {key: value for key, value in os.environ.items() if key != CREDENTIAL_ENV}


def _mentions(spec: _Spec, placeholder: str) -> bool:
    texts = [*spec.argv, *spec.env.values()]
    for action in spec.pre_start_actions:
        for value in action["args"].values():
            texts.extend(value if isinstance(value, list) else [value])
    return any(isinstance(text, str) and placeholder in text for text in texts)


def _substitute(text: str, ports: Mapping[str, int | None]) -> str:
    text = text.replace(PYTHON_PLACEHOLDER, sys.executable)
    for placeholder, port in ports.items():
        if port is not None:
            text = text.replace(placeholder, str(port))
    return text


def _substitute_action(action: dict[str, Any], ports: Mapping[str, int | None]) -> dict[str, Any]:
    """Return the action with the port placeholders replaced in its arguments and command."""
    args: dict[str, Any] = {}
    for name, value in action["args"].items():
        if isinstance(value, list):
            args[name] = [_substitute(item, ports) for item in value]
        elif isinstance(value, str):
            args[name] = _substitute(value, ports)
        else:
            args[name] = value
    return {"action": action["action"], "args": args}


def _check_executable(executable: str, env: Mapping[str, str]) -> None:
    """Refuse a command name not on PATH, as starting it would; a path may be made by an action.

    With pre-start actions the command runs only after them, so this is the one chance to
    answer 400 rather than fail later; `./start.sh` written by a write_file is not checked.
    """
    if "/" not in executable and shutil.which(executable, path=env.get("PATH", os.defpath)) is None:
        raise invalid("argv[0]", f"{executable} not found")


def _bind_problem(port: int) -> str | None:
    """Return why 127.0.0.1:port cannot be bound now, or None when it can."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As servers bind: a port a closed connection left in TIME_WAIT counts as free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as error:
            return error.strerror or str(error)
    return None


def _spawn_error(executable: str, error: OSError) -> AgentError:
    if isinstance(error, FileNotFoundError):
        return invalid("argv[0]", f"{executable} not found")
    if isinstance(error, PermissionError):
        return invalid("argv[0]", f"{executable} is not executable")
    return invalid("argv[0]", f"{executable} cannot be run: {error.strerror or error}")


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    # The group may be gone already (it ended on its own, or with its leader), and a sweep after
    # its leader ended must not fail on a group id the kernel has since given to someone else.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _group_alive(pgid: int) -> bool:
    """Return whether any member of the process group still runs (zombies do not count)."""
    for process in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                return True
    return False


def _create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _alive(pid: Any, create_time: Any) -> bool:
    """Return whether `pid` is still the process that started at `create_time`.

    A zombie counts as gone: it has ended and only waits for a parent (perhaps not us) to reap it.
    An unknown start time cannot prove the pid was not reused, so it counts as gone too.
    """
    if not _is_int(pid) or not _is_number(create_time):
        return False
    try:
        process = psutil.Process(pid)
        same = abs(process.create_time() - create_time) < CREATE_TIME_TOLERANCE_S
        return same and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _tail(path: Path, lines: int) -> str:
    """Return the last `lines` lines of a file, reading backwards from its end in blocks."""
    block_size = 64 * 1024
    try:
        with path.open("rb") as file:
            position = file.seek(0, os.SEEK_END)
            data = b""
            # One newline more than needed: the line before it is then complete. A final
            # newline ends the last line rather than starting an empty one.
            while position > 0 and data.count(b"\n") <= lines and len(data) < MAX_TAIL_BYTES:
                step = min(block_size, position)
                position -= step
                file.seek(position)
                data = file.read(step) + data
    except FileNotFoundError:
        return ""
    # Split on newlines only: a progress bar's carriage returns do not end log lines.
    kept = data.removesuffix(b"\n").split(b"\n")[-lines:] if data else []
    return "".join(line.decode(errors="replace") + "\n" for line in kept)


def _load_records(path: Path) -> list[dict[str, Any]]:
    """Return the saved records, or none when the file is missing or unreadable."""
    try:
        saved = json.loads(path.read_text())
        records = saved["processes"]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError) as error:
        logger.warning("ignoring %s, which cannot be read: %s", path, error)
        return []
    return [
        record
        for record in records
        if isinstance(record, dict) and isinstance(record.get("id"), str) and "state" in record
    ]


def _write_atomically(path: Path, text: str) -> None:
    with tempfile.NamedTemporaryFile(
        "w", dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False
    ) as file:
        try:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        except BaseException:
            file.close()
            os.unlink(file.name)
            raise
    os.replace(file.name, path)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
