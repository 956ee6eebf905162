"""Behaviour model: model loading, admission, prefix cache, token pacing, faults and counters."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import random
import struct
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from enum import StrEnum
from types import TracebackType
from typing import Any

from .config import Faults, SimulatorConfig

# A token is one of these words: short, distinct and JSON-safe without escaping.
_WORDS = """
the of and to in is it that was for on are with as at be this have from or one had by word
but not what all were we when your can said there use an each which she do how their if will
up other about out many then them these so some her would make like him into time has look
two more write go see number no way could people my than first water been call who oil its
now find long down day did get come made may part over new sound take only little work know
place year live me back give most very after thing our just name good sentence man think say
great where help through much before line right too mean old any same tell boy follow came
want show also around form three small set put end does another well large must big even
such because turn here why ask went men read need land different home us move try kind hand
picture again change off play spell air away animal house point
"""
VOCABULARY: tuple[str, ...] = tuple(_WORDS.split())

# Share of the TTFT that a fully cached prompt saves (prefill skipped, scheduling remains).
PREFIX_HIT_TTFT_SAVING = 0.8


def generate_words(seed: int, prompt_key: str, count: int) -> list[str]:
    """Return ``count`` words chosen by a PRNG seeded from ``seed`` and the prompt."""
    digest = hashlib.blake2b(f"{seed}\n{prompt_key}".encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "little")).choices(VOCABULARY, k=count)


def embed(model: str, text: str, dimensions: int) -> list[float]:
    """Return a unit vector derived from a hash of the model id and the text."""
    raw = hashlib.shake_256(f"{model}\n{text}".encode()).digest(2 * dimensions)
    values = [v - 32767.5 for v in struct.unpack(f"<{dimensions}H", raw)]
    norm = math.sqrt(math.fsum(v * v for v in values))
    return [v / norm for v in values]


class PrefixCache:
    """LRU of prompt blocks, each keyed by a hash of the whole prompt prefix it ends."""

    __slots__ = ("_blocks", "_capacity", "_block_size", "queried_tokens", "hit_tokens")

    def __init__(self, capacity_blocks: int, block_size: int) -> None:
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self._capacity = capacity_blocks
        self._block_size = block_size
        self.queried_tokens = 0
        self.hit_tokens = 0

    @property
    def blocks(self) -> int:
        """Return the number of cached blocks."""
        return len(self._blocks)

    @property
    def usage(self) -> float:
        """Return the cache fill in 0..1."""
        return len(self._blocks) / self._capacity if self._capacity else 0.0

    def admit(self, tokens: Sequence[str]) -> tuple[int, int]:
        """Cache the prompt's full blocks; return (blocks already cached from the start, blocks).

        Like vLLM, only a run of hits from the first block counts: a block is reusable
        only when everything before it is too.
        """
        self.queried_tokens += len(tokens)
        hits, total = self._cache(tokens)
        self.hit_tokens += hits * self._block_size
        return hits, total

    def keep(self, tokens: Sequence[str]) -> None:
        """Cache the full blocks of a finished sequence, prompt and answer, without a query.

        vLLM's prefix caching keeps the blocks a request filled while generating too, so the
        next turn of a conversation, whose prompt repeats the answer, finds them.
        """
        self._cache(tokens)

    def _cache(self, tokens: Sequence[str]) -> tuple[int, int]:
        size = self._block_size
        total = len(tokens) // size
        if not total or not self._capacity:
            return 0, total
        cache = self._blocks
        prefix_hash = 0
        hits = 0
        for start in range(0, total * size, size):
            # Python's hash is salted per process, which is fine for an in-process cache.
            prefix_hash = hash((prefix_hash, *tokens[start : start + size]))
            if prefix_hash in cache:
                cache.move_to_end(prefix_hash)
                if hits * size == start:
                    hits += 1
            else:
                cache[prefix_hash] = None
                if len(cache) > self._capacity:
                    cache.popitem(last=False)
        return hits, total


class ModelState(StrEnum):
    """Whether the simulated weights are in memory."""

    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"


class Admission:
    """One request holding a generation slot for the duration of an ``async with``."""

    __slots__ = (
        "_engine",
        "_prompts",
        "ttft_s",
        "prefix_hit_fraction",
        "completion_tokens",
        "outputs",
    )

    def __init__(self, engine: Engine, prompts: Sequence[Sequence[str]]) -> None:
        self._engine = engine
        self._prompts = prompts
        self.ttft_s = 0.0
        self.prefix_hit_fraction = 0.0
        self.completion_tokens = 0
        # Each prompt's answer, set by whoever generates it; cached with its prompt on success.
        self.outputs: Sequence[Sequence[str]] = ()

    async def __aenter__(self) -> Admission:
        engine = self._engine
        engine.waiting += 1
        try:
            if not engine.loaded.is_set():
                await engine.wait_loaded()
            await engine.slots.acquire()
        finally:
            engine.waiting -= 1
        engine.running += 1
        hits = blocks = 0
        for tokens in self._prompts:
            engine.prompt_tokens_total += len(tokens)
            prompt_hits, prompt_blocks = engine.prefix_cache.admit(tokens)
            hits += prompt_hits
            blocks += prompt_blocks
        self.prefix_hit_fraction = hits / blocks if blocks else 0.0
        self.ttft_s = engine.ttft_s * (1 - PREFIX_HIT_TTFT_SAVING * self.prefix_hit_fraction)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        engine = self._engine
        engine.running -= 1
        engine.slots.release()
        engine.last_active = time.monotonic()
        engine.generation_tokens_total += self.completion_tokens
        if exc_type is None:
            engine.requests_completed += 1
            for prompt, output in zip(self._prompts, self.outputs, strict=False):
                engine.prefix_cache.keep([*prompt, *output])
        elif issubclass(exc_type, asyncio.CancelledError | ConnectionError):
            engine.requests_cancelled += 1


class Engine:
    """The simulated inference engine shared by all requests of one process."""

    def __init__(self, config: SimulatorConfig) -> None:
        self.config = config
        self.faults = replace(config.faults)
        self.ttft_s = config.ttft_ms / 1000
        self.slots = asyncio.Semaphore(config.concurrency)
        self.prefix_cache = PrefixCache(config.prefix_cache_blocks, config.block_size)
        self.loaded = asyncio.Event()
        self.last_active = time.monotonic()
        self.state = ModelState.UNLOADED
        self.loads = 0
        self.running = 0
        self.waiting = 0
        self.hanging = 0
        self.requests_total = 0
        self.requests_completed = 0
        self.requests_rejected = 0
        self.requests_cancelled = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self._tpot_s = config.tpot_ms / 1000
        self._slowdown_per_running = config.slowdown / config.concurrency
        self._fault_rng = random.Random(config.seed)
        self._slow_until = time.monotonic() + self.faults.slow_start_s
        # A cluster main waiting for its workers says so here; it serves nothing meanwhile.
        self.cluster_waiting: str | None = None
        self._load_task: asyncio.Task[None] | None = None
        self._idle_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Begin the initial model load and the idle-unload watch."""
        if self.config.cold_start_s > 0:
            self._begin_load()
        else:
            self.state = ModelState.LOADED
            self.loaded.set()
        if self.config.unload_after_idle_s > 0:
            self._idle_task = asyncio.create_task(self._unload_when_idle())

    async def close(self) -> None:
        """Stop background tasks."""
        for task in (self._load_task, self._idle_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def admit(self, prompts: Sequence[Sequence[str]]) -> Admission:
        """Return a context manager that waits for the model and a slot, then holds the slot."""
        return Admission(self, prompts)

    def record_embeddings(self, prompt_tokens: int) -> None:
        """Count a served embeddings request."""
        self.prompt_tokens_total += prompt_tokens
        self.requests_completed += 1

    def token_interval(self) -> float:
        """Return the current time per output token, which grows with the running requests."""
        return self._tpot_s * (1 + self._slowdown_per_running * self.running)

    async def wait_loaded(self) -> None:
        """Wait until the model is loaded, starting a load if it was unloaded."""
        if self.state is ModelState.UNLOADED:
            self._begin_load()
        await self.loaded.wait()

    def _begin_load(self) -> None:
        self.state = ModelState.LOADING
        self._load_task = asyncio.create_task(self._load())

    async def _load(self) -> None:
        await asyncio.sleep(self.config.cold_start_s)
        self.loads += 1
        self.state = ModelState.LOADED
        self.last_active = time.monotonic()
        self.loaded.set()

    async def _unload_when_idle(self) -> None:
        idle_s = self.config.unload_after_idle_s
        # Poll at a tenth of the idle time so unloading lags the deadline by at most 10 %.
        interval = min(max(idle_s / 10, 0.01), 1.0)
        while True:
            await asyncio.sleep(interval)
            idle = self.state is ModelState.LOADED and not self.running and not self.waiting
            if idle and time.monotonic() - self.last_active >= idle_s:
                self.state = ModelState.UNLOADED
                self.loaded.clear()

    def starting_up(self) -> bool:
        """Return whether the slow-start window is open or the cluster is not formed yet."""
        return self.cluster_waiting is not None or time.monotonic() < self._slow_until

    def health_problem(self) -> str | None:
        """Return why /health should fail, or None when healthy."""
        if self.faults.fail_health:
            return "unhealthy"
        if self.state is ModelState.LOADING:
            return "loading"
        if self.cluster_waiting is not None:
            return self.cluster_waiting
        if self.starting_up():
            return "starting"
        return None

    def injected_error(self) -> int | None:
        """Return the status to fail this request with, drawn from the seeded fault PRNG."""
        faults = self.faults
        if faults.error_rate and self._fault_rng.random() < faults.error_rate:
            return self._fault_rng.choice(faults.error_codes)
        return None

    async def hang(self) -> None:
        """Never return; the caller's task ends only by cancellation (client gone, shutdown)."""
        self.hanging += 1
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            self.hanging -= 1

    def update_faults(self, update: dict[str, Any]) -> None:
        """Apply validated fault fields; a new ``slow_start_s`` restarts the window now."""
        for name, value in update.items():
            if name in Faults.__dataclass_fields__:
                setattr(self.faults, name, value)
        if "slow_start_s" in update:
            self._slow_until = time.monotonic() + update["slow_start_s"]

    def clear_faults(self) -> None:
        """Remove every fault, keeping the configured error codes."""
        self.faults = Faults(error_codes=self.config.faults.error_codes)
        self._slow_until = 0.0

    def fault_state(self) -> dict[str, Any]:
        """Return the faults, with ``slow_start_s`` as the seconds of slow start left."""
        state = self.faults.as_dict()
        state["slow_start_s"] = round(max(self._slow_until - time.monotonic(), 0.0), 3)
        return state

    def stats(self) -> dict[str, Any]:
        """Return counters for tests and debugging."""
        cache = self.prefix_cache
        return {
            "model": self.config.model,
            # What it runs at once (--concurrency): pools read it to check a target's capacity.
            "concurrency": self.config.concurrency,
            "model_state": self.state.value,
            "loads": self.loads,
            "requests_total": self.requests_total,
            "requests_running": self.running,
            "requests_waiting": self.waiting,
            "requests_hanging": self.hanging,
            "requests_completed": self.requests_completed,
            "requests_rejected": self.requests_rejected,
            "requests_cancelled": self.requests_cancelled,
            "prompt_tokens_total": self.prompt_tokens_total,
            "generation_tokens_total": self.generation_tokens_total,
            "prefix_cache_queried_tokens": cache.queried_tokens,
            "prefix_cache_hit_tokens": cache.hit_tokens,
            "prefix_cache_blocks": cache.blocks,
            "prefix_cache_usage": cache.usage,
        }
