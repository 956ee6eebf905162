"""What the gateway costs: direct to a simulator versus through Nexus, side by side, in one run.

For each scenario (non-streaming and 100-token streams, at concurrency 1 and 64) it drives the same
simulator directly, through Nexus under daphne (the default) and under uvicorn (the documented
high-throughput option), and prints requests/s, latency and the gateway process's CPU time per
request, read from /proc/<pid>/stat before and after. The gateway runs pinned to CPU 0; the
simulator and this load generator share CPU 1, so the gateway's CPU numbers stay clean.

Usage: python bench/gateway_overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

REPO_ROOT = Path(__file__).resolve().parents[1]
# Run as a script from anywhere: the project's packages come from the repository root.
sys.path.insert(0, str(REPO_ROOT))
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
GATEWAY_CPU = {0}
OTHER_CPU = {1} if (os.cpu_count() or 1) > 1 else {0}
TARGETS = "targets under daphne: <= 1.5 ms CPU per request, <= 8 ms CPU per 100-token stream, "
TARGETS += "added p50 <= 1 ms at concurrency 1"


@dataclass
class Result:
    requests: int
    seconds: float
    latencies_ms: list[float]
    cpu_ms: float | None  # the gateway's CPU for the whole scenario

    @property
    def rate(self) -> float:
        return self.requests / self.seconds

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def cpu_per_request(self) -> float | None:
        return None if self.cpu_ms is None else self.cpu_ms / self.requests


def cpu_ms(pid: int) -> float:
    """Return the process's user + system CPU time in milliseconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / CLOCK_TICKS


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, process: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer in {timeout_s} s")


def spawn(argv: list[str], env: dict[str, str], cpus: set[int], log: Path) -> subprocess.Popen:
    process = subprocess.Popen(
        argv, cwd=REPO_ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT
    )
    os.sched_setaffinity(process.pid, cpus)
    return process


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def configure(data_dir: Path, sim_urls: dict[str, str]) -> str:
    """Create the database, a pool over each simulator and a token; return the token."""
    os.environ["NEXUS_DATA_DIR"] = str(data_dir)
    os.environ.pop("DATABASE_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "nexus.settings")
    import django

    django.setup()
    from django.core.management import call_command

    from nexus.models import ApiToken
    from pools.models import Pool, Target

    call_command("migrate", verbosity=0)
    for slug, url in sim_urls.items():
        pool = Pool.objects.create(name=slug, slug=slug, strategy="round_robin")
        Target.objects.create(
            pool=pool, name="sim", base_url=url, model_id="bench-model", capacity_weight=512
        )
    return ApiToken.issue("bench")[1]


async def run_load(
    url: str, body: bytes, headers: dict[str, str], concurrency: int, total: int, limit_s: float
) -> tuple[int, float, list[float]]:
    """Send `total` requests with `concurrency` workers (bounded by limit_s)."""
    latencies: list[float] = []
    remaining = total
    deadline = time.monotonic() + limit_s
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0 and time.monotonic() < deadline:
                remaining -= 1
                started = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as response:
                    async for _ in response.content.iter_any():
                        pass
                    if response.status != 200:
                        raise RuntimeError(f"{url} answered {response.status}")
                latencies.append((time.perf_counter() - started) * 1000)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return len(latencies), time.perf_counter() - started, latencies


def measure(
    url: str, body: bytes, headers: dict[str, str], concurrency: int, total: int,
    gateway_pid: int | None,
) -> Result:  # fmt: skip
    asyncio.run(run_load(url, body, headers, concurrency, max(concurrency * 4, 20), 10))  # warm
    before = cpu_ms(gateway_pid) if gateway_pid else None
    count, seconds, latencies = asyncio.run(
        run_load(url, body, headers, concurrency, total, limit_s=30)
    )
    spent = cpu_ms(gateway_pid) - before if gateway_pid and before is not None else None
    return Result(count, seconds, latencies, spent)


@dataclass
class Server:
    """A process that answers the benchmark's requests, and the model name to send it."""

    label: str
    port: int
    model: str
    process: subprocess.Popen[bytes] | None = None  # None: not measured (the engine itself)


def simulator_argv(port: int, tpot_ms: str) -> list[str]:
    return [
        sys.executable, "-m", "serving.runtimes.simulator", "--port", str(port),
        "--model", "bench-model", "--ttft-ms", "0", "--tpot-ms", tpot_ms, "--concurrency", "512",
    ]  # fmt: skip


def daphne_argv(port: int, app: str) -> list[str]:
    return [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), app]


