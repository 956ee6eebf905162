"""Start simulated inference engines (serving.runtimes.simulator) as real processes for tests."""

from __future__ import annotations

import atexit
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from tests.support import preloaded, processes
from tests.support.http import LOOPBACK

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 5.0
_READY = re.compile(r"^simulator \S+ (?:listening|refusing connections) on http://\S+:(\d+)$", re.M)

# Simulators not stopped yet; stopped at interpreter exit so a failing test never leaks one.
_live: set[Simulator] = set()


@dataclass(eq=False)
class Simulator:
    """A running simulator process."""

    port: int
    model: str
    process: preloaded.Process
    log: IO[bytes] = field(repr=False)

    @property
    def root_url(self) -> str:
        """Return the server root, e.g. ``http://127.0.0.1:9101``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """Return the OpenAI base URL, e.g. ``http://127.0.0.1:9101/v1``."""
        return f"{self.root_url}/v1"

    def set_faults(self, **faults: Any) -> dict[str, Any]:
        """Set faults at run time (POST /sim/faults) and return the resulting fault state."""
        response = LOOPBACK.post(f"{self.root_url}/sim/faults", json=faults, timeout=5)
        response.raise_for_status()
        return response.json()

    def clear_faults(self) -> None:
        """Remove every fault, by signal when the simulator is refusing connections."""
        try:
            LOOPBACK.delete(f"{self.root_url}/sim/faults", timeout=5).raise_for_status()
            return
        except httpx.ConnectError:
            self.process.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                LOOPBACK.get(f"{self.root_url}/sim/faults", timeout=1).raise_for_status()
                return
            except httpx.ConnectError:
                time.sleep(0.02)
        raise RuntimeError(f"simulator on port {self.port} still refuses connections")

    def stats(self) -> dict[str, Any]:
        """Return the simulator's counters (GET /sim/stats)."""
        response = LOOPBACK.get(f"{self.root_url}/sim/stats", timeout=5)
        response.raise_for_status()
        return response.json()

    def output(self) -> str:
        """Return what the process has written to stdout and stderr so far."""
        return Path(self.log.name).read_text(errors="replace")

    def stop(self) -> None:
        """Terminate the process (SIGTERM, then SIGKILL after 5 s) and remove its log."""
        _live.discard(self)
        processes.stop(self.process, STOP_TIMEOUT_S)
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)


def _flag_arguments(flags: dict[str, Any]) -> list[str]:
    arguments: list[str] = []
    for name, value in flags.items():
        option = "--" + name.replace("_", "-")
        if value is True:
            arguments.append(option)
        elif value is False or value is None:
            continue
        elif isinstance(value, list | tuple):
            arguments += [option, ",".join(str(item) for item in value)]
        else:
            arguments += [option, str(value)]
    return arguments


def start_simulator(model: str = "demo-8b", port: int = 0, **flags: Any) -> Simulator:
    """Start a simulator and wait until it is bound; the caller must call ``stop()``.

    ``port=0`` lets the simulator pick a free port (no race); flags map to options:
    ``ttft_ms=0`` → ``--ttft-ms 0``, ``hang=True`` → ``--hang``, ``error_codes=(503,)`` →
    ``--error-codes 503``.
    """
    command = [sys.executable, "-m", "serving.runtimes.simulator", "--model", model]
    command += ["--host", "127.0.0.1", "--port", str(port), *_flag_arguments(flags)]
    # The log outlives this function: Simulator.stop() closes and removes it.
    log = tempfile.NamedTemporaryFile(prefix="simulator-", suffix=".log", delete=False)  # noqa: SIM115
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = preloaded.start(command, env, log)
    simulator = Simulator(port=port, model=model, process=process, log=log)
    _live.add(simulator)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        ready = _READY.search(simulator.output())
        if ready:
            simulator.port = int(ready.group(1))
            return simulator
        exit_code = process.poll()
        if exit_code is not None or time.monotonic() > deadline:
            output = simulator.output()
            simulator.stop()
            reason = "timed out" if exit_code is None else f"exited with {exit_code}"
            raise RuntimeError(f"simulator {reason} before listening:\n{output}")
        time.sleep(0.02)


@contextmanager
def running_simulator(model: str = "demo-8b", port: int = 0, **flags: Any) -> Iterator[Simulator]:
    """Run a simulator for the duration of the ``with`` block."""
    simulator = start_simulator(model, port, **flags)
    try:
        yield simulator
    finally:
        simulator.stop()


@atexit.register
def _stop_leftovers() -> None:
    for simulator in list(_live):
        simulator.stop()


@contextmanager
def running_simulators(**specs: dict[str, Any]) -> Iterator[dict[str, Simulator]]:
    """Start several simulators at once (name -> start_simulator keyword arguments)."""
    with ThreadPoolExecutor(max_workers=max(1, len(specs))) as executor:
        futures = {name: executor.submit(start_simulator, **flags) for name, flags in specs.items()}
    started: dict[str, Simulator] = {}
    failure: BaseException | None = None
    for name, future in futures.items():
        try:
            started[name] = future.result()
        except Exception as exc:  # keep going: every started one must be stopped
            failure = failure or exc
    try:
        if failure is not None:
            raise failure
        yield started
    finally:
        for simulator in started.values():
            simulator.stop()
