"""How well each strategy balances a fleet of unequal engines: time to first token, in one run.

The fleet is three simulated engines on 127.0.0.1 with prefix caches (printed at the start):
a fast one with many slots, a medium one and a slow one with few. One Nexus (daphne, pinned to
CPU 0) fronts them with one pool per strategy (smart, round_robin, least_busy, capacity,
priority), each over the same three engines, every target's capacity_weight set to its engine's
concurrency. The engines and this load generator share CPU 1. The configured order is fast,
medium, slow: the count-based strategies break ties by it, so it favours them, not Smart.

The workload, identical for every strategy: N users, each holding multi-turn conversations
(every turn resends the growing history, so the engine that served the previous turn has most of
the prompt in its prefix cache) with `X-Nexus-Session-Id` per conversation, streaming, a fixed
number of output tokens. Turns arrive as one seeded Poisson process, computed in advance (the
same arrival times for every strategy), each owned by a user drawn at random, so the load stays
steady until the last turn; a turn whose predecessor (same user) is still streaming waits for it.
The rate is a share (`--load`, 0.8 by default) of the fleet's throughput with every slot busy,
computed from the engines' flags. Each strategy's measured phase is bounded by its turn count and
a time cap; an unmeasured warm-up fills every slot twice before it (so every pool starts with
latency samples on all three engines) and an idle pause follows it. Nothing is restarted between
strategies: instead each strategy's conversation texts (system prompt included) carry its name,
so no strategy finds another's prefixes cached.

Reading the table: TTFT is measured by the client, from sending the request to the first chunk
with content. `share` is where the turns went (from the `X-Nexus-Target` header, in the order
fast/medium/slow); `queued` and `queue p99` come from Nexus's routing history (the turns that
waited for a slot, and the 99th percentile of the wait over all turns); `cache` is the engines'
prefix-cache hit rate in prompt tokens; `gw CPU` and `cpu1` are the gateway's and the engines +
load generator's CPU in percent of one core (both should stay well below 100 % for the numbers to
measure balancing, not CPU starvation). The issue's bar: Smart's p90 TTFT below Round robin's and
Least busy's (`--strict` exits 1 when it is missed).

Usage: python bench/balancing_quality.py [--users 48] [--turns 600] [--load 0.8] [--strict]

`--scenario closed` runs issue 11's heterogeneous closed loop instead (see `closed_main`): 8
tenants with long shared system prompts, 32 sessions of 6 turns each sent as soon as the previous
turn ended, engines of 8/8/4 slots at 8/16/32 ms per token, then an under-loaded run (16
sessions) of Smart and Least busy. It prints tokens/s, TTFT p50/p90/p99, the prefix-cache hit
rate, the share of turns on the previous turn's engine and the sessions whose mean TTFT is over
2 s, per strategy. `tok/s` is over the whole run; `all on` over the part while all the sessions
were still running (from the first turn to the first session's end), the rate to compare with
the fleet's ceiling: after it the loop thins out, sessions ending `tail` seconds apart with the
last ones alone on the fleet, and no routing choice refills the idle slots.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gateway_overhead import (  # noqa: E402
    GATEWAY_CPU,
    OTHER_CPU,
    configure,
    cpu_ms,
    daphne_argv,
    free_port,
    spawn,
    stop,
    wait_http,
)

STRATEGIES = ("smart", "round_robin", "least_busy", "capacity", "priority")
MAX_TOKENS = 32
SLOWDOWN = 0.5  # the simulator's default: per-token time × 1.5 with every slot busy
BLOCK_SIZE = 16
# Large enough for every strategy's conversations (~20 blocks each): evictions would measure the
# cache size, not whether a strategy keeps a conversation where its prefix is.
CACHE_BLOCKS = 4096
SYSTEM_WORDS = 48  # three cache blocks shared by every conversation of a strategy
USER_WORDS = (30, 50)  # words per user message, drawn uniformly
CONVERSATION_TURNS = 4
PAUSE_S = 3.0  # idle between phases: longer than the gateway's 2 s engine-reading staleness
PHASE_LIMIT_S = 90.0  # per strategy's measured phase, whatever the turn count
REQUEST_TIMEOUT_S = 60.0
_WORDS = (
    "balance engine latency queue token prefix cache slot stream answer question model request "
    "session history turn target pool capacity weight priority tier health drain retry budget "
    "window sample median score factor warm cold fleet node replica service route gateway relay "
    "chunk header body prompt system user assistant context length block hash memory throughput"
)
VOCABULARY = tuple(_WORDS.split())


@dataclass(frozen=True)
class Engine:
    """One simulated engine's speed and size."""

    name: str
    ttft_ms: float
    tpot_ms: float
    concurrency: int

    def full_load_turns_per_s(self) -> float:
        """Return turns/s with every slot busy (no prefix hits: the conservative rate)."""
        per_token_s = self.tpot_ms / 1000 * (1 + SLOWDOWN)
        return self.concurrency / (self.ttft_ms / 1000 + (MAX_TOKENS - 1) * per_token_s)

    def argv(self, port: int) -> list[str]:
        return [
            sys.executable, "-m", "serving.runtimes.simulator", "--port", str(port),
            "--model", "bench-model", "--ttft-ms", str(self.ttft_ms),
            "--tpot-ms", str(self.tpot_ms), "--concurrency", str(self.concurrency),
            "--slowdown", str(SLOWDOWN), "--prefix-cache-blocks", str(CACHE_BLOCKS),
            "--block-size", str(BLOCK_SIZE),
        ]  # fmt: skip


