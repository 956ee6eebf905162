"""Soak: many concurrent streams for a minute through one gateway process, and what it costs.

Starts one simulator engine (room for every stream), one Nexus web process under daphne (as
`make run` starts it) and one under uvicorn; then, for each in turn, keeps STREAMS streams in
flight for DURATION seconds (each client sends its next stream as soon as its last one ended) and
reports: streams completed, errors (non-200, no `[DONE]`, transport errors), time to first token
p50/p99 as the client saw it, the gateway's CPU time per second of load, and its RSS and open
file handles before the load, at their highest during it, and after it (once idle connections
expired): a leak shows as handles that do not come back down. All on 127.0.0.1; bounded in
streams and time.

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
    Server,
    Stack,
    cpu_ms,
    free_port,
    uvicorn_argv,
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


@dataclass
class Run:
    """One server's soak: what the clients saw and what the gateway process cost."""

    server: str
    load: Load
    seconds: float
    cpu_share: float  # the gateway's CPU seconds per second of load
    before: Footprint
    during: Footprint  # the highest seen
    after: Footprint

    def figures(self) -> dict[str, object]:
        return {
            "server": self.server, "completed": self.load.completed,
            "errors": sum(self.load.errors.values()),
            "ttft_p50_ms": round(self.load.percentile(0.5), 1),
            "ttft_p99_ms": round(self.load.percentile(0.99), 1),
            "gateway_cpu": round(self.cpu_share, 2),
            "rss_mib": [self.before.rss_mib, self.during.rss_mib, self.after.rss_mib],
            "open_files": [self.before.open_files, self.during.open_files, self.after.open_files],
        }  # fmt: skip


def run(server: str, gateway: Server, streams: int, duration_s: float) -> Run:
    """Soak one gateway process, then read what it kept once idle connections expired."""
    assert gateway.process is not None
    pid = gateway.process.pid
    url = f"http://127.0.0.1:{gateway.port}/v1/chat/completions"
    before = Footprint.of(pid)
    began, cpu_before = time.monotonic(), cpu_ms(pid)
    load, during = asyncio.run(soak(url, gateway.token, streams, duration_s, pid))
    seconds = time.monotonic() - began
    cpu_share = (cpu_ms(pid) - cpu_before) / 1000 / seconds
    time.sleep(SETTLE_S)
    return Run(server, load, seconds, cpu_share, before, during, Footprint.of(pid))


def report(runs: list[Run], streams: int, duration_s: float) -> None:
    print(f"\nSoak: {streams} concurrent streams for {duration_s:.0f} s through one gateway "
          f"process, {TOKENS} tokens at {TPOT_MS} ms each")  # fmt: skip
    rows = [
        ("streams completed", lambda r: f"{r.load.completed} ({r.load.completed / r.seconds:.0f}/s)"),  # noqa: E501
        ("errors", lambda r: f"{sum(r.load.errors.values())} {json.dumps(r.load.errors)}"),
        ("TTFT p50 / p99", lambda r: f"{r.load.percentile(0.5):.0f} / {r.load.percentile(.99):.0f} ms"),  # noqa: E501
        ("gateway CPU", lambda r: f"{r.cpu_share:.0%} of one core"),
        ("RSS before", lambda r: f"{r.before.rss_mib:.1f} MiB"),
        ("RSS during (max)", lambda r: f"{r.during.rss_mib:.1f} MiB"),
        ("RSS after", lambda r: f"{r.after.rss_mib:.1f} MiB"),
        ("open files before", lambda r: str(r.before.open_files)),
        ("open files during (max)", lambda r: str(r.during.open_files)),
        ("open files after", lambda r: str(r.after.open_files)),
    ]  # fmt: skip
    print(f"  {'':<24}" + "".join(f"{r.server:<28}" for r in runs))
    for label, cell in rows:
        print(f"  {label:<24}" + "".join(f"{cell(r):<28}" for r in runs))
    for one in runs:
        print(json.dumps({"streams": streams, "duration_s": duration_s, **one.figures()}))


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
            # daphne as `make run` starts it (its listen backlog included), and uvicorn.
            servers = stack.nexus(
                REPO_ROOT, "nexus", {"soak": engine_port},
                servers={
                    "daphne": lambda port, app: daphne_argv("127.0.0.1", port, app),
                    "uvicorn": uvicorn_argv,
                },
            )  # fmt: skip
            # One at a time: the other process idles meanwhile.
            runs = [run(name, server, streams, duration_s) for name, server in servers.items()]
        finally:
            stack.stop()
    report(runs, streams, duration_s)


if __name__ == "__main__":
    main()
