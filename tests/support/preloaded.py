"""Python processes that the tests start, forked from a parent that has imported their libraries.

A Nexus server, history writer, Celery worker, agent or simulator spends most of its start
importing Django, Twisted, Celery, aiohttp and the rest (about 0.7 s of the 0.8 s CPU a daphne
server takes to start on the 2-core machine), and a side-by-side pass starts about 380 of them.
Each pytest worker runs one preloader (`python -m tests.support.preloaded`, started on first
use): it imports those libraries once, imports nothing that reads settings or the environment,
starts no thread and no event loop, then forks a child per start and runs the command's module
or script in it as `python` would, with the command's arguments, environment, directory and
output. `start()` returns a handle that answers like `subprocess.Popen` (pid, poll, wait,
signals); the preloader tells each handle the child's exit status.

What a forked child does not get from a fresh interpreter is what Python reads at its own
start: the hash seed (the preloader's) and `-X` options; none of the commands depends on them.
`NEXUS_TEST_PRELOAD=0` starts every command as a plain subprocess instead.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import runpy
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, Protocol

REPO_ROOT = Path(__file__).resolve().parents[2]

# Imported by the preloader before it forks: libraries only, none reading Django's settings.
# Twisted's reactor and daphne's server are left out: importing either installs a reactor with
# an event loop, which children would share.
PRELOAD = (
    "django.db.models.base",
    "django.core.handlers.asgi",
    "django.http",
    "django.urls",
    "django.template",
    "django.forms",
    "django.views.generic",
    "rest_framework",
    "channels",
    "twisted.internet.defer",
    "twisted.internet.protocol",
    "twisted.web.http",
    "autobahn.twisted.websocket",
    "celery.app.base",
    "celery.worker",
    "kombu.entity",
    "kombu.serialization",
    "aiohttp",
    "httpx",
    "redis.asyncio",
    "psycopg",
    "yaml",
    "uvloop",
    "uvicorn.main",
    "uvicorn.protocols.http.httptools_impl",
    "uvicorn.protocols.http.h11_impl",
    "prometheus_client",
    "prometheus_client.parser",
    # What a server still imported after the fork, as of 2026-12-07 (the rest of Django's setup
    # and URLs read settings): 0.40 -> 0.30 s of CPU from fork to a daphne server's first request.
    "django.test",
    "django.db.backends.postgresql.base",
    "django.db.backends.sqlite3.base",
    "django.contrib.admin",
    "django.contrib.staticfiles.handlers",
    "django.contrib.sessions.backends.db",
    "rest_framework.serializers",
    "rest_framework.response",
    "channels.generic.websocket",
    "channels.layers",
    "channels.auth",
    "channels.routing",
    "celery.fixups.django",
    "httpx_aiohttp",
    "cryptography.fernet",
    "dj_database_url",
    "django_htmx.middleware",
    "template_partials.apps",
    "pygments.formatters.html",
    "pygments.lexers.special",
    "statistics",
    "uritemplate",
    "inflection",
)

# Where each pytest worker's preloader listens (its pid follows): the unit guard knows it.
SOCKET_PREFIX = "/tmp/nexus-preload-"

# Python reads these at its own start; a forked child sets them from the command's environment.
_UNBUFFERED = "PYTHONUNBUFFERED"
_NO_BYTECODE = "PYTHONDONTWRITEBYTECODE"


class Process(Protocol):
    """What the tests use of a started process: `subprocess.Popen`'s answers."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | Any: ...

    @property
    def args(self) -> Any: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


def start(command: Sequence[str], env: dict[str, str], output: IO[bytes]) -> Process:
    """Start `python -m module ...` or `python script ...` with stdout and stderr to output.

    The command must start with this interpreter (`sys.executable`); it runs in REPO_ROOT.
    """
    if command[0] != sys.executable or os.environ.get("NEXUS_TEST_PRELOAD") == "0":
        return subprocess.Popen(
            list(command), cwd=REPO_ROOT, stdout=output, stderr=subprocess.STDOUT, env=env
        )
    return _preloader().start(list(command), env, output.fileno())