FLEET = (Engine("fast", 60, 8, 8), Engine("medium", 120, 15, 6), Engine("slow", 250, 30, 4))

# The closed-loop scenario (issue 11): slots 8/8/4 at 8/16/32 ms per token.
CLOSED_FLEET = (
    Engine("fast", 60, 8, 8),
    Engine("medium", 120, 16, 8),
    Engine("slow", 250, 32, 4),
)
CLOSED_TENANTS = 8
CLOSED_SYSTEM_WORDS = 480  # a tenant's long system prompt: 30 cache blocks
CLOSED_TURNS = 6
CLOSED_SESSIONS = 32
UNDERLOADED_SESSIONS = 16
CLOSED_MAX_TOKENS = 128
CLOSED_LIMIT_S = 120.0  # per phase, whatever is left unsent


@dataclass
class Turn:
    """One measured request."""

    target: str
    ttft_s: float | None
    tokens: int
    done_at: float
    error: str = ""
    started: float = 0.0  # when it was sent (perf_counter, as done_at)


@dataclass
class Phase:
    """One strategy's measured phase."""

    strategy: str
    turns: list[Turn] = field(default_factory=list)
    seconds: float = 0.0
    gateway_cpu_s: float = 0.0
    other_cpu_s: float = 0.0
    cache_hit: float = 0.0
    queued: float = 0.0
    queue_p99_ms: float = 0.0
    continuity: Counter[str] = field(default_factory=Counter)

    @property
    def ok(self) -> list[Turn]:
        return [turn for turn in self.turns if not turn.error]

    def ttft_ms(self, q: float) -> float:
        return percentile([turn.ttft_s * 1000 for turn in self.ok if turn.ttft_s is not None], q)

    def share(self, name: str) -> float:
        return sum(turn.target == name for turn in self.ok) / max(1, len(self.ok))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(VOCABULARY) for _ in range(count))


@dataclass(frozen=True)
class Plan:
    """The workload: every user's arrival offsets and message lengths, the same per strategy."""

    dues: list[list[float]]  # per user, when each turn is due (seconds from the phase's start)
    lengths: list[list[int]]  # per user, words in each user message

    @classmethod
    def build(cls, users: int, turns: int, rate: float, seed: int) -> Plan:
        # One Poisson stream split at random among the users is the same as a Poisson stream
        # per user, but ends after `turns` turns at rate × time, not at the slowest user's end.
        rng = random.Random(seed)
        dues: list[list[float]] = [[] for _ in range(users)]
        lengths: list[list[int]] = [[] for _ in range(users)]
        due = 0.0
        for _ in range(turns):
            due += rng.expovariate(rate)
            user = rng.randrange(users)
            dues[user].append(due)
            lengths[user].append(rng.randint(*USER_WORDS))
        return cls(dues, lengths)


