"""Helpers for tests that talk to real agents: let them run the simulator, serve it, add them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from nodes import services
from nodes.models import Node
from tests.support.agent import RunningAgent
from tests.support.http import LOOPBACK
from tests.support.waiting import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
SIM_MODEL = "sim-model"


def agent_args() -> list[str]:
    """Return the options that let an agent run the simulator from this checkout."""
    return ["--allow-dir", str(REPO_ROOT)]


def serve_simulator(agent: RunningAgent, model_id: str = SIM_MODEL, **flags: Any) -> str:
    """Start a simulator as one of the agent's processes; return its process id once it listens."""
    argv = [sys.executable, "-m", "serving.runtimes.simulator", "--model", model_id]
    argv += ["--host", "127.0.0.1", "--port", "${PORT}", "--ttft-ms", "0", "--tpot-ms", "1"]
    for name, value in flags.items():
        argv += ["--" + name.replace("_", "-"), str(value)]
    started = LOOPBACK.post(
        f"{agent.url}/agent/v1/processes",
        headers=agent.headers(),
        json={
            "argv": argv,
            "cwd": str(REPO_ROOT),
            "name": f"simulator {model_id}",
            "model": {"id": model_id, "runtime": "simulator", "health_path": "/v1/models"},
        },
        timeout=10,
    )
    assert started.status_code == 201, started.text
    process_id = started.json()["id"]

    def listening() -> bool:
        log = LOOPBACK.get(
            f"{agent.url}/agent/v1/processes/{process_id}/log",
            headers=agent.headers(),
            timeout=5,
        )
        return "listening on" in log.text

    wait_until(listening, timeout_s=20, what=agent.log)
    return process_id


def stop_process(agent: RunningAgent, process_id: str) -> None:
    """Stop one of the agent's processes (quickly: the simulator exits on SIGTERM)."""
    LOOPBACK.delete(
        f"{agent.url}/agent/v1/processes/{process_id}",
        params={"grace": 2},
        headers=agent.headers(),
        timeout=10,
    ).raise_for_status()


def trusted_node(name: str, agent: RunningAgent) -> Node:
    """Add the agent as a node and confirm it with the fingerprint the agent printed."""
    node = services.add_node(name, agent.url, agent.credential)
    return services.confirm_node(node, agent.fingerprint)