class Forked:
    """A child of the preloader, seen from the test: its exit status comes over `connection`."""

    def __init__(self, connection: socket.socket, pid: int, args: list[str]) -> None:
        self._connection = connection
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read_status(timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and not self._read_status(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _read_status(self, timeout: float | None) -> bool:
        with selectors.DefaultSelector() as selector:
            selector.register(self._connection, selectors.EVENT_READ)
            if not selector.select(timeout):
                return False
        message = _receive(self._connection)
        self._connection.close()
        if message is None:
            raise RuntimeError(f"the preloader stopped before {self.args} exited")
        self.returncode = int(message["returncode"])
        return True

    def __del__(self) -> None:
        self._connection.close()


class _Preloader:
    """This worker's preloader process and the socket it listens on."""

    def __init__(self) -> None:
        self._path = Path(f"{SOCKET_PREFIX}{os.getpid()}.sock")
        self._path.unlink(missing_ok=True)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.preloaded", str(self._path)],
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
        )
        atexit.register(self.close)

    def start(self, command: list[str], env: dict[str, str], output: int) -> Forked:
        connection = self._connect()
        request = json.dumps({"argv": command, "env": env, "cwd": str(REPO_ROOT)}).encode()
        socket.send_fds(connection, [struct.pack("!I", len(request)) + request], [output])
        message = _receive(connection)
        if message is None:
            connection.close()
            raise RuntimeError(f"the preloader did not start {command}")
        return Forked(connection, int(message["pid"]), command)

    def _connect(self) -> socket.socket:
        # The preloader listens once it has imported everything: the first start waits for it.
        for _ in range(600):
            if self.process.poll() is not None:
                raise RuntimeError(f"the preloader exited with {self.process.returncode}")
            connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                connection.connect(str(self._path))
            except (FileNotFoundError, ConnectionRefusedError):
                connection.close()
                threading.Event().wait(0.05)
                continue
            return connection
        raise RuntimeError("the preloader did not listen within 30 s")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        self._path.unlink(missing_ok=True)


_the_preloader: _Preloader | None = None
_lock = threading.Lock()


def _preloader() -> _Preloader:
    global _the_preloader
    with _lock:
        if _the_preloader is None or _the_preloader.process.poll() is not None:
            _the_preloader = _Preloader()
        return _the_preloader


def _receive(connection: socket.socket) -> dict[str, Any] | None:
    """Read one line of JSON, and not a byte of the next; None when the other side closed.

    A child that ends at once has its exit status sent right after its pid: both lines can
    arrive together, and the second must stay in the socket for `Forked` to read (and select on).
    """
    data = b""
    while True:
        chunk = connection.recv(4096, socket.MSG_PEEK)
        if not chunk:
            return None
        end = chunk.find(b"\n")
        if end >= 0:
            data += connection.recv(end + 1)
            break
        data += connection.recv(len(chunk))
    result: dict[str, Any] = json.loads(data)
    return result


# -- the preloader itself ------------------------------------------------------------------------


def serve(path: str) -> None:
    """Import PRELOAD, then fork a child for each request on the socket at path until SIGTERM."""
    for module in PRELOAD:
        __import__(module)
    if "twisted.internet.reactor" in sys.modules:
        raise RuntimeError("a preloaded module installed Twisted's reactor")
    from django.conf import settings

    # Each child reads its own settings, from its own environment, after the fork.
    if settings.configured:
        raise RuntimeError("a preloaded module read Django's settings")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    waiting: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, its requester)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    parent = os.getppid()
    try:
        while True:
            if os.getppid() != parent:
                return  # the pytest worker is gone (killed): no one will ask again
            for key, _ in selector.select(timeout=1.0):
                if key.fileobj is listener:
                    connection, _ = listener.accept()
                    forked = _fork_requested(connection, listener)
                    if forked is None:
                        connection.close()
                        continue
                    pid, pidfd = forked
                    waiting[pidfd] = (pid, connection)
                    selector.register(pidfd, selectors.EVENT_READ)
                else:
                    pidfd = int(key.fd)
                    pid, connection = waiting.pop(pidfd)
                    selector.unregister(pidfd)
                    os.close(pidfd)
                    _, status = os.waitpid(pid, 0)
                    _reply(connection, {"returncode": os.waitstatus_to_exitcode(status)})
                    connection.close()
    finally:
        for _pid, connection in waiting.values():
            connection.close()


def _fork_requested(connection: socket.socket, listener: socket.socket) -> tuple[int, int] | None:
    header, fds, _, _ = socket.recv_fds(connection, 4, 1)
    if len(header) < 4 or not fds:
        return None
    size = struct.unpack("!I", header)[0]
    body = b""
    while len(body) < size:
        chunk = connection.recv(size - len(body))
        if not chunk:
            return None
        body += chunk
    request = json.loads(body)
    output = fds[0]
    pid = os.fork()
    if pid == 0:
        listener.close()
        connection.close()
        _run_child(request["argv"], request["env"], request["cwd"], output)
    os.close(output)
    pidfd = os.pidfd_open(pid)
    _reply(connection, {"pid": pid})
    return pid, pidfd


def _reply(connection: socket.socket, message: dict[str, Any]) -> None:
    # A test that went away gets no answer; its child still runs to its end.
    with contextlib.suppress(OSError):
        connection.sendall(json.dumps(message).encode() + b"\n")


def _run_child(argv: list[str], env: dict[str, str], cwd: str, output: int) -> None:
    """Become `argv` as a fresh interpreter would run it; never return."""
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        _close_inherited()
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        sys.dont_write_bytecode = bool(env.get(_NO_BYTECODE))
        unbuffered = bool(env.get(_UNBUFFERED))
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
        sys.stdout = _text_stream(1, unbuffered)
        sys.stderr = _text_stream(2, True)
        code = _run(argv[1:], cwd)
    except SystemExit as exit_:
        code = _exit_code(exit_.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = -signal.SIGINT  # as Python exits on an unhandled SIGINT: killed by it
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        _finish(code)


def _finish(code: int) -> None:
    """Exit as the interpreter does: join non-daemon threads (and run what waits on them, such as
    thread pools' shutdown), run atexit functions, flush, then exit with code."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # Python's own exit calls it
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        if code < 0:
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
        os._exit(code)


def _run(arguments: list[str], cwd: str) -> int:
    if arguments[0] == "-m":
        module, rest = arguments[1], arguments[2:]
        sys.argv = [module, *rest]
        sys.path[0] = cwd
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        script, rest = arguments[0], arguments[1:]
        sys.argv = [script, *rest]
        sys.path[0] = str(Path(script).resolve().parent)
        runpy.run_path(script, run_name="__main__")
    return 0


def _text_stream(fd: int, unbuffered: bool) -> io.TextIOWrapper:
    return io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(fd, "w", closefd=False)),
        line_buffering=not unbuffered,
        write_through=unbuffered,
    )


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")  # as Python prints a SystemExit's message
    return 1


def _close_inherited() -> None:
    """Close every descriptor but 0, 1 and 2: the preloader's socket and other requests'."""
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2:
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
                os.close(int(name))


if __name__ == "__main__":
    serve(sys.argv[1])