class Load:
    """Streams chat turns at a pool through Nexus and keeps what the client saw."""

    def __init__(self, base: str, token: str, pool: str, salt: str) -> None:
        self.url = f"{base}/v1/chat/completions"
        self.headers = {"Authorization": f"Bearer {token}"}
        self.model = f"@pool/{pool}"
        self.salt = salt  # in every text: no strategy reuses another's cached prefixes
        self.max_tokens = MAX_TOKENS
        # The same system prompt for every conversation, like one app's: it is cached everywhere.
        self.system = f"bench {salt} " + words(random.Random(salt), SYSTEM_WORDS - 2)

    async def turn(
        self,
        session: aiohttp.ClientSession,
        session_id: str,
        messages: list[dict[str, str]],
        system: str | None = None,
    ) -> tuple[Turn, str]:
        """Send one streamed turn; return what was measured and the assistant's text.

        system: this conversation's system prompt (a tenant's), else the load's own.
        """
        body = {
            "model": self.model,
            "messages": [{"role": "system", "content": system or self.system}, *messages],
            "stream": True,
            "max_tokens": self.max_tokens,
        }
        headers = dict(self.headers, **{"X-Nexus-Session-Id": session_id})
        parts: list[str] = []
        first: float | None = None
        target, error = "", ""
        started = time.perf_counter()
        try:
            async with session.post(self.url, json=body, headers=headers) as response:
                target = response.headers.get("X-Nexus-Target", "")
                if response.status != 200:
                    error = f"HTTP {response.status}"
                    await response.read()
                else:
                    done = False
                    async for line in response.content:
                        if not line.startswith(b"data: "):
                            continue
                        data = line[6:].strip()
                        if data == b"[DONE]":
                            done = True
                            break
                        event = json.loads(data)
                        if "error" in event:
                            error = event["error"].get("code") or "stream error"
                            break
                        for choice in event.get("choices", ()):
                            content = choice.get("delta", {}).get("content")
                            if content:
                                if first is None:
                                    first = time.perf_counter()
                                parts.append(content)
                    if not done and not error:
                        error = "stream ended without [DONE]"
        except (TimeoutError, aiohttp.ClientError) as exc:
            error = type(exc).__name__
        ttft = first - started if first is not None else None
        turn = Turn(target, ttft, len(parts), time.perf_counter(), error, started)
        return turn, "".join(parts)

    async def user(
        self,
        session: aiohttp.ClientSession,
        index: int,
        dues: list[float],
        lengths: list[int],
        t0: float,
        deadline: float,
        into: list[Turn],
    ) -> None:
        """Hold conversations of CONVERSATION_TURNS turns, one after another."""
        rng = random.Random(f"{self.salt}/{index}")
        messages: list[dict[str, str]] = []
        for number, (due, length) in enumerate(zip(dues, lengths, strict=True)):
            if number % CONVERSATION_TURNS == 0:
                messages = []  # a new conversation, with its own session id
                session_id = f"{self.salt}-u{index}-c{number // CONVERSATION_TURNS}"
            await asyncio.sleep(max(0.0, t0 + due - time.perf_counter()))
            if time.perf_counter() >= deadline:
                return
            messages.append({"role": "user", "content": words(rng, length)})
            turn, answer = await self.turn(session, session_id, messages)
            into.append(turn)
            messages.append({"role": "assistant", "content": answer})


async def drive(load: Load, plan: Plan, limit_s: float) -> tuple[list[Turn], float]:
    """Run every user's plan against the pool; return the turns and the phase's seconds."""
    turns: list[Turn] = []
    connector = aiohttp.TCPConnector(limit=len(plan.dues) + 8)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        t0 = time.perf_counter()
        await asyncio.gather(
            *(
                load.user(session, i, dues, lengths, t0, t0 + limit_s, turns)
                for i, (dues, lengths) in enumerate(zip(plan.dues, plan.lengths, strict=True))
            )
        )
        return turns, time.perf_counter() - t0


async def warm_up(load: Load, slots: int) -> None:
    """Fill every slot twice with single-turn chats (unmeasured): each engine gets samples."""
    connector = aiohttp.TCPConnector(limit=slots + 8)
    async with aiohttp.ClientSession(connector=connector) as session:
        rng = random.Random(f"warm-{load.salt}")
        for round_ in range(2):
            await asyncio.gather(
                *(
                    load.turn(
                        session,
                        f"warm-{load.salt}-{round_}-{i}",
                        [{"role": "user", "content": words(rng, 40)}],
                    )
                    for i in range(slots)
                )
            )


