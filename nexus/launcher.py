"""Start, supervise and stop the processes that `manage.py nexus_run` runs.

Once everything is up (`supervise()`), a child that exits is started again after a backoff
(BACKOFF_S, doubling up to MAX_BACKOFF_S) with a line on the launcher's output, while the others
keep running; a child that exits CRASH_LOOP_RESTARTS times within CRASH_LOOP_WINDOW_S is in a
crash loop, and the launcher stops everything, naming it and showing the end of its log. Before
that (while starting), an exit is a configuration error and stops the launch at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

POLL_S = 0.1
READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0
TAIL_LINES = 20
# Restart backoff: BACKOFF_S after the first crash, doubling per crash in the window.
BACKOFF_S = 0.5
MAX_BACKOFF_S = 8.0
# This many restarts within the window is a crash loop: the launcher gives up.
CRASH_LOOP_RESTARTS = 5
CRASH_LOOP_WINDOW_S = 60.0
# Children stop in waves, lowest first; what was adopted (the bundled Redis) stops last.
FIRST_WAVE = 0
LAST_WAVE = 3


# Connections the web server's listening socket queues before it accepts them. daphne (Twisted)
# asks for 50 by default: a burst of more new connections overflows it, the kernel drops their
# SYNs, and clients retry after 1, 3, 7, 15... s (measured in bench/soak.py: TTFT p99 of 70 s at
# 500 streams). The kernel caps it at net.core.somaxconn.
LISTEN_BACKLOG = 1024


def daphne_argv(host: str, port: int, app: str = "nexus.asgi:application") -> list[str]:
    """Return the command that serves the app with daphne on host:port, with LISTEN_BACKLOG."""
    # A Twisted endpoint string: colons in an IPv6 address are escaped.
    interface = host.strip("[]").replace(":", "\\:")
    endpoint = f"tcp:port={port}:interface={interface}:backlog={LISTEN_BACKLOG}"
    return [sys.executable, "-m", "daphne", "-e", endpoint, app]


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
    # Starts the child again (after a crash); None: it is not restarted.
    respawn: Callable[[], subprocess.Popen[bytes]] | None = None
    # Children we start lead their own process group; an adopted one (the bundled Redis) does not.
    own_group: bool = True
    stop_wave: int = FIRST_WAVE
    # Seconds from SIGTERM to SIGKILL when stopping it.
    stop_grace_s: float = STOP_GRACE_S
    # Called before the child's wave is stopped, whether or not the child still runs: its
    # chance to clean up after itself. It must not raise, or later children would be left running.
    before_stop: Callable[[], None] | None = None
    # Monotonic times of its restarts, and when the pending one is due (None: none pending).
    restarts: list[float] = field(default_factory=list)
    restart_at: float | None = None

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

    def __init__(
        self,
        *,
        cwd: Path,
        env: Mapping[str, str],
        log_dir: Path,
        say: Callable[[str], None] = lambda text: None,
        backoff_s: float = BACKOFF_S,
    ) -> None:
        self.cwd = cwd
        self.backoff_s = backoff_s
        self.env = dict(env)
        self.log_dir = log_dir
        self.say = say
        self.children: list[Child] = []
        self.stop_signal: str | None = None
        # False while starting: an exit then fails the launch instead of being restarted.
        self.supervising = False

    def handle_signals(self) -> None:
        """Turn SIGINT and SIGTERM into a stop request that every wait notices."""
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._request_stop)

    def _request_stop(self, signum: int, frame: object) -> None:
        # Only a flag: raising here could interrupt Popen between fork and bookkeeping.
        self.stop_signal = signal.Signals(signum).name

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        stop_wave: int = FIRST_WAVE,
        stop_grace_s: float = STOP_GRACE_S,
        before_stop: Callable[[], None] | None = None,
    ) -> Child:
        """Start argv with its output in <log_dir>/<name>.log, in a new process group.

        `env` replaces the supervisor's environment for this child; `stop_wave`,
        `stop_grace_s` and `before_stop` say when and how `stop_all` stops it.
        """
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        child_env = dict(env) if env is not None else self.env

        def spawn(mode: str) -> subprocess.Popen[bytes]:
            with log_path.open(mode) as log:
                return subprocess.Popen(
                    list(argv),
                    cwd=self.cwd,
                    env=child_env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    # Its own session: Ctrl-C reaches only the launcher, which stops it in order.
                    start_new_session=True,
                )

        child = Child(
            name,
            spawn("wb"),
            log_path,
            # A restart appends: the log keeps what the crashed run wrote.
            respawn=lambda: spawn("ab"),
            stop_wave=stop_wave,
            stop_grace_s=stop_grace_s,
            before_stop=before_stop,
        )
        self.children.append(child)
        return child

    def adopt(
        self,
        name: str,
        process: subprocess.Popen[bytes],
        log_path: Path,
        respawn: Callable[[], subprocess.Popen[bytes]] | None = None,
    ) -> Child:
        """Watch a process someone else started (`respawn` starts it again); it is stopped after
        every started child."""
        child = Child(
            name, process, log_path, respawn=respawn, own_group=False, stop_wave=LAST_WAVE
        )
        self.children.append(child)
        return child

    def supervise(self) -> None:
        """From now on, restart a child that exits instead of failing."""
        self.supervising = True

    def check(self) -> None:
        """Raise StopRequested after a signal; restart children that exited, or raise
        LaunchError when one may not be restarted (while starting, or in a crash loop)."""
        # A signal first: a child that shares our terminal may exit from the same Ctrl-C.
        if self.stop_signal is not None:
            raise StopRequested(self.stop_signal)
        now = time.monotonic()
        for child in self.children:
            if child.restart_at is not None:
                if now >= child.restart_at:
                    self._restart(child, now)
                continue
            code = child.process.poll()
            if code is not None:
                self._crashed(child, f"exited with status {code}", now)

    def _crashed(self, child: Child, what: str, now: float) -> None:
        """Schedule the child's restart with backoff, or raise if it may not be restarted."""
        if not self.supervising or child.respawn is None:
            raise child.failure(what)
        if child.own_group:
            # Its helpers (Celery's pool and beat) must not outlive the leader into the restart.
            _kill(child)
        child.restarts = [at for at in child.restarts if now - at < CRASH_LOOP_WINDOW_S]
        if len(child.restarts) >= CRASH_LOOP_RESTARTS:
            raise child.failure(
                f"{what} after {len(child.restarts)} restarts in {CRASH_LOOP_WINDOW_S:.0f} s: "
                "it is crash-looping, so Nexus stops"
            )
        delay = min(MAX_BACKOFF_S, self.backoff_s * 2 ** len(child.restarts))
        child.restart_at = now + delay
        child.restarts.append(now)
        self.say(f"{child.name} {what}; restarting it in {delay:.1f} s (see {child.log_path})")

    def _restart(self, child: Child, now: float) -> None:
        assert child.respawn is not None
        child.restart_at = None
        try:
            child.process = child.respawn()
        except (OSError, RuntimeError) as error:
            self._crashed(child, f"could not be started again ({error})", now)
            return
        self.say(f"{child.name} restarted (pid {child.process.pid})")

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

    def stop_all(self) -> None:
        """Stop the children wave by wave, each wave together: SIGTERM, then SIGKILL after each
        child's stop grace."""
        # Servers before the Redis they talk to, so a worker's warm shutdown can still ack.
        for wave in sorted({child.stop_wave for child in self.children}):
            members = [child for child in self.children if child.stop_wave == wave]
            for child in members:
                if child.before_stop is not None:
                    child.before_stop()
            for child in members:
                if child.process.poll() is None:
                    child.process.terminate()
            signalled = time.monotonic()
            for child in members:
                left = signalled + child.stop_grace_s - time.monotonic()
                try:
                    child.process.wait(timeout=max(0.0, left))
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
