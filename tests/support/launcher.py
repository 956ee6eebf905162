"""`manage.py nexus_run` as a user runs it, from tests: output collected as it comes, the process
tree it started, and an environment of its own (data dir, ports, Redis keys)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.support.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
BANNER_END = "Ctrl-C stops Nexus and everything it started."
START_TIMEOUT_S = 60.0
EXIT_TIMEOUT_S = 30.0


class Launcher:
    """A running `manage.py nexus_run` whose output is collected as it comes: from a pipe, or
    from a file when `output_file` is given (as `make run > run.log` does)."""

    def __init__(self, env: dict[str, str], output_file: Path | None = None) -> None:
        self.output_file = output_file
        with contextlib.ExitStack() as files:
            stdout = files.enter_context(output_file.open("wb")) if output_file else subprocess.PIPE
            self.process = subprocess.Popen(
                [sys.executable, "manage.py", "nexus_run"],
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        if self.process.stdout is None:
            return
        for line in self.process.stdout:
            self._lines.append(line.decode(errors="replace"))

    @property
    def output(self) -> str:
        if self.output_file is not None:
            return self.output_file.read_text(errors="replace")
        return "".join(self._lines)

    def wait_for(self, text: str, timeout_s: float = START_TIMEOUT_S) -> None:
        """Return once the output contains text; fail if the launcher exits or time runs out."""
        deadline = time.monotonic() + timeout_s
        while text not in self.output:
            if self.process.poll() is not None:
                self._reader.join(timeout=5)
                pytest.fail(f"exited with {self.process.returncode}:\n{self.output}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {text!r} after {timeout_s} s:\n{self.output}")
            time.sleep(0.1)

    def wait_exit(self, timeout_s: float = EXIT_TIMEOUT_S) -> int:
        """Return the exit status once the launcher has exited and its output is read."""
        code = self.process.wait(timeout=timeout_s)
        self._reader.join(timeout=5)
        return code

    def stop(self, signum: int) -> int:
        """Send signum and return the exit status."""
        self.process.send_signal(signum)
        return self.wait_exit()

    def kill(self) -> None:
        """Kill the launcher and every process under it, whatever state the test left."""
        for pid in [self.process.pid, *process_tree(self.process.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(timeout=EXIT_TIMEOUT_S)


def process_tree(root: int) -> dict[int, int]:
    """Return {pid: parent pid} for every process below root, read from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # The command name may hold spaces and parentheses: fields start after the last ")".
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree: dict[int, int] = {}
    todo = [root]
    while todo:
        parent = todo.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in tree:
                tree[pid] = ppid
                todo.append(pid)
    return tree


def is_running(pid: int) -> bool:
    """Return whether pid is a process that has not exited (a zombie has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def kind_of(pid: int) -> str:
    """Name what a child of the launcher runs, from its command line."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    # redis-server rewrites its command line into a title such as "…/redis-server unixsocket:…".
    if "redis-server" in argv[0]:
        return "redis"
    for module in (
        "serving.runtimes.simulator",
        "daphne",
        "runhistorywriter",
        "celery",
        "nodes.agent",
    ):
        if module in argv:
            return module
    return " ".join(argv)


def free_ports(count: int) -> list[int]:
    """Return count distinct ports that were free a moment ago."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def launcher_environment(
    data_dir: Path, web_port: int, demo_ports: list[int], agent_port: int
) -> dict[str, str]:
    """Return the environment of a launcher with its own data dir, ports and Redis keys."""
    env = {
        name: value
        for name, value in os.environ.items()
        # SQLite in the data dir; the secret key generated there.
        if name not in {"DATABASE_URL", "NEXUS_SECRET_KEY"}
    }
    env.update(
        NEXUS_DATA_DIR=str(data_dir),
        NEXUS_HOST="127.0.0.1",
        NEXUS_PORT=str(web_port),
        NEXUS_DEMO_PORTS=",".join(str(port) for port in demo_ports),
        NEXUS_AGENT_PORT=str(agent_port),
        # The local node's inventory shows a runtime started during the test within seconds.
        NEXUS_NODE_REFRESH_S="1",
        # The real model has tests of its own (tests/system/test_real_model.py).
        NEXUS_DEMO_REAL_MODEL="false",
        # The bundled Redis is the launcher's own; a shared REDIS_URL (CI) needs our own keys.
        NEXUS_REDIS_PREFIX=f"nexus-system-{uuid.uuid4().hex[:8]}",
        PYTHONUNBUFFERED="1",
    )
    return env