def sim_stats(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/sim/stats", timeout=5) as response:
        return json.load(response)


def cache_counts(ports: list[int]) -> tuple[float, float]:
    """Return the fleet's prefix-cache (queried, hit) prompt tokens so far."""
    stats = [sim_stats(port) for port in ports]
    return (
        sum(s["prefix_cache_queried_tokens"] for s in stats),
        sum(s["prefix_cache_hit_tokens"] for s in stats),
    )


def history_writer(env: dict[str, str], tmp_path: Path) -> subprocess.Popen[bytes]:
    """Start the writer that takes the gateway's history off its Redis stream into the database
    (the phases read their queue waits and verdicts from there), beside the engines' CPU."""
    argv = [sys.executable, "manage.py", "runhistorywriter"]
    return spawn(argv, env, OTHER_CPU, tmp_path / "history-writer.log")


def history(phase: Phase, pool_slug: str, since: float) -> None:
    """Read queue waits and continuity decisions from Nexus's routing history (the ORM)."""
    from datetime import UTC, datetime

    from pools.models import RoutingRecord

    rows = RoutingRecord.objects.filter(
        pool__slug=pool_slug, created_at__gte=datetime.fromtimestamp(since, UTC)
    ).values_list("queue_wait_ms", "decision")
    waits = [wait for wait, _ in rows]
    phase.queued = sum(wait > 0 for wait in waits) / max(1, len(waits))
    phase.queue_p99_ms = percentile(waits, 0.99) if waits else 0.0
    for _, decision in rows:
        continuity = decision.get("continuity", "none")
        phase.continuity[continuity.split(":")[0]] += 1


def create_pools(ports: dict[str, int], fleet: tuple[Engine, ...] = FLEET) -> None:
    """One pool per strategy over the same engines, capacity_weight = the engine's slots."""
    from pools.models import Pool, Target

    for strategy in STRATEGIES:
        pool = Pool.objects.create(name=strategy, slug=strategy, strategy=strategy)
        for position, engine in enumerate(fleet):
            Target.objects.create(
                pool=pool, name=engine.name, position=position, model_id="bench-model",
                base_url=f"http://127.0.0.1:{ports[engine.name]}/v1",
                capacity_weight=engine.concurrency,
            )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=48)
    parser.add_argument("--turns", type=int, default=600, help="measured turns per strategy")
    parser.add_argument("--load", type=float, default=0.8, help="offered share of capacity")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--strict", action="store_true", help="exit 1 if Smart misses the bar")
    parser.add_argument("--scenario", choices=("open", "closed"), default="open")
    parser.add_argument(
        "--only",
        default=",".join(STRATEGIES),
        help="closed: the strategies to run, comma-separated",
    )
    args = parser.parse_args()
    if args.scenario == "closed":
        closed_main(tuple(args.only.split(",")))
        return
    # The load generator and the engines share CPU 1; the gateway has CPU 0 to itself.
    os.sched_setaffinity(0, OTHER_CPU)

    capacity = sum(engine.full_load_turns_per_s() for engine in FLEET)
    rate = args.load * capacity
    plan = Plan.build(args.users, args.turns, rate, args.seed)
    print("balancing quality: heterogeneous fleet, one pool per strategy, the same workload")
    for engine in FLEET:
        print(
            f"  engine {engine.name:<7} ttft {engine.ttft_ms:>4.0f} ms  tpot "
            f"{engine.tpot_ms:>3.0f} ms  concurrency {engine.concurrency}  "
            f"≈ {engine.full_load_turns_per_s():.1f} turns/s at full load"
        )
    print(
        f"  prefix cache {CACHE_BLOCKS} blocks of {BLOCK_SIZE} words per engine; slowdown "
        f"{SLOWDOWN}; no engine restarts: each strategy's texts are its own"
    )
    print(
        f"  workload: {args.turns} turns per strategy from {args.users} users (conversations of "
        f"{CONVERSATION_TURNS} turns), {MAX_TOKENS}-token streams, Poisson arrivals at "
        f"{rate:.1f} turns/s = {args.load:.0%} of the fleet's {capacity:.1f} turns/s",
        flush=True,
    )

    with tempfile.TemporaryDirectory(prefix="nexus-bench-") as tmp:
        tmp_path = Path(tmp)
        env = dict(os.environ, PYTHONUNBUFFERED="1", NEXUS_DATA_DIR=str(tmp_path))
        env.pop("DATABASE_URL", None)
        processes: list[subprocess.Popen[bytes]] = []
        try:
            ports: dict[str, int] = {}
            for engine in FLEET:
                port = ports[engine.name] = free_port()
                process = spawn(engine.argv(port), env, OTHER_CPU, tmp_path / f"{engine.name}.log")
                processes.append(process)
                wait_http(f"http://127.0.0.1:{port}/health", process)
            # Saving a pool pushes to the pages' channel layer: Redis must be up first.
            from nexus import embedded_redis
            from nexus.env import bundled_redis_socket

            processes.append(embedded_redis.start(bundled_redis_socket(tmp_path)))
            token = configure(tmp_path, {})  # Django, the database and a token; no pools
            create_pools(ports)
            port = free_port()
            gateway = spawn(
                daphne_argv(port, "nexus.asgi:application"), env, GATEWAY_CPU,
                tmp_path / "daphne.log",
            )  # fmt: skip
            processes.append(gateway)
            processes.append(history_writer(env, tmp_path))
            wait_http(f"http://127.0.0.1:{port}/healthz", gateway)
            helpers = [p.pid for p in processes if p is not gateway]
            phases = [
                run_phase(strategy, f"http://127.0.0.1:{port}", token, plan, ports, gateway.pid,
                          helpers)
                for strategy in STRATEGIES
            ]  # fmt: skip
        finally:
            for process in reversed(processes):
                stop(process)
    met = report(phases)
    if args.strict and not met:
        sys.exit(1)


