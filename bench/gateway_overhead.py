"""What the gateway costs: direct to a simulator versus through Nexus, side by side, in one run.

For each scenario (non-streaming and 100-token streams, at concurrency 1 and 64) it drives the same
simulator directly, through Nexus under daphne (the default) and under uvicorn (the documented
high-throughput option), and prints requests/s, latency and the gateway process's CPU time per
request, read from /proc/<pid>/stat before and after. The gateway runs pinned to CPU 0; the
simulator and this load generator share CPU 1, so the gateway's CPU numbers stay clean.

With `--compare REV` it measures two revisions of Nexus in one run instead: REV is checked out
into a temporary git worktree, and the same scenarios run against the same engines through this
tree's gateway and REV's, alternating (REV first in odd rounds), so that machine noise falls on
both; the figures are printed side by side with their ratio (this tree / REV), and the worktree
is removed afterwards. Each tree gets its own database and bundled Redis, configured by its own
code.

With `--limits` it measures what a client token's limits cost instead: one Nexus under daphne
with the memory ledger and one with the Redis ledger (the bundled Redis), each called with a token
without limits and with one that has all three (requests and tokens per minute, concurrent
requests; set high enough never to refuse), alternating, and prints the gateway's CPU per request
of each, with the limited token's extra CPU.

Usage: python bench/gateway_overhead.py [--quick] [--compare REV [--rounds N] | --limits]
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

REPO_ROOT = Path(__file__).resolve().parents[1]
# Run as a script from anywhere: the project's packages come from the repository root.
sys.path.insert(0, str(REPO_ROOT))
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
GATEWAY_CPU = {0}
OTHER_CPU = {1} if (os.cpu_count() or 1) > 1 else {0}
# Issue 12's targets: CPU per non-streaming request and per 100-token stream at c=64, TTFT p50 of
# streams at c=64, added p50 at c=1.
TARGETS = (
    "targets: daphne <= 0.8 ms/request, <= 3.5 ms/stream, TTFT p50 <= 10 ms, added p50 <= 1 ms;"
)
TARGETS += " uvicorn <= 0.5, <= 2.5, <= 5, <= 0.6"


@dataclass
class Result:
    requests: int
    seconds: float
    latencies_ms: list[float]
    cpu_ms: float | None  # the gateway's CPU for the whole scenario
    ttfts_ms: list[float] = field(default_factory=list)  # time to the first body bytes

    def add(self, other: Result) -> Result:
        """Return both runs' figures together (rounds of the same scenario)."""
        cpu = None if self.cpu_ms is None or other.cpu_ms is None else self.cpu_ms + other.cpu_ms
        return Result(
            self.requests + other.requests,
            self.seconds + other.seconds,
            self.latencies_ms + other.latencies_ms,
            cpu,
            self.ttfts_ms + other.ttfts_ms,
        )

    @property
    def rate(self) -> float:
        return self.requests / self.seconds

    def percentile(self, q: float) -> float:
        return percentile(self.latencies_ms, q)

    def ttft_percentile(self, q: float) -> float:
        return percentile(self.ttfts_ms, q)

    @property
    def cpu_per_request(self) -> float | None:
        return None if self.cpu_ms is None else self.cpu_ms / self.requests


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


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


def spawn(
    argv: list[str], env: dict[str, str], cpus: set[int], log: Path, cwd: Path = REPO_ROOT
) -> subprocess.Popen:
    process = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT
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


# A client token with every limit, none of which a benchmark reaches: what checking them costs.
ISSUE_LIMITED = """
import os, sys
from pathlib import Path
os.environ["NEXUS_DATA_DIR"] = sys.argv[1]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "nexus.settings")
import django
django.setup()
from nexus.models import ApiToken
limits = dict(requests_per_minute=10**9, tokens_per_minute=10**12, max_concurrent=10**6)
print(ApiToken.issue("bench-limited", **limits)[1])
"""
LEDGERS = ("memory", "redis")


# Run in a tree with that tree's own configure(): its models may differ from this tree's.
CONFIGURE_TREE = """
import json, sys
from pathlib import Path
from bench.gateway_overhead import configure
print(configure(Path(sys.argv[1]), json.loads(sys.argv[2])))
"""


