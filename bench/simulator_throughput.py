"""Measure the simulator's throughput and CPU cost per request on one pinned core.

Usage: ``python bench/simulator_throughput.py [--seconds 5] [--concurrency 64]``. The simulator
runs with ttft 0 and tpot 0 on the first allowed CPU; the load generator runs on the others.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.simulator import Simulator, running_simulator  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Result:
    """One measured scenario."""

    name: str
    requests: int
    seconds: float
    cpu_seconds: float

    @property
    def rate(self) -> float:
        """Return requests per wall-clock second."""
        return self.requests / self.seconds

    @property
    def cpu_per_request_us(self) -> float:
        """Return simulator CPU microseconds per request."""
        return self.cpu_seconds / self.requests * 1e6

    @property
    def capacity(self) -> float:
        """Return the requests per second one fully busy core would sustain."""
        return self.requests / self.cpu_seconds


def cpu_seconds(pid: int) -> float:
    """Return user + system CPU time of a process from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # Fields 14 and 15 of stat (utime, stime) sit at 11 and 12 once pid and comm are cut off.
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


async def drive(
    simulator: Simulator,
    name: str,
    body: dict[str, object],
    path: str,
    *,
    concurrency: int,
    seconds: float,
    max_requests: int,
) -> Result:
    """Send ``body`` from ``concurrency`` workers until time or the request budget runs out."""
    payload = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    url = simulator.root_url + path
    streaming = bool(body.get("stream"))
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        # Warm up connections and the simulator before measuring.
        for _ in range(concurrency):
            async with session.post(url, data=payload, headers=headers) as response:
                await response.read()
        sent = 0
        deadline = time.monotonic() + seconds

        async def worker() -> None:
            nonlocal sent
            while sent < max_requests and time.monotonic() < deadline:
                sent += 1
                async with session.post(url, data=payload, headers=headers) as response:
                    data = await response.read()
                    if response.status != 200 or (streaming and not data.endswith(b"[DONE]\n\n")):
                        raise RuntimeError(f"bad response {response.status}: {data[-200:]!r}")

        cpu_before = cpu_seconds(simulator.process.pid)
        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.monotonic() - started
        cpu_used = cpu_seconds(simulator.process.pid) - cpu_before
    return Result(name, sent, elapsed, cpu_used)


def main() -> None:
    """Run the scenarios and print a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--max-requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    simulator_cpu, load_cpus = cpus[0], set(cpus[1:]) or {cpus[0]}
    messages = [{"role": "user", "content": "Say something nice."}]
    chat = {"model": "demo-8b", "messages": messages, "max_tokens": 16}
    completion = {"model": "demo-8b", "prompt": "Say something nice.", "max_tokens": 16}
    stream = {"model": "demo-8b", "messages": messages, "max_tokens": 100, "stream": True}
    # (name, path, body, divisor of the request budget): a stream is far more work.
    scenarios = [
        ("chat, 16 tokens", "/v1/chat/completions", chat, 1),
        ("completions, 16 tokens", "/v1/completions", completion, 1),
        ("chat stream, 100 tokens", "/v1/chat/completions", stream, 5),
    ]
    results = []
    with running_simulator(ttft_ms=0, tpot_ms=0, concurrency=args.concurrency) as simulator:
        os.sched_setaffinity(simulator.process.pid, {simulator_cpu})
        os.sched_setaffinity(0, load_cpus)
        for name, path, body, budget_divisor in scenarios:
            result = asyncio.run(
                drive(
                    simulator,
                    name,
                    body,
                    path,
                    concurrency=args.concurrency,
                    seconds=args.seconds,
                    max_requests=args.max_requests // budget_divisor,
                )
            )
            results.append(result)
    print(f"simulator on CPU {simulator_cpu}, load generator on CPUs {sorted(load_cpus)}")
    print(f"{'scenario':<26}{'requests':>10}{'req/s':>10}{'sim CPU µs/req':>16}{'req/s/core':>12}")
    for r in results:
        print(
            f"{r.name:<26}{r.requests:>10}{r.rate:>10.0f}"
            f"{r.cpu_per_request_us:>16.0f}{r.capacity:>12.0f}"
        )


if __name__ == "__main__":
    main()
