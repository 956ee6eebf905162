"""A real model through Nexus: tokens/s and time to first token, direct versus through Nexus.

Two llama.cpp servers (llama-cpp-python's, one thread each) serve SmolLM2-135M-Instruct; Nexus
(daphne) has a pool over one of them and a pool over both. Each scenario sends the same chats
(32 tokens, greedy) streamed and not, to 1 replica at concurrency 1 and to 2 replicas at
concurrency 2, directly (the client alternates between the servers) and through `@pool/<slug>`,
and prints both side by side with their ratio. Needs `make llama` (make bench installs it).

Usage: python bench/real_engine.py [--requests N]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
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

from bench.gateway_overhead import daphne_argv, free_port, spawn, stop, wait_http  # noqa: E402
from serving.real_model import SMOLLM2_NAME, missing_for_real_model, smollm2_gguf  # noqa: E402

MAX_TOKENS = 32
PROMPT = [{"role": "user", "content": "Write one sentence about the sea."}]
ALL_CPUS = set(range(os.cpu_count() or 1))
# Every request is bounded; a stuck engine ends the scenario, not the run.
REQUEST_TIMEOUT_S = 120.0


@dataclass
class Outcome:
    """One scenario's requests: when each first token came, and the tokens in all."""

    ttft_s: list[float] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def median_ttft_ms(self) -> float:
        ordered = sorted(self.ttft_s)
        return 1000 * ordered[len(ordered) // 2] if ordered else 0.0


def llama_argv(port: int, gguf: Path) -> list[str]:
    return [
        sys.executable, "-m", "llama_cpp.server", "--model", str(gguf),
        "--model_alias", SMOLLM2_NAME, "--host", "127.0.0.1", "--port", str(port),
        "--n_threads", "1", "--n_ctx", "1024", "--interrupt_requests", "false",
    ]  # fmt: skip


def configure(data_dir: Path, ports: list[int]) -> str:
    """Create the database, a pool over one engine and a pool over both; return a token."""
    os.environ["NEXUS_DATA_DIR"] = str(data_dir)
    os.environ.pop("DATABASE_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "nexus.settings")
    import django

    django.setup()
    from django.core.management import call_command

    from nexus.models import ApiToken
    from pools.models import Pool, Target

    call_command("migrate", verbosity=0)
    for slug, count in (("llama-1", 1), ("llama-2", 2)):
        pool = Pool.objects.create(name=slug, slug=slug, strategy="least_busy")
        for index, port in enumerate(ports[:count]):
            # llama-cpp-python's server runs one request at a time: capacity 1 (the catalogue).
            Target.objects.create(
                pool=pool,
                name=f"llama-{index}",
                base_url=f"http://127.0.0.1:{port}/v1",
                model_id=SMOLLM2_NAME,
                capacity_weight=1,
            )
    return ApiToken.issue("bench-real-engine")[1]


async def one(
    session: aiohttp.ClientSession, url: str, model: str, headers: dict[str, str], stream: bool
) -> tuple[float, int]:
    """Send one chat; return its time to the first token and the tokens it produced."""
    body = {
        "model": model,
        "messages": PROMPT,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "seed": 1,
        "stream": stream,
    }
    started = time.perf_counter()
    first = None
    tokens = 0
    async with session.post(url, json=body, headers=headers) as response:
        if response.status != 200:
            raise RuntimeError(f"{url} answered {response.status}: {await response.text()}")
        if not stream:
            answer = await response.json()
            first = time.perf_counter() - started  # the whole answer comes at once
            return first, int(answer["usage"]["completion_tokens"])
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    tokens += 1
                    if first is None:
                        first = time.perf_counter() - started
    return first or 0.0, tokens


async def scenario(
    urls: list[str], model: str, headers: dict[str, str], stream: bool, requests: int
) -> Outcome:
    """Send `requests` chats, as many at once as there are URLs, each worker on its own URL."""
    outcome = Outcome()
    numbers = itertools.count()
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def worker(url: str) -> None:
            while next(numbers) < requests:
                ttft, tokens = await one(session, url, model, headers, stream)
                outcome.ttft_s.append(ttft)
                outcome.tokens += tokens

        started = time.perf_counter()
        await asyncio.gather(*(worker(url) for url in urls))
        outcome.seconds = time.perf_counter() - started
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=8, help="chats per scenario")
    args = parser.parse_args()
    missing = missing_for_real_model()
    if missing:
        sys.exit(f"real engine benchmark: needs {missing} (make llama)")
    gguf = smollm2_gguf()
    assert gguf is not None

    with tempfile.TemporaryDirectory(prefix="nexus-bench-real-") as tmp:
        tmp_path = Path(tmp)
        env = dict(os.environ, PYTHONUNBUFFERED="1", NEXUS_DATA_DIR=str(tmp_path))
        env.pop("DATABASE_URL", None)
        processes = []
        try:
            ports = [free_port(), free_port()]
            for index, port in enumerate(ports):
                engine = spawn(
                    llama_argv(port, gguf), env, ALL_CPUS, tmp_path / f"llama{index}.log"
                )
                processes.append(engine)
                wait_http(f"http://127.0.0.1:{port}/v1/models", engine, timeout_s=120)
            from nexus import embedded_redis
            from nexus.env import bundled_redis_socket

            processes.append(embedded_redis.start(bundled_redis_socket(tmp_path)))
            token = configure(tmp_path, ports)
            nexus_port = free_port()
            nexus = spawn(
                daphne_argv(nexus_port, "nexus.asgi:application"),
                env,
                ALL_CPUS,
                tmp_path / "nexus.log",
            )
            processes.append(nexus)
            wait_http(f"http://127.0.0.1:{nexus_port}/healthz", nexus)
            report(ports, nexus_port, token, args.requests)
        finally:
            for process in reversed(processes):
                stop(process)


def report(ports: list[int], nexus_port: int, token: str, requests: int) -> None:
    direct = [f"http://127.0.0.1:{port}/v1/chat/completions" for port in ports]
    through = f"http://127.0.0.1:{nexus_port}/v1/chat/completions"
    auth = {"Authorization": f"Bearer {token}"}
    # Warm both engines (the first answer pays for loading pages of the model file).
    for url in direct:
        asyncio.run(scenario([url], SMOLLM2_NAME, {}, False, 1))
    print(f"real engine: SmolLM2-135M Q4_1 on llama-cpp-python, {MAX_TOKENS} tokens per chat,")
    print(f"{requests} chats per row; TTFT of a non-streamed chat is its whole answer")
    print(
        f"{'replicas':<10}{'mode':<12}{'direct tok/s':>13}{'nexus tok/s':>13}{'ratio':>7}"
        f"{'direct TTFT':>13}{'nexus TTFT':>12}{'+ms':>7}"
    )
    for replicas in (1, 2):
        for stream in (False, True):
            mine = asyncio.run(scenario(direct[:replicas], SMOLLM2_NAME, {}, stream, requests))
            pool = f"@pool/llama-{replicas}"
            ours = asyncio.run(scenario([through] * replicas, pool, auth, stream, requests))
            ratio = ours.tokens_per_s / mine.tokens_per_s if mine.tokens_per_s else 0.0
            added = ours.median_ttft_ms() - mine.median_ttft_ms()
            print(
                f"{replicas:<10}{'stream' if stream else 'non-stream':<12}"
                f"{mine.tokens_per_s:>13.1f}{ours.tokens_per_s:>13.1f}{ratio:>7.2f}"
                f"{mine.median_ttft_ms():>10.0f} ms{ours.median_ttft_ms():>9.0f} ms{added:>+7.0f}"
            )


if __name__ == "__main__":
    main()