def configure_tree(
    tree: Path, env: dict[str, str], data_dir: Path, sim_urls: dict[str, str]
) -> str:
    """Run the tree's own configure() in a process of its own; return the token."""
    done = subprocess.run(
        [sys.executable, "-c", CONFIGURE_TREE, str(data_dir), json.dumps(sim_urls)],
        cwd=tree, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"configuring {tree} failed:\n{done.stderr}")
    return done.stdout.strip().splitlines()[-1]


async def run_load(
    url: str, body: bytes, headers: dict[str, str], concurrency: int, total: int, limit_s: float
) -> tuple[int, float, list[float], list[float]]:
    """Send `total` requests with `concurrency` workers (bounded by limit_s); return the count,
    the seconds, each request's latency and its time to the first body bytes (a stream's first
    token event), in ms."""
    latencies: list[float] = []
    ttfts: list[float] = []
    remaining = total
    deadline = time.monotonic() + limit_s
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0 and time.monotonic() < deadline:
                remaining -= 1
                started = time.perf_counter()
                first: float | None = None
                async with session.post(url, data=body, headers=headers) as response:
                    async for _ in response.content.iter_any():
                        if first is None:
                            first = time.perf_counter()
                    if response.status != 200:
                        raise RuntimeError(f"{url} answered {response.status}")
                ended = time.perf_counter()
                latencies.append((ended - started) * 1000)
                ttfts.append(((first or ended) - started) * 1000)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return len(latencies), time.perf_counter() - started, latencies, ttfts


def measure(
    url: str, body: bytes, headers: dict[str, str], concurrency: int, total: int,
    gateway_pid: int | None,
) -> Result:  # fmt: skip
    asyncio.run(run_load(url, body, headers, concurrency, max(concurrency * 4, 20), 10))  # warm
    before = cpu_ms(gateway_pid) if gateway_pid else None
    count, seconds, latencies, ttfts = asyncio.run(
        run_load(url, body, headers, concurrency, total, limit_s=30)
    )
    spent = cpu_ms(gateway_pid) - before if gateway_pid and before is not None else None
    return Result(count, seconds, latencies, spent, ttfts)


@dataclass
class Server:
    """A process that answers the benchmark's requests, and the model name to send it."""

    label: str
    port: int
    model: str
    process: subprocess.Popen[bytes] | None = None  # None: not measured (the engine itself)
    token: str = ""


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


SERVERS: dict[str, Callable[[int, str], list[str]]] = {
    "daphne": daphne_argv,
    "uvicorn": uvicorn_argv,
}
SCENARIOS = [
    ("non-stream", 1, 600, {"max_tokens": 16}, "bench"),
    ("non-stream", 64, 6000, {"max_tokens": 16}, "bench"),
    ("stream 100", 1, 100, {"max_tokens": 100, "stream": True}, "bench-stream"),
    ("stream 100", 64, 1280, {"max_tokens": 100, "stream": True}, "bench-stream"),
]
MESSAGE = [{"role": "user", "content": "Summarise the benefits of load balancing."}]