def run_phase(
    strategy: str, base: str, token: str, plan: Plan, ports: dict[str, int], gateway_pid: int,
    helpers: list[int],
) -> Phase:  # fmt: skip
    """Warm up, measure and read back one strategy's phase."""
    load = Load(base, token, strategy, salt=strategy)
    asyncio.run(warm_up(load, sum(engine.concurrency for engine in FLEET)))
    time.sleep(PAUSE_S)
    phase = Phase(strategy)
    engine_ports = list(ports.values())
    queried, hits = cache_counts(engine_ports)
    gw_before = cpu_ms(gateway_pid)
    others_before = sum(cpu_ms(pid) for pid in helpers) + time.process_time() * 1000
    since = time.time()
    phase.turns, phase.seconds = asyncio.run(drive(load, plan, PHASE_LIMIT_S))
    phase.gateway_cpu_s = (cpu_ms(gateway_pid) - gw_before) / 1000
    others = sum(cpu_ms(pid) for pid in helpers) + time.process_time() * 1000
    phase.other_cpu_s = (others - others_before) / 1000
    queried_after, hits_after = cache_counts(engine_ports)
    phase.cache_hit = (hits_after - hits) / max(1.0, queried_after - queried)
    time.sleep(PAUSE_S)  # queues drain; the history is shipped and written within ~0.5 s
    history(phase, strategy, since)
    print(f"  {strategy}: {len(phase.turns)} turns in {phase.seconds:.1f} s", flush=True)
    return phase


def report(phases: list[Phase]) -> bool:
    """Print the table and Smart's ratios; return whether Smart met the bar."""
    names = "/".join(engine.name for engine in FLEET)
    print(
        f"{'strategy':<12}{'turns':>6}{'err':>5}{'p50 TTFT':>10}{'p90 TTFT':>10}{'p99 TTFT':>10}"
        f"{'turns/s':>9}{'tok/s':>7}  {'share ' + names:<26}{'queued':>7}{'queue p99':>10}"
        f"{'cache':>7}{'gw CPU':>8}{'cpu1':>6}"
    )
    for phase in phases:
        ok = phase.ok
        seconds = max(phase.seconds, 1e-9)
        share = "/".join(f"{phase.share(engine.name):.0%}" for engine in FLEET)
        print(
            f"{phase.strategy:<12}{len(phase.turns):>6}{len(phase.turns) - len(ok):>5}"
            f"{phase.ttft_ms(0.5):>8.0f}ms{phase.ttft_ms(0.9):>8.0f}ms{phase.ttft_ms(0.99):>8.0f}ms"
            f"{len(ok) / seconds:>9.1f}{sum(t.tokens for t in ok) / seconds:>7.0f}  {share:<26}"
            f"{phase.queued:>7.0%}{phase.queue_p99_ms:>8.0f}ms{phase.cache_hit:>7.0%}"
            f"{phase.gateway_cpu_s / seconds:>8.0%}{phase.other_cpu_s / seconds:>6.0%}"
        )
    errors = Counter(turn.error for phase in phases for turn in phase.turns if turn.error)
    if errors:
        print("errors: " + ", ".join(f"{error} ×{n}" for error, n in errors.most_common()))
    by_name = {phase.strategy: phase for phase in phases}
    smart = by_name["smart"].ttft_ms(0.9)
    continuity = by_name["smart"].continuity
    print("smart continuity decisions: " + ", ".join(f"{k} {v}" for k, v in continuity.items()))
    rr, lb = by_name["round_robin"].ttft_ms(0.9), by_name["least_busy"].ttft_ms(0.9)
    print(f"smart p90 TTFT = {smart / rr:.2f} × round_robin, {smart / lb:.2f} × least_busy")
    met = smart < rr and smart < lb
    verdict = "met" if met else "MISSED"
    print(f"bar (smart p90 TTFT below round_robin's and least_busy's): {verdict}")
    return met


