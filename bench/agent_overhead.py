"""What the agent costs: direct to a simulator versus through the agent, side by side, in one run.

For each scenario (non-streaming chat and 100-token streams, at concurrency 1 and 32) it drives a
simulator directly, then the same simulator started by the agent as a managed process, reached
through the agent's `/v1` forwarding (chosen by the body's model) and through its process proxy
`/agent/v1/processes/<id>/http/v1/...` (a service replica's path, docs/services.md). It prints
requests/s, latency and the agent process's CPU time per request, read from /proc/<pid>/stat before
and after. The agent runs pinned to CPU 0; the simulators (its managed ones re-pinned) and this
load generator share CPU 1, so the agent's CPU numbers stay clean.

Usage: python bench/agent_overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gateway_overhead import (  # noqa: E402
    GATEWAY_CPU,
    OTHER_CPU,
    REPO_ROOT,
    free_port,
    measure,
    spawn,
    stop,
    wait_http,
)

AGENT_CPU = GATEWAY_CPU
CREDENTIAL = "bench-credential"
# Managed processes outlive a stopped agent: each one is stopped through the agent with this grace.
STOP_GRACE_S = 5
# (model, ms per token): non-streaming answers come at once; streams come one token a millisecond,
# so that each token is its own chunk (at 0 ms the engine's writes merge and flatter the relay).
ENGINES = (("m", "0"), ("m-stream", "1"))
CHAT = "/v1/chat/completions"


@dataclass
class Endpoint:
    """One way to an engine: its chat URL, and the process whose CPU is measured (None: none)."""

    label: str
    url: str
    pid: int | None


def simulator_argv(port: str, model: str, tpot_ms: str) -> list[str]:
    return [
        sys.executable, "-m", "serving.runtimes.simulator", "--port", port, "--model", model,
        "--ttft-ms", "0", "--tpot-ms", tpot_ms, "--concurrency", "512",
    ]  # fmt: skip


def agent_argv(port: int, data_dir: Path) -> list[str]:
    return [
        sys.executable, "-m", "nodes.agent", "--port", str(port), "--data-dir", str(data_dir),
        "--credential", CREDENTIAL,
    ]  # fmt: skip


class Agent:
    """The agent's control API, as the controller calls it."""

    def __init__(self, port: int) -> None:
        self.root = f"http://127.0.0.1:{port}"

    def call(self, method: str, path: str, body: object = None) -> dict:
        """Send one request to the agent and return its JSON answer."""
        request = urllib.request.Request(
            self.root + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {CREDENTIAL}", "Content-Type": "application/json"},
        )
        # A stop waits up to its grace before answering.
        with urllib.request.urlopen(request, timeout=STOP_GRACE_S + 10) as response:
            return json.loads(response.read())

    def start_simulator(self, model: str, tpot_ms: str) -> dict:
        """Start a simulator as a managed process serving `model`; return its record."""
        return self.call(
            "POST",
            "/agent/v1/processes",
            {
                "argv": simulator_argv("${PORT}", model, tpot_ms),
                # The command runs in the agent's data dir: the packages come from here.
                "env": {"PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"},
                "name": f"bench-{model}",
                "model": {"id": model, "runtime": "simulator", "health_path": "/health"},
            },
        )

    def wait_ready(self, process_id: str, timeout_s: float = 30) -> None:
        """Wait until the process answers its health check through the proxy."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            record = self.call("GET", f"/agent/v1/processes/{process_id}")
            if record["state"] != "running":
                raise RuntimeError(f"managed simulator {process_id} is {record['state']}")
            try:
                self.call("GET", f"/agent/v1/processes/{process_id}/http/health")
                return
            except (urllib.error.HTTPError, OSError):
                time.sleep(0.1)
        raise RuntimeError(f"managed simulator {process_id} did not answer in {timeout_s} s")


def check(url: str, body: bytes, headers: dict[str, str], streaming: bool) -> None:
    """Fail unless one request gets a whole answer: a completion, or a stream to [DONE]."""
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        data = response.read()
    complete = data.rstrip().endswith(b"data: [DONE]") if streaming else b'"choices"' in data
    if not complete:
        raise RuntimeError(f"{url} answered an incomplete body: {data[-200:]!r}")


def pin(pid: int, cpus: set[int]) -> None:
    """Pin every thread of a process (not our child, so not pinned at spawn) to `cpus`."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(task.name), cpus)