@dataclass
class Stack:
    """The engines and the processes started for a run; stopped in reverse order."""

    tmp: Path
    env: dict[str, str]
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(
        self, name: str, argv: list[str], cpus: set[int], cwd: Path = REPO_ROOT, **extra: str
    ) -> subprocess.Popen[bytes]:
        process = spawn(argv, dict(self.env, **extra), cpus, self.tmp / f"{name}.log", cwd)
        self.processes.append(process)
        return process

    def stop(self) -> None:
        for process in reversed(self.processes):
            stop(process)

    def engines(self) -> dict[str, int]:
        """Start one engine per pool: non-streaming answers at once, streams a token a ms.

        At 0 ms per token the engine's writes merge and flatter the relay, so streams come one
        token a millisecond and each token is its own chunk.
        """
        ports = {}
        for slug, tpot in (("bench", "0"), ("bench-stream", "1")):
            port = free_port()
            engine = self.start(slug, simulator_argv(port, tpot), OTHER_CPU)
            wait_http(f"http://127.0.0.1:{port}/health", engine)
            ports[slug] = port
        return ports

    def nexus(
        self,
        tree: Path,
        label: str,
        engine_ports: dict[str, int],
        servers: dict[str, Callable[[int, str], list[str]]] | None = None,
    ) -> dict[str, Server]:
        """Start `tree`'s Nexus under every ASGI server (or those given), on a database of its
        own; by server."""
        from nexus import embedded_redis
        from nexus.env import bundled_redis_socket

        data_dir = self.tmp / label
        data_dir.mkdir()
        env = dict(self.env, NEXUS_DATA_DIR=str(data_dir), PYTHONPATH=str(tree))
        env["DJANGO_SETTINGS_MODULE"] = "nexus.settings"
        # Saving a pool pushes to the pages' channel layer: Redis must be up first.
        self.processes.append(embedded_redis.start(bundled_redis_socket(data_dir)))
        urls = {slug: f"http://127.0.0.1:{port}/v1" for slug, port in engine_ports.items()}
        token = configure_tree(tree, env, data_dir, urls)
        if (tree / "pools" / "management" / "commands" / "runhistorywriter.py").exists():
            # A tree whose gateways ship their history to Redis: its writer runs beside them,
            # on the other CPUs (its CPU is not the gateway's, and is not measured).
            self.start(
                f"{label}-history-writer", [sys.executable, "manage.py", "runhistorywriter"],
                OTHER_CPU, tree, NEXUS_DATA_DIR=str(data_dir), PYTHONPATH=str(tree),
            )  # fmt: skip
        started = {}
        for server, argv in (servers or SERVERS).items():
            port = free_port()
            name = f"{label}-{server}"
            process = self.start(
                name, argv(port, "nexus.asgi:application"), GATEWAY_CPU, tree,
                NEXUS_DATA_DIR=str(data_dir), PYTHONPATH=str(tree),
            )  # fmt: skip
            wait_http(f"http://127.0.0.1:{port}/healthz", process)
            started[server] = Server(f"{label}/{server}", port, "", process, token)
        return started

    def limits(self, engine_ports: dict[str, int]) -> dict[str, tuple[Server, str]]:
        """Start Nexus under daphne once per ledger; return each with the limited token."""
        from nexus import embedded_redis
        from nexus.env import bundled_redis_socket

        data_dir = self.tmp / "limits"
        data_dir.mkdir()
        env = dict(self.env, NEXUS_DATA_DIR=str(data_dir), DJANGO_SETTINGS_MODULE="nexus.settings")
        self.processes.append(embedded_redis.start(bundled_redis_socket(data_dir)))
        urls = {slug: f"http://127.0.0.1:{port}/v1" for slug, port in engine_ports.items()}
        token = configure_tree(REPO_ROOT, env, data_dir, urls)
        issued = subprocess.run(
            [sys.executable, "-c", ISSUE_LIMITED, str(data_dir)],
            cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        limited = issued.stdout.strip().splitlines()[-1]
        servers = {}
        for ledger in LEDGERS:
            port = free_port()
            process = self.start(
                f"limits-{ledger}", daphne_argv(port, "nexus.asgi:application"), GATEWAY_CPU,
                NEXUS_DATA_DIR=str(data_dir), NEXUS_LEDGER=ledger,
            )  # fmt: skip
            wait_http(f"http://127.0.0.1:{port}/healthz", process)
            servers[ledger] = (Server(f"daphne/{ledger}", port, "", process, token), limited)
        return servers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests per scenario")
    parser.add_argument("--compare", metavar="REV", help="measure this tree against REV")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds")
    parser.add_argument(
        "--limits", action="store_true", help="a token with limits versus none, per ledger"
    )
    args = parser.parse_args()
    scale = 0.25 if args.quick else 1.0
    os.sched_setaffinity(0, OTHER_CPU)

    with tempfile.TemporaryDirectory(prefix="nexus-bench-") as tmp:
        tmp_path = Path(tmp)
        env = dict(os.environ, PYTHONUNBUFFERED="1", NEXUS_DATA_DIR=str(tmp_path))
        env.pop("DATABASE_URL", None)
        env.pop("REDIS_URL", None)
        stack = Stack(tmp_path, env)
        worktree: Path | None = None
        try:
            engine_ports = stack.engines()
            if args.compare:
                worktree = tmp_path / "compared"
                subprocess.run(
                    ["git", "worktree", "add", "--detach", str(worktree), args.compare],
                    cwd=REPO_ROOT, check=True, capture_output=True,
                )  # fmt: skip
                rev = git_describe(args.compare)
                this = stack.nexus(REPO_ROOT, "this", engine_ports)
                other = stack.nexus(worktree, "rev", engine_ports)
                compare(rev, other, this, engine_ports, scale, args.rounds)
            elif args.limits:
                limits_report(stack.limits(engine_ports), scale, args.rounds)
            else:
                this = stack.nexus(REPO_ROOT, "nexus", engine_ports)
                groups = single_run_groups(stack, this, engine_ports)
                report(groups, scale)
        finally:
            stack.stop()
            if worktree is not None:
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(worktree)],
                    cwd=REPO_ROOT, check=False, capture_output=True,
                )  # fmt: skip