# --- The heterogeneous closed loop (issue 11) ---------------------------------------------------


@dataclass
class ClosedPhase:
    """One strategy's closed-loop run: each session's turns, in order."""

    strategy: str
    sessions: list[list[Turn]] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)  # request start to last chunk
    seconds: float = 0.0
    cache_hit: float = 0.0
    woken: Counter[str] = field(default_factory=Counter)
    continuity: Counter[str] = field(default_factory=Counter)

    @property
    def turns(self) -> list[Turn]:
        return [turn for session in self.sessions for turn in session]

    def ttft_ms(self, q: float) -> float:
        return percentile([t.ttft_s * 1000 for t in self.turns if t.ttft_s is not None], q)

    def same_engine(self) -> float:
        """Return the share of follow-up turns served where the previous turn was."""
        pairs = [
            (before.target, after.target)
            for session in self.sessions
            for before, after in zip(session, session[1:], strict=False)
            if not before.error and not after.error
        ]
        return sum(a == b for a, b in pairs) / max(1, len(pairs))

    def all_active_tokens_per_s(self) -> float:
        """Return tokens/s while every session was still running: from the first turn sent to
        the first session's end.

        After that the loop thins out (sessions end seconds apart, the last ones alone on the
        fleet), which no routing choice refills; this is the rate the fleet's ceiling compares
        with. Each turn's tokens count in proportion to its decode time inside that window.
        """
        sessions = [session for session in self.sessions if session]
        if not sessions:
            return 0.0
        start = min(session[0].started for session in sessions)
        end = min(session[-1].done_at for session in sessions)
        tokens = 0.0
        for turn in self.turns:
            if turn.error or turn.ttft_s is None:
                continue
            first = turn.started + turn.ttft_s
            span = turn.done_at - first
            inside = min(turn.done_at, end) - max(first, start)
            if inside > 0:
                tokens += turn.tokens * (inside / span if span > 0 else 1.0)
        return tokens / max(end - start, 1e-9)

    def ends_spread_s(self) -> float:
        """Return the time from the first session's end to the last's: the thinning tail."""
        ends = [session[-1].done_at for session in self.sessions if session]
        return max(ends) - min(ends) if ends else 0.0

    def slow_sessions(self) -> int:
        """Return how many sessions had a mean TTFT over 2 s."""
        slow = 0
        for session in self.sessions:
            ttfts = [turn.ttft_s for turn in session if turn.ttft_s is not None]
            if ttfts and sum(ttfts) / len(ttfts) > 2.0:
                slow += 1
        return slow


async def closed_session(
    load: Load,
    http: aiohttp.ClientSession,
    tenant_system: str,
    index: int,
    deadline: float,
    into: ClosedPhase,
) -> None:
    """Send one session's turns back to back: each as soon as the previous one ended."""
    rng = random.Random(f"{load.salt}/closed/{index}")
    await asyncio.sleep(rng.uniform(0.0, 0.5))  # sessions do not all start in the same instant
    messages: list[dict[str, str]] = []
    turns: list[Turn] = []
    into.sessions.append(turns)
    for _ in range(CLOSED_TURNS):
        if time.perf_counter() >= deadline:
            return
        messages.append({"role": "user", "content": words(rng, rng.randint(*USER_WORDS))})
        started = time.perf_counter()
        turn, answer = await load.turn(
            http, f"{load.salt}-s{index}", messages, system=tenant_system
        )
        into.latencies_s.append(turn.done_at - started)
        turns.append(turn)
        messages.append({"role": "assistant", "content": answer})


