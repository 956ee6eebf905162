"""Soak: many concurrent streams for a minute through one gateway process, and what it costs.

Starts one simulator engine (room for every stream) and one Nexus web process under daphne, then
keeps STREAMS streams in flight for DURATION seconds (each client sends its next stream as soon
as the last one ended) and reports: streams completed, errors (non-200, no `[DONE]`, transport
errors), time to first token p50/p99, and the gateway process's RSS and open file handles
before the load, at their highest during it, and after it (once idle connections expired), and
its CPU time per second of load. A
leak shows as RSS or handles that do not come back down. All on 127.0.0.1; bounded in streams
and time.

Usage: python bench/soak.py [--streams 500] [--duration 60] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.gateway_overhead import (  # noqa: E402  (needs the repository on the path)
    OTHER_CPU,
    Stack,
    cpu_ms,
    free_port,
    wait_http,
)
from nexus.launcher import daphne_argv  # noqa: E402

# Each stream: TOKENS tokens, one every TPOT_MS: a few seconds long, so that the streams in
# flight stay at STREAMS while clients start new ones.
TOKENS = 30
TPOT_MS = 100
SAMPLE_EVERY_S = 1.0
# After the load: "after" is read once idle upstream connections expired (nexus.upstream keeps
# them alive for 30 s), so that what is left open is what would leak.
SETTLE_S = 35.0


@dataclass
class Load:
    """What the clients saw."""

    completed: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    ttft_ms: list[float] = field(default_factory=list)

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def percentile(self, q: float) -> float:
        ordered = sorted(self.ttft_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


@dataclass
class Footprint:
    """The gateway process's resident memory (MiB) and open file handles at one moment."""

    rss_mib: float
    open_files: int

    @classmethod
    def of(cls, pid: int) -> Footprint:
        status = Path(f"/proc/{pid}/status").read_text()
        rss_kib = next(
            int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")
        )
        return cls(round(rss_kib / 1024, 1), len(os.listdir(f"/proc/{pid}/fd")))


async def stream_until(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str],
    deadline: float, load: Load,
) -> None:  # fmt: skip
    """Send streams one after another until the deadline."""
    while time.monotonic() < deadline:
        started = time.perf_counter()
        first: float | None = None
        last = b""
        try:
            async with session.post(url, data=body, headers=headers) as response:
                if response.status != 200:
                    load.error(f"http {response.status}")
                    await response.read()
                    continue
                async for line in response.content:
                    if line.startswith(b"data: "):
                        if first is None:
                            first = time.perf_counter()
                        last = line.strip()
        except (aiohttp.ClientError, TimeoutError) as error:
            load.error(type(error).__name__)
            await asyncio.sleep(0.1)
            continue
        if last != b"data: [DONE]":
            load.error("stream without [DONE]")
            continue
        load.completed += 1
        assert first is not None
        load.ttft_ms.append((first - started) * 1000)


async def soak(
    url: str, token: str, streams: int, duration_s: float, pid: int
) -> tuple[Load, Footprint]:
    """Keep `streams` streams in flight for duration_s; return the load and the peak footprint."""
    body = json.dumps(
        {"model": "@pool/soak", "stream": True, "max_tokens": TOKENS,
         "messages": [{"role": "user", "content": "Keep talking."}]}
    ).encode()  # fmt: skip
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    load = Load()
    peak = Footprint.of(pid)
    deadline = time.monotonic() + duration_s
    timeout = aiohttp.ClientTimeout(total=duration_s + 60)
    connector = aiohttp.TCPConnector(limit=streams)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        clients = [
            asyncio.create_task(stream_until(session, url, body, headers, deadline, load))
            for _ in range(streams)
        ]
        while not all(client.done() for client in clients):
            await asyncio.sleep(SAMPLE_EVERY_S)
            now = Footprint.of(pid)
            peak = Footprint(max(peak.rss_mib, now.rss_mib), max(peak.open_files, now.open_files))
        await asyncio.gather(*clients)
    return load, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=500, help="streams in flight at once")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    parser.add_argument("--quick", action="store_true", help="100 streams for 15 s")
    args = parser.parse_args()
    streams, duration_s = (100, 15.0) if args.quick else (args.streams, args.duration)
    os.sched_setaffinity(0, OTHER_CPU)

    with tempfile.TemporaryDirectory(prefix="nexus-soak-") as tmp:
        tmp_path = Path(tmp)
        env = dict(os.environ, PYTHONUNBUFFERED="1", NEXUS_DATA_DIR=str(tmp_path))
        env.pop("DATABASE_URL", None)
        env.pop("REDIS_URL", None)
        stack = Stack(tmp_path, env)
        try:
            engine_port = free_port()
            engine = stack.start(
                "engine",
                [sys.executable, "-m", "serving.runtimes.simulator", "--port", str(engine_port),
                 "--model", "bench-model", "--ttft-ms", "20", "--tpot-ms", str(TPOT_MS),
                 "--concurrency", str(streams + 12)],
                OTHER_CPU,
            )  # fmt: skip
            wait_http(f"http://127.0.0.1:{engine_port}/health", engine)
            # daphne as `make run` starts it, its listen backlog included.
            servers = stack.nexus(
                REPO_ROOT, "nexus", {"soak": engine_port},
                servers={"daphne": lambda port, app: daphne_argv("127.0.0.1", port, app)},
            )  # fmt: skip
            gateway = servers["daphne"]
            assert gateway.process is not None
            url = f"http://127.0.0.1:{gateway.port}/v1/chat/completions"
            pid = gateway.process.pid
            before = Footprint.of(pid)
            began, cpu_before = time.monotonic(), cpu_ms(pid)
            load, during = asyncio.run(soak(url, gateway.token, streams, duration_s, pid))
            elapsed = time.monotonic() - began
            cpu_share = (cpu_ms(pid) - cpu_before) / 1000 / elapsed
            time.sleep(SETTLE_S)
            after = Footprint.of(pid)
        finally:
            stack.stop()

    failed = sum(load.errors.values())
    print(f"\nSoak: {streams} concurrent streams for {duration_s:.0f} s through one gateway "
          f"process (daphne), {TOKENS} tokens at {TPOT_MS} ms each")  # fmt: skip
    print(f"  streams completed   {load.completed} ({load.completed / elapsed:.1f}/s)")
    print(f"  errors              {failed} {json.dumps(load.errors) if failed else ''}")
    print(f"  gateway CPU         {cpu_share:.0%} of one core")
    print(
        f"  TTFT                p50 {load.percentile(0.5):.0f} ms,"
        f" p99 {load.percentile(0.99):.0f} ms"
    )
    for label, footprint in (("before", before), ("during (max)", during), ("after", after)):
        print(
            f"  {label:<14}      RSS {footprint.rss_mib:.1f} MiB, {footprint.open_files} open files"
        )
    figures = {
        "streams": streams, "duration_s": duration_s, "completed": load.completed,
        "errors": failed, "ttft_p50_ms": round(load.percentile(0.5), 1),
        "ttft_p99_ms": round(load.percentile(0.99), 1), "gateway_cpu": round(cpu_share, 2),
        "rss_mib": [before.rss_mib, during.rss_mib, after.rss_mib],
        "open_files": [before.open_files, during.open_files, after.open_files],
    }  # fmt: skip
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