def git_describe(rev: str) -> str:
    """Return a short name for the revision, e.g. "main (1a2b3c4)"."""
    done = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=REPO_ROOT, capture_output=True, text=True
    )
    return f"{rev} ({done.stdout.strip()})"


def single_run_groups(
    stack: Stack, nexus: dict[str, Server], engine_ports: dict[str, int]
) -> dict[str, list[Server]]:
    """Return per engine: the engine itself, a bare proxy to it, and Nexus under each server."""
    groups: dict[str, list[Server]] = {}
    for slug, engine_port in engine_ports.items():
        port = free_port()
        upstream = f"http://127.0.0.1:{engine_port}/v1/chat/completions"
        bare = stack.start(
            f"bare-{slug}", daphne_argv(port, "bench.bare_proxy:application"),
            GATEWAY_CPU, BARE_PROXY_UPSTREAM=upstream,
        )  # fmt: skip
        wait_http(f"http://127.0.0.1:{port}/", bare)
        groups[slug] = [
            Server("direct", engine_port, "bench-model"),
            Server("bare/daphne", port, "bench-model", bare),
            *(Server(s.label, s.port, f"@pool/{slug}", s.process, s.token) for s in nexus.values()),
        ]
    return groups


def measure_server(server: Server, scenario: tuple, scale: float) -> Result:
    _, concurrency, total, extra, _ = scenario
    body = json.dumps({"model": server.model, "messages": MESSAGE, **extra}).encode()
    headers = {"Authorization": f"Bearer {server.token}", "Content-Type": "application/json"}
    pid = server.process.pid if server.process else None
    return measure(
        f"http://127.0.0.1:{server.port}/v1/chat/completions", body, headers,
        concurrency, max(int(total * scale), 20), pid,
    )  # fmt: skip


def report(groups: dict[str, list[Server]], scale: float) -> None:
    print(f"gateway overhead ({TARGETS})")
    print("bare/daphne: a proxy with nothing but daphne, httpx and the aiohttp transport")
    print(f"{'scenario':<16}{'path':<15}{'n':>6}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
          f"{'TTFT p50':>10}{'gw CPU ms/req':>15}{'p50 +ms':>9}")  # fmt: skip
    for scenario in SCENARIOS:
        name, concurrency, _, _, slug = scenario
        direct_p50 = None
        for server in groups[slug]:
            result = measure_server(server, scenario, scale)
            p50 = result.percentile(0.5)
            if direct_p50 is None:
                direct_p50 = p50
            cpu = f"{result.cpu_per_request:.3f}" if result.cpu_per_request is not None else "-"
            added = f"{p50 - direct_p50:+.2f}" if server.process else "-"
            print(
                f"{name + f' c={concurrency}':<16}{server.label:<15}{result.requests:>6}"
                f"{result.rate:>9.0f}{p50:>9.2f}{result.percentile(0.99):>9.2f}"
                f"{result.ttft_percentile(0.5):>10.2f}{cpu:>15}"
                f"{added:>9}",
                flush=True,
            )
    print("latency under concurrency includes the shared CPU of the simulator and load generator;")
    print("the gateway's CPU per request is measured on its own pinned core.")