def run_closed_phase(
    strategy: str, base: str, token: str, ports: dict[str, int], sessions: int
) -> ClosedPhase:
    """Warm up, then run `sessions` closed-loop sessions against the strategy's pool."""
    salt = f"{strategy}-{sessions}"
    load = Load(base, token, strategy, salt=salt)
    load.max_tokens = CLOSED_MAX_TOKENS
    asyncio.run(warm_up(load, sum(engine.concurrency for engine in CLOSED_FLEET)))
    time.sleep(PAUSE_S)
    tenants = [
        f"tenant {salt} {tenant} " + words(random.Random(f"{salt}/{tenant}"), CLOSED_SYSTEM_WORDS)
        for tenant in range(CLOSED_TENANTS)
    ]
    phase = ClosedPhase(strategy)
    engine_ports = list(ports.values())
    queried, hits = cache_counts(engine_ports)
    since = time.time()

    async def drive_all() -> float:
        connector = aiohttp.TCPConnector(limit=sessions + 8)
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            t0 = time.perf_counter()
            await asyncio.gather(
                *(
                    closed_session(
                        load, http, tenants[i % CLOSED_TENANTS], i, t0 + CLOSED_LIMIT_S, phase
                    )
                    for i in range(sessions)
                )
            )
            return time.perf_counter() - t0

    phase.seconds = asyncio.run(drive_all())
    queried_after, hits_after = cache_counts(engine_ports)
    phase.cache_hit = (hits_after - hits) / max(1.0, queried_after - queried)
    time.sleep(1.0)  # the history is shipped and written within ~0.5 s
    closed_history(phase, strategy, since)
    print(f"  {strategy} ({sessions} sessions): {len(phase.turns)} turns in "
          f"{phase.seconds:.1f} s", flush=True)  # fmt: skip
    return phase


def closed_history(phase: ClosedPhase, pool_slug: str, since: float) -> None:
    """Read which rule woke waiters and Smart's continuity verdicts from the history."""
    from datetime import UTC, datetime

    from pools.models import RoutingRecord

    records = RoutingRecord.objects.filter(
        pool__slug=pool_slug, created_at__gte=datetime.fromtimestamp(since, UTC)
    )
    dump = os.environ.get("NEXUS_BENCH_DUMP")
    if dump:
        # Every record's explanation, for reading why a turn went where it did.
        rows = records.values("target_name", "queue_wait_ms", "ttft_ms", "total_ms", "decision")
        with open(dump, "a") as out:
            for row in rows:
                out.write(json.dumps({"phase": phase.strategy, "sessions": len(phase.sessions),
                                      **row}, default=str) + "\n")  # fmt: skip
    decisions = records.values_list("decision", flat=True)
    for decision in decisions:
        woken = decision.get("woken_by")
        if woken:
            # "conversation on fast, ahead of…", "sticky target fast freed a slot…"
            phase.woken[
                "sticky wait" if woken.startswith("sticky") else woken.split(" on ")[0]
            ] += 1
        continuity = decision.get("continuity", "none")
        if continuity.startswith("waited"):
            phase.continuity["waited and kept"] += 1
        elif "after waiting" in continuity:
            phase.continuity["waited in vain"] += 1
        else:
            phase.continuity[continuity.split(":")[0]] += 1


