"""Stopping the processes tests start: politely first, then for certain."""

from __future__ import annotations

import subprocess
from typing import Any


def stop(process: subprocess.Popen[Any], timeout_s: float) -> int:
    """SIGTERM the process and wait for it; SIGKILL it after timeout_s. Return its exit status."""
    if process.poll() is None:
        process.terminate()
        try:
            return process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait(timeout_s)