def limits_report(servers: dict[str, tuple[Server, str]], scale: float, rounds: int) -> None:
    """Measure each ledger's gateway with and without a limited token, alternating; print both."""
    print(f"token limits: gateway CPU per request, {rounds} alternating rounds per figure")
    print(f"{'scenario':<16}{'ledger':<9}{'n':>6}{'req/s none':>12}{'req/s limited':>15}"
          f"{'CPU ms/req none':>17}{'limited':>9}{'+ms':>8}")  # fmt: skip
    for scenario in SCENARIOS:
        name, concurrency, _, _, slug = scenario
        for ledger, (server, limited) in servers.items():
            pair = {
                "none": Server(server.label, server.port, f"@pool/{slug}", server.process,
                               server.token),
                "limited": Server(server.label, server.port, f"@pool/{slug}", server.process,
                                  limited),
            }  # fmt: skip
            totals: dict[str, Result] = {}
            for round_ in range(rounds):
                order = ["none", "limited"] if round_ % 2 == 0 else ["limited", "none"]
                for label in order:
                    result = measure_server(pair[label], scenario, scale)
                    totals[label] = totals[label].add(result) if label in totals else result
            none, with_limits = totals["none"], totals["limited"]
            none_cpu = none.cpu_per_request or 0.0
            limited_cpu = with_limits.cpu_per_request or 0.0
            print(
                f"{name + f' c={concurrency}':<16}{ledger:<9}{with_limits.requests:>6}"
                f"{none.rate:>12.0f}{with_limits.rate:>15.0f}{none_cpu:>17.3f}"
                f"{limited_cpu:>9.3f}{limited_cpu - none_cpu:>+8.3f}",
                flush=True,
            )
    print("CPU ms/req: the gateway process's CPU (user + system, its own pinned core) per request;")
    print(
        "+ms: what the limited token's checks add (one ledger call before, one after with Redis)."
    )


def compare(
    rev: str,
    other: dict[str, Server],
    this: dict[str, Server],
    engine_ports: dict[str, int],
    scale: float,
    rounds: int,
) -> None:
    """Measure both trees' gateways alternately; print each scenario's figures side by side."""
    print(f"gateway overhead: this tree vs {rev}, {rounds} alternating rounds per figure")
    print(
        f"{'scenario':<16}{'server':<9}{'n':>6}{'req/s rev':>11}{'req/s this':>11}{'p50 rev':>9}"
        f"{'p50 this':>9}{'TTFT rev':>9}{'this':>7}{'CPU ms/req rev':>16}{'this':>8}"
        f"{'this/rev':>10}"
    )
    for scenario in SCENARIOS:
        name, concurrency, _, _, slug = scenario
        for server in SERVERS:
            pair = {
                label: Server(s.label, s.port, f"@pool/{slug}", s.process, s.token)
                for label, s in (("rev", other[server]), ("this", this[server]))
            }
            totals: dict[str, Result] = {}
            for round_ in range(rounds):
                order = ["rev", "this"] if round_ % 2 == 0 else ["this", "rev"]
                for label in order:
                    result = measure_server(pair[label], scenario, scale)
                    totals[label] = totals[label].add(result) if label in totals else result
            rev_r, this_r = totals["rev"], totals["this"]
            rev_cpu = rev_r.cpu_per_request or 0.0
            this_cpu = this_r.cpu_per_request or 0.0
            ratio = this_cpu / rev_cpu if rev_cpu else float("nan")
            print(
                f"{name + f' c={concurrency}':<16}{server:<9}{this_r.requests:>6}"
                f"{rev_r.rate:>11.0f}{this_r.rate:>11.0f}"
                f"{rev_r.percentile(0.5):>9.2f}{this_r.percentile(0.5):>9.2f}"
                f"{rev_r.ttft_percentile(0.5):>9.2f}{this_r.ttft_percentile(0.5):>7.2f}"
                f"{rev_cpu:>16.3f}{this_cpu:>8.3f}{ratio:>10.2f}",
                flush=True,
            )
    print("CPU ms/req: the gateway process's CPU (user + system, its own pinned core) per request,")
    print("over every round; this/rev below 1.00 means this tree costs less.")


if __name__ == "__main__":
    main()