def closed_report(loaded: list[ClosedPhase], light: list[ClosedPhase]) -> None:
    """Print the table per strategy, Smart's bars and its ratios to the others."""
    print(
        f"{'strategy':<12}{'turns':>6}{'err':>5}{'tok/s':>7}{'all on':>7}{'p50 TTFT':>10}"
        f"{'p90 TTFT':>10}"
        f"{'p99 TTFT':>10}{'mean lat':>10}{'cache':>7}{'same eng':>9}{'>2s sess':>9}{'tail':>8}"
    )
    for phase in loaded + light:
        turns = phase.turns
        ok = [turn for turn in turns if not turn.error]
        tokens = sum(turn.tokens for turn in ok)
        mean = sum(phase.latencies_s) / max(1, len(phase.latencies_s))
        name = phase.strategy + ("" if phase in loaded else " (16)")
        print(
            f"{name:<12}{len(turns):>6}{len(turns) - len(ok):>5}"
            f"{tokens / max(phase.seconds, 1e-9):>7.0f}{phase.all_active_tokens_per_s():>7.0f}"
            f"{phase.ttft_ms(0.5):>8.0f}ms{phase.ttft_ms(0.9):>8.0f}ms{phase.ttft_ms(0.99):>8.0f}ms"
            f"{mean * 1000:>8.0f}ms{phase.cache_hit:>7.0%}{phase.same_engine():>9.0%}"
            f"{phase.slow_sessions():>9}{phase.ends_spread_s():>7.1f}s"
        )
    for phase in loaded:
        if phase.strategy == "smart":
            print("smart woken by: " + ", ".join(f"{k} {v}" for k, v in phase.woken.items()))
            print("smart continuity: " + ", ".join(f"{k} {v}" for k, v in phase.continuity.items()))
    by_name = {phase.strategy: phase for phase in light}
    if "smart" in by_name and "least_busy" in by_name:
        smart, busy = by_name["smart"], by_name["least_busy"]
        mean_smart = sum(smart.latencies_s) / max(1, len(smart.latencies_s))
        mean_busy = sum(busy.latencies_s) / max(1, len(busy.latencies_s))
        print(
            f"under-loaded: smart p90 TTFT = {smart.ttft_ms(0.9) / busy.ttft_ms(0.9):.2f} × "
            f"least_busy, mean latency = {mean_smart / mean_busy:.2f} × least_busy"
        )


def closed_main(strategies: tuple[str, ...]) -> None:
    """Run the closed-loop scenario for every strategy, then the under-loaded one."""
    os.sched_setaffinity(0, OTHER_CPU)
    print("balancing quality, closed loop: 8 tenants, 32 sessions of 6 turns, back to back")
    ceiling = sum(
        engine.concurrency / (engine.tpot_ms / 1000 * (1 + SLOWDOWN)) for engine in CLOSED_FLEET
    )
    print(f"  the fleet's ceiling: {ceiling:,.0f} tok/s (every slot decoding, prompts free)")
    for engine in CLOSED_FLEET:
        print(
            f"  engine {engine.name:<7} ttft {engine.ttft_ms:>4.0f} ms  tpot "
            f"{engine.tpot_ms:>3.0f} ms  concurrency {engine.concurrency}"
        )
    with tempfile.TemporaryDirectory(prefix="nexus-bench-") as tmp:
        tmp_path = Path(tmp)
        env = dict(os.environ, PYTHONUNBUFFERED="1", NEXUS_DATA_DIR=str(tmp_path))
        env.pop("DATABASE_URL", None)
        processes: list[subprocess.Popen[bytes]] = []
        try:
            ports: dict[str, int] = {}
            for engine in CLOSED_FLEET:
                port = ports[engine.name] = free_port()
                process = spawn(engine.argv(port), env, OTHER_CPU, tmp_path / f"{engine.name}.log")
                processes.append(process)
                wait_http(f"http://127.0.0.1:{port}/health", process)
            from nexus import embedded_redis
            from nexus.env import bundled_redis_socket

            processes.append(embedded_redis.start(bundled_redis_socket(tmp_path)))
            token = configure(tmp_path, {})
            create_pools(ports, CLOSED_FLEET)
            port = free_port()
            gateway = spawn(
                daphne_argv(port, "nexus.asgi:application"), env, GATEWAY_CPU,
                tmp_path / "daphne.log",
            )  # fmt: skip
            processes.append(gateway)
            processes.append(history_writer(env, tmp_path))
            wait_http(f"http://127.0.0.1:{port}/healthz", gateway)
            base = f"http://127.0.0.1:{port}"
            loaded = [
                run_closed_phase(strategy, base, token, ports, CLOSED_SESSIONS)
                for strategy in strategies
            ]
            light = [
                run_closed_phase(strategy, base, token, ports, UNDERLOADED_SESSIONS)
                for strategy in ("smart", "least_busy")
                if strategy in strategies
            ]
        finally:
            for process in reversed(processes):
                stop(process)
    closed_report(loaded, light)


if __name__ == "__main__":
    main()
