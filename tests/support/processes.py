"""Stopping the processes tests start: politely first, then for certain."""

from __future__ import annotations

import subprocess

from tests.support import preloaded


def stop(process: preloaded.Process, timeout_s: float) -> int:
    """SIGTERM the process and wait for it; SIGKILL it after timeout_s. Return its exit status."""
    if process.poll() is None:
        process.terminate()
        try:
            return process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait(timeout_s)