def uvicorn_argv(port: int, app: str) -> list[str]:
    return [
        sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port),
        "--loop", "uvloop", "--http", "httptools", "--lifespan", "off", "--no-access-log",
        "--log-level", "warning",
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests per scenario")
    args = parser.parse_args()
    scale = 0.25 if args.quick else 1.0
    os.sched_setaffinity(0, OTHER_CPU)

    with tempfile.TemporaryDirectory(prefix="nexus-bench-") as tmp:
        tmp_path = Path(tmp)
        env = dict(os.environ, PYTHONUNBUFFERED="1", NEXUS_DATA_DIR=str(tmp_path))
        env.pop("DATABASE_URL", None)
        processes: list[subprocess.Popen[bytes]] = []

        def start(name: str, argv: list[str], cpus: set[int], **extra: str) -> subprocess.Popen:
            process = spawn(argv, dict(env, **extra), cpus, tmp_path / f"{name}.log")
            processes.append(process)
            return process

        try:
            # Non-streaming answers come at once; streams come one token a millisecond, so that
            # each token is its own chunk (at 0 ms the engine's writes merge and flatter the
            # relay). Each engine gets its own pool and its own bare proxy.
            groups: dict[str, list[Server]] = {}
            for slug, tpot in (("bench", "0"), ("bench-stream", "1")):
                port = free_port()
                engine = start(slug, simulator_argv(port, tpot), OTHER_CPU)
                wait_http(f"http://127.0.0.1:{port}/health", engine)
                groups[slug] = [Server("direct", port, "bench-model")]
            # Saving a pool pushes to the pages' channel layer: Redis must be up first.
            from nexus import embedded_redis
            from nexus.env import bundled_redis_socket

            processes.append(embedded_redis.start(bundled_redis_socket(tmp_path)))
            token = configure(
                tmp_path,
                {slug: f"http://127.0.0.1:{group[0].port}/v1" for slug, group in groups.items()},
            )
            nexus = {
                "nexus/daphne": daphne_argv,
                "nexus/uvicorn": uvicorn_argv,
            }
            shared = {}
            for label, argv in nexus.items():
                port = free_port()
                process = start(
                    label.replace("/", "-"), argv(port, "nexus.asgi:application"), GATEWAY_CPU
                )
                wait_http(f"http://127.0.0.1:{port}/healthz", process)
                shared[label] = (port, process)
            for slug, group in groups.items():
                port = free_port()
                upstream = f"http://127.0.0.1:{group[0].port}/v1/chat/completions"
                bare = start(
                    f"bare-{slug}", daphne_argv(port, "bench.bare_proxy:application"),
                    GATEWAY_CPU, BARE_PROXY_UPSTREAM=upstream,
                )  # fmt: skip
                wait_http(f"http://127.0.0.1:{port}/", bare)
                group.append(Server("bare/daphne", port, "bench-model", bare))
                for label, (nexus_port, process) in shared.items():
                    group.append(Server(label, nexus_port, f"@pool/{slug}", process))
            report(token, groups, scale)
        finally:
            for process in reversed(processes):
                stop(process)


def report(token: str, groups: dict[str, list[Server]], scale: float) -> None:
    message = [{"role": "user", "content": "Summarise the benefits of load balancing."}]
    scenarios = [
        ("non-stream", 1, 600, {"max_tokens": 16}, "bench"),
        ("non-stream", 64, 6000, {"max_tokens": 16}, "bench"),
        ("stream 100", 1, 100, {"max_tokens": 100, "stream": True}, "bench-stream"),
        ("stream 100", 64, 1280, {"max_tokens": 100, "stream": True}, "bench-stream"),
    ]
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    print(f"gateway overhead ({TARGETS})")
    print("bare/daphne: a proxy with nothing but daphne, httpx and the aiohttp transport")
    print(f"{'scenario':<16}{'path':<15}{'n':>6}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
          f"{'gw CPU ms/req':>15}{'p50 +ms':>9}")  # fmt: skip
    for name, concurrency, total, extra, slug in scenarios:
        direct_p50 = None
        for server in groups[slug]:
            body = json.dumps({"model": server.model, "messages": message, **extra}).encode()
            pid = server.process.pid if server.process else None
            result = measure(
                f"http://127.0.0.1:{server.port}/v1/chat/completions", body, headers,
                concurrency, max(int(total * scale), 20), pid,
            )  # fmt: skip
            p50 = result.percentile(0.5)
            if direct_p50 is None:
                direct_p50 = p50
            cpu = f"{result.cpu_per_request:.3f}" if result.cpu_per_request is not None else "-"
            added = f"{p50 - direct_p50:+.2f}" if pid else "-"
            print(
                f"{name + f' c={concurrency}':<16}{server.label:<15}{result.requests:>6}"
                f"{result.rate:>9.0f}{p50:>9.2f}{result.percentile(0.99):>9.2f}{cpu:>15}"
                f"{added:>9}",
                flush=True,
            )
    print("latency under concurrency includes the shared CPU of the simulator and load generator;")
    print("the gateway's CPU per request is measured on its own pinned core.")


if __name__ == "__main__":
    main()
