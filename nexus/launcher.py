"""Start, watch and stop the processes that `manage.py nexus_run` runs."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

POLL_S = 0.1
READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0
TAIL_LINES = 20


class LaunchError(Exception):
    """A process failed to start, did not become ready, or exited on its own."""


class StopRequested(Exception):
    """SIGINT or SIGTERM asked the launcher to stop everything."""


@dataclass(eq=False)
class Child:
    """A supervised process and the file its output goes to."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    # Children we start lead their own process group; an adopted one (the bundled Redis) does not.
    own_group: bool = True

    def tail(self, lines: int = TAIL_LINES) -> str:
        """Return the last lines of the child's log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def failure(self, what: str) -> LaunchError:
        """Return an error that names the child and shows the end of its log."""
        return LaunchError(f"{self.name} {what}. Last lines of {self.log_path}:\n{self.tail()}")


def port_in_use(host: str, port: int) -> bool:
    """Return whether a server already listens on host:port (or the port cannot be bound)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # Servers set SO_REUSEADDR too, so a port held only by TIME_WAIT counts as free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def http_answers(url: str, statuses: Sequence[int] = (200,)) -> bool:
    """Return whether GET url answers with one of the statuses."""
    try:
        return httpx.get(url, timeout=1.0).status_code in statuses
    except httpx.HTTPError:
        return False


class Supervisor:
    """Start children in their own process groups, watch them, and stop them all."""

    def __init__(self, *, cwd: Path, env: Mapping[str, str], log_dir: Path) -> None:
        self.cwd = cwd
        self.env = dict(env)
        self.log_dir = log_dir
        self.children: list[Child] = []
        self.stop_signal: str | None = None

    def handle_signals(self) -> None:
        """Turn SIGINT and SIGTERM into a stop request that every wait notices."""
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._request_stop)

    def _request_stop(self, signum: int, frame: object) -> None:
        # Only a flag: raising here could interrupt Popen between fork and bookkeeping.
        self.stop_signal = signal.Signals(signum).name

    def start(self, name: str, argv: Sequence[str]) -> Child:
        """Start argv with its output in <log_dir>/<name>.log, in a new process group."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                list(argv),
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own session: Ctrl-C reaches only the launcher, which then stops it in order.
                start_new_session=True,
            )
        child = Child(name, process, log_path)
        self.children.append(child)
        return child

    def adopt(self, name: str, process: subprocess.Popen[bytes], log_path: Path) -> Child:
        """Watch a process someone else started; it is stopped after every started child."""
        child = Child(name, process, log_path, own_group=False)
        self.children.append(child)
        return child

    def check(self) -> None:
        """Raise StopRequested after a signal, or LaunchError when a child has exited."""
        # A signal first: a child that shares our terminal may exit from the same Ctrl-C.
        if self.stop_signal is not None:
            raise StopRequested(self.stop_signal)
        for child in self.children:
            code = child.process.poll()
            if code is not None:
                raise child.failure(f"exited with status {code}")

    def wait_ready(
        self, child: Child, probe: Callable[[], bool], timeout_s: float = READY_TIMEOUT_S
    ) -> None:
        """Return once probe() is true; raise if anything exits, a signal comes, or time is up."""
        deadline = time.monotonic() + timeout_s
        while not probe():
            self.check()
            if time.monotonic() > deadline:
                raise child.failure(f"was not ready after {timeout_s:.0f} s")
            time.sleep(POLL_S)

    def watch(self) -> None:
        """Block until a signal (StopRequested) or a child's exit (LaunchError)."""
        while True:
            self.check()
            time.sleep(POLL_S)

    def stop_all(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop started children together, then adopted ones: SIGTERM, SIGKILL after grace_s."""
        started = [child for child in self.children if child.own_group]
        adopted = [child for child in self.children if not child.own_group]
        # Servers before the Redis they talk to, so a worker's warm shutdown can still ack.
        for wave in (started, adopted):
            for child in wave:
                if child.process.poll() is None:
                    child.process.terminate()
            deadline = time.monotonic() + grace_s
            for child in wave:
                try:
                    child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    _kill(child)
                    child.process.wait()
                if child.own_group:
                    # The leader is gone; its helpers (Celery's pool and beat) must not outlive it.
                    _kill(child)


def _kill(child: Child) -> None:
    with contextlib.suppress(ProcessLookupError):
        if child.own_group:
            os.killpg(child.process.pid, signal.SIGKILL)
        else:
            child.process.kill()