def stop_managed(agent: Agent, records: list[dict]) -> None:
    """Stop the agent's processes through it; signal their groups if the agent cannot."""
    for record in records:
        try:
            agent.call("DELETE", f"/agent/v1/processes/{record['id']}?grace={STOP_GRACE_S}")
        except OSError:
            # Each runs in its own session, so its group id is its pid.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(record["pid"], signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests per scenario")
    args = parser.parse_args()
    scale = 0.25 if args.quick else 1.0
    os.sched_setaffinity(0, OTHER_CPU)

    with tempfile.TemporaryDirectory(prefix="nexus-bench-agent-") as tmp:
        tmp_path = Path(tmp)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("NEXUS_AGENT_CREDENTIAL", None)
        processes: list[subprocess.Popen[bytes]] = []
        managed: list[dict] = []
        agent: Agent | None = None
        try:
            direct: dict[str, int] = {}
            for model, tpot in ENGINES:
                port = free_port()
                argv = simulator_argv(str(port), model, tpot)
                engine = spawn(argv, env, OTHER_CPU, tmp_path / f"{model}.log")
                processes.append(engine)
                wait_http(f"http://127.0.0.1:{port}/health", engine)
                direct[model] = port
            port = free_port()
            agent_process = spawn(
                agent_argv(port, tmp_path / "agent"), env, AGENT_CPU, tmp_path / "agent.log"
            )
            processes.append(agent_process)
            wait_http(f"http://127.0.0.1:{port}/agent/v1/info", agent_process)
            agent = Agent(port)
            paths: dict[str, list[Endpoint]] = {}
            for model, tpot in ENGINES:
                record = agent.start_simulator(model, tpot)
                managed.append(record)
                pin(record["pid"], OTHER_CPU)
                agent.wait_ready(record["id"])
                pid = agent_process.pid
                proxy = f"{agent.root}/agent/v1/processes/{record['id']}/http"
                paths[model] = [
                    Endpoint("direct", f"http://127.0.0.1:{direct[model]}{CHAT}", None),
                    Endpoint("agent /v1", f"{agent.root}{CHAT}", pid),
                    Endpoint("agent proxy", f"{proxy}{CHAT}", pid),
                ]
            report(paths, scale)
        finally:
            if agent is not None:
                stop_managed(agent, managed)
            for process in reversed(processes):
                stop(process)


def report(paths: dict[str, list[Endpoint]], scale: float) -> None:
    message = [{"role": "user", "content": "Summarise the benefits of load balancing."}]
    scenarios = [
        ("non-stream", 1, 600, {"max_tokens": 16}, "m"),
        ("non-stream", 32, 4000, {"max_tokens": 16}, "m"),
        ("stream 100", 1, 100, {"max_tokens": 100, "stream": True}, "m-stream"),
        ("stream 100", 32, 640, {"max_tokens": 100, "stream": True}, "m-stream"),
    ]
    headers = {"Authorization": f"Bearer {CREDENTIAL}", "Content-Type": "application/json"}
    print(f"agent overhead (agent on CPU {sorted(AGENT_CPU)}, the rest on CPU {sorted(OTHER_CPU)})")
    print(f"{'scenario':<16}{'path':<13}{'n':>6}{'req/s':>9}{'× direct':>10}{'p50 ms':>9}"
          f"{'p99 ms':>9}{'p50 +ms':>9}{'p50 ×':>8}{'agent CPU ms/req':>18}")  # fmt: skip
    for name, concurrency, total, extra, model in scenarios:
        body = json.dumps({"model": model, "messages": message, **extra}).encode()
        direct = None
        for path in paths[model]:
            check(path.url, body, headers, streaming="stream" in extra)
            result = measure(
                path.url, body, headers, concurrency, max(int(total * scale), 20), path.pid
            )
            p50 = result.percentile(0.5)
            if direct is None:
                direct = result
            direct_p50 = direct.percentile(0.5)
            cpu = f"{result.cpu_per_request:.3f}" if result.cpu_per_request is not None else "-"
            print(
                f"{name + f' c={concurrency}':<16}{path.label:<13}{result.requests:>6}"
                f"{result.rate:>9.0f}{result.rate / direct.rate:>10.2f}{p50:>9.2f}"
                f"{result.percentile(0.99):>9.2f}{p50 - direct_p50:>+9.2f}"
                f"{p50 / direct_p50:>8.2f}{cpu:>18}",
                flush=True,
            )
    print("latency under concurrency includes the shared CPU of the simulators and load generator;")
    print("the agent's CPU per request is measured on its own pinned core, idle loops included.")


if __name__ == "__main__":
    main()
