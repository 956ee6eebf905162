"""Run the Nexus agent (nodes.agent) as a real process on a loopback port for tests."""

from __future__ import annotations

import atexit
import os
import re
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from nodes.agent.processes import kill_all
from tests.support import preloaded, processes
from tests.support.http import LOOPBACK
from tests.support.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
# Generous: the agent imports aiohttp, cryptography and psutil on a machine shared by test runs.
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
_FINGERPRINT = re.compile(r"^fingerprint: (SHA256:\S+)$", re.M)
_SIMULATOR_READY = re.compile(r"^simulator \S+ (?:listening|refusing connections) on ", re.M)

# Agents not stopped yet; stopped at interpreter exit so a failing test never leaks one.
_live: set[RunningAgent] = set()


@dataclass(eq=False)
class RunningAgent:
    """A running agent process; its log collects the output of every start."""

    url: str
    port: int
    data_dir: Path
    credential: str
    fingerprint: str
    process: preloaded.Process
    log_path: Path
    command: list[str] = field(repr=False, default_factory=list)
    env: dict[str, str] = field(repr=False, default_factory=dict)

    def log(self) -> str:
        """Return what the agent has written to stdout and stderr, over all its starts."""
        return self.log_path.read_text(errors="replace")

    def headers(self) -> dict[str, str]:
        """Return the headers that authenticate to this agent."""
        return {"Authorization": f"Bearer {self.credential}"}

    def kill(self) -> None:
        """SIGKILL the agent alone, like a crash; the processes it started keep running."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(STOP_TIMEOUT_S)

    def stop(self) -> None:
        """SIGTERM the agent and wait for it to exit (SIGKILL after 10 s)."""
        processes.stop(self.process, STOP_TIMEOUT_S)

    def start(self) -> None:
        """Start the agent (again) on the same port and data dir and wait until it answers."""
        if self.process.poll() is None:
            raise RuntimeError(f"the agent on port {self.port} is still running")
        log_start = len(self.log())
        self.process = _spawn(self.command, self.env, self.log_path)
        self.fingerprint = _wait_until_ready(self, log_start)


def _spawn(command: list[str], env: dict[str, str], log_path: Path) -> preloaded.Process:
    with log_path.open("ab") as log:
        # The child keeps its own copy of the descriptor, so closing ours here is safe.
        return preloaded.start(command, env, log)


def _wait_until_ready(agent: RunningAgent, log_start: int) -> str:
    """Wait until /agent/v1/info answers; return the fingerprint this start printed."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        exit_code = agent.process.poll()
        if exit_code is not None:
            raise RuntimeError(f"agent exited with {exit_code} before answering:\n{agent.log()}")
        try:
            response = LOOPBACK.get(
                f"{agent.url}/agent/v1/info", headers=agent.headers(), timeout=2
            )
        except httpx.TransportError:
            response = None
        if response is not None and response.status_code == 200:
            printed = _FINGERPRINT.search(agent.log()[log_start:])
            if printed:
                return printed.group(1)
        if time.monotonic() > deadline:
            agent.kill()
            raise RuntimeError(f"agent did not answer within {START_TIMEOUT_S} s:\n{agent.log()}")
        time.sleep(0.05)


def start_managed_simulator(
    agent: RunningAgent, model: str = "demo-8b", *flags: str, name: str = ""
) -> dict[str, Any]:
    """Start a simulator as one of the agent's processes serving `model`, on `${PORT}`.

    Returns the process record once the simulator is bound (listening, or refusing connections
    when `--refuse-connections` is among the flags).
    """
    argv = [sys.executable, "-m", "serving.runtimes.simulator", "--model", model]
    argv += ["--host", "127.0.0.1", "--port", "${PORT}", *flags]
    response = LOOPBACK.post(
        f"{agent.url}/agent/v1/processes",
        headers=agent.headers(),
        json={
            "argv": argv,
            # The agent runs it in its data dir; the simulator is imported from this checkout.
            "env": {"PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"},
            "name": name or f"simulator {model}",
            "model": {"id": model, "runtime": "simulator"},
        },
        timeout=10,
    )
    response.raise_for_status()
    process = response.json()
    url = f"{agent.url}/agent/v1/processes/{process['id']}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        log = LOOPBACK.get(f"{url}/log", headers=agent.headers(), timeout=5).text
        if _SIMULATOR_READY.search(log):
            return process
        record = LOOPBACK.get(url, headers=agent.headers(), timeout=5).json()
        if record["state"] != "running":
            raise RuntimeError(f"simulator {model} ended ({record['state']}):\n{log}")
        time.sleep(0.05)
    raise RuntimeError(f"simulator {model} did not listen within {START_TIMEOUT_S} s")


@contextmanager
def running_agent(
    tmp_path: Path,
    *,
    name: str = "agent",
    credential: str = "node-secret",
    port: int | None = None,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> Iterator[RunningAgent]:
    """Run an agent with data dir ``tmp_path/name`` for the duration of the ``with`` block.

    On exit the agent is stopped and every process it started is killed, so none leaks.
    """
    port = port or free_port()
    data_dir = tmp_path / name
    log_path = tmp_path / f"{name}.log"
    command = [sys.executable, "-m", "nodes.agent", "--port", str(port)]
    command += ["--data-dir", str(data_dir), "--credential", credential, *args]
    child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    agent = RunningAgent(
        url=f"http://127.0.0.1:{port}",
        port=port,
        data_dir=data_dir,
        credential=credential,
        fingerprint="",
        process=_spawn(command, child_env, log_path),
        log_path=log_path,
        command=command,
        env=child_env,
    )
    _live.add(agent)
    try:
        agent.fingerprint = _wait_until_ready(agent, 0)
        yield agent
    finally:
        _stop_with_processes(agent)


def _stop_with_processes(agent: RunningAgent) -> None:
    _live.discard(agent)
    agent.stop()
    kill_all(agent.data_dir)


@atexit.register
def _stop_leftovers() -> None:
    for agent in list(_live):
        _stop_with_processes(agent)
