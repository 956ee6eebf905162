"""Each gateway process's live state, published to Redis about once a second for every process.

A gateway process keeps its live state in memory (in-flight counts, circuits, latency, engine
loads, queues). So that any process (the admin API's dry run, the Live and pool pages) can see
it, each gateway process publishes a compact reading of it: one key per process,
`<NEXUS_REDIS_PREFIX>:gateway:live:<process>`, with a short TTL, and an index of the processes
scored by when their key expires. A process that stops (or is killed) drops out within the TTL.

Publishing runs in its own background task, never on the request path; a Redis outage is
logged once, when it starts, and once when it ends, and changes nothing else. `pools.live` reads
the readings back and merges them.

Where a conversation or a prompt prefix went last is too much to publish (up to 150,000 keys
per process), so the same task answers questions about single keys instead: a reader pushes
`{"s": session key, "x": prefix key, "r": reply key}` onto each live process's question list
(`<reading key>:ask`), and each process pushes `{"s": target id, "x": target id}` (null when
unknown) onto the reply key. Between publications the task waits on that list, so an answer
comes at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from pools.balancer.health import CircuitReport
from pools.gateway import counters
from pools.gateway.counters import PoolCounts

log = logging.getLogger(__name__)

PUBLISH_INTERVAL_S = 1.0
# A reading outlives a few missed publications (a busy loop, a slow Redis call), not more.
READING_TTL_S = 5.0
REDIS_TIMEOUT_S = 1.0
FORMAT_VERSION = 2
# A reply list outlives the reader's wait a little; a question list outlives a dead process's
# last reading, so that nothing stays behind in Redis.
REPLY_TTL_S = 10

# (session key, prefix key) -> (the conversation's target, the prefix's target), None if unknown
Affinity = Callable[[str | None, str | None], tuple[int | None, int | None]]


@dataclass(frozen=True, slots=True)
class TargetReading:
    """What one gateway process knows about a target beyond its configuration."""

    in_flight: int  # the ledger's count (shared by every process with the Redis ledger)
    circuit: CircuitReport | None = None  # None: the circuit lets requests through
    ttft_s: float | None = None  # latency EWMAs, None before the first sample
    tpot_s: float | None = None
    error_rate: float = 0.0
    last_served_at: float | None = None  # epoch seconds
    engine_running: int | None = None  # the engine's own counts from /metrics, when fresh
    engine_waiting: int | None = None
    engine_read_at: float | None = None  # epoch seconds
    # The in-flight count this process had on the target when the engine was read (the
    # balancer's `engine_counted`): the engine's count beyond it is other clients' load.
    engine_counted: int | None = None


@dataclass(frozen=True, slots=True)
class GatewayReadings:
    """One gateway process's live state at one moment."""

    process: str
    published_at: float  # epoch seconds
    shared_ledger: bool  # in-flight counts are the Redis ledger's, the same in every process
    targets: dict[int, TargetReading]
    queued: dict[int, int]  # requests waiting, by pool id
    turns: dict[int, int]  # round-robin counters, by pool id


def process_name() -> str:
    """Return a name for this process, unique across machines and restarts."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def index_key(prefix: str) -> str:
    """Return the key of the index of live gateway processes."""
    return f"{prefix}:gateway:live"


def reading_key(prefix: str, process: str) -> str:
    """Return the key of one process's reading."""
    return f"{index_key(prefix)}:{process}"


def question_key(prefix: str, process: str) -> str:
    """Return the key of the list one process takes affinity questions from."""
    return f"{reading_key(prefix, process)}:ask"


def encode(readings: GatewayReadings) -> bytes:
    """Return the reading as compact JSON: positional lists per target, no repeated names."""
    targets: dict[str, list[Any]] = {}
    for target_id, target in readings.targets.items():
        circuit = target.circuit
        targets[str(target_id)] = [
            target.in_flight,
            _rounded(target.ttft_s, 6),
            _rounded(target.tpot_s, 6),
            round(target.error_rate, 4),
            _rounded(target.last_served_at, 3),
            target.engine_running,
            target.engine_waiting,
            _rounded(target.engine_read_at, 3),
            target.engine_counted,
            None
            if circuit is None
            else [int(circuit.probe_failing), circuit.cause, _rounded(circuit.trial_in_s, 3)],
        ]
    document = {
        "v": FORMAT_VERSION,
        "p": readings.process,
        "t": round(readings.published_at, 3),
        "s": int(readings.shared_ledger),
        "g": targets,
        "q": {str(pool_id): n for pool_id, n in readings.queued.items()},
        "r": {str(pool_id): n for pool_id, n in readings.turns.items()},
    }
    return json.dumps(document, separators=(",", ":")).encode()


def _rounded(value: float | None, digits: int) -> float | None:
    # Seconds to the microsecond, times to the millisecond: more digits only cost bytes.
    return None if value is None else round(value, digits)


def decode(data: bytes | str) -> GatewayReadings:
    """Return the reading `encode` wrote; raise ValueError when it is not one."""
    try:
        document = json.loads(data)
        if document["v"] != FORMAT_VERSION:
            raise ValueError(f"unknown live-state format {document['v']!r}")
        targets = {}
        for target_id, fields in document["g"].items():
            (in_flight, ttft, tpot, error_rate, served, *engine, circuit) = fields
            running, waiting, read_at, counted = engine
            targets[int(target_id)] = TargetReading(
                in_flight=int(in_flight),
                circuit=None
                if circuit is None
                else CircuitReport(
                    probe_failing=bool(circuit[0]), cause=circuit[1], trial_in_s=circuit[2]
                ),
                ttft_s=ttft,
                tpot_s=tpot,
                error_rate=float(error_rate),
                last_served_at=served,
                engine_running=running,
                engine_waiting=waiting,
                engine_read_at=read_at,
                engine_counted=counted,
            )
        return GatewayReadings(
            process=str(document["p"]),
            published_at=float(document["t"]),
            shared_ledger=bool(document["s"]),
            targets=targets,
            queued={int(pool_id): int(n) for pool_id, n in document["q"].items()},
            turns={int(pool_id): int(n) for pool_id, n in document["r"].items()},
        )
    except (KeyError, TypeError, IndexError, AttributeError) as exc:
        raise ValueError(f"not a live-state reading: {exc!r}") from None


class Publisher:
    """Publish one process's readings about once a second, until closed."""

    def __init__(
        self,
        redis_url: str,
        prefix: str,
        *,
        interval_s: float = PUBLISH_INTERVAL_S,
        ttl_s: float = READING_TTL_S,
    ) -> None:
        self.process = process_name()
        self.interval_s = interval_s
        self._ttl_s = ttl_s
        self._index = index_key(prefix)
        self._key = reading_key(prefix, self.process)
        self._questions = question_key(prefix, self.process)
        # The task waits on its question list for up to an interval: reads may take that long.
        self._redis = aioredis.Redis.from_url(
            redis_url,
            socket_timeout=interval_s + REDIS_TIMEOUT_S,
            socket_connect_timeout=REDIS_TIMEOUT_S,
        )
        self._prefix = prefix
        self._task: asyncio.Task[None] | None = None
        # Gateway processes publishing at the last publication, this one included; the ledger
        # divides capacity by it while Redis is away.
        self.live_processes = 1

    def start(
        self,
        read: Callable[[str], GatewayReadings],
        affinity: Affinity,
        take_counts: Callable[[], dict[int, PoolCounts]] = dict,
    ) -> None:
        """Publish `read(process)` and add `take_counts()` every interval, and answer questions
        with `affinity`."""
        if self._task is None:
            self._task = asyncio.create_task(self._publish_forever(read, affinity, take_counts))

    async def publish(
        self, readings: GatewayReadings, counts: dict[int, PoolCounts] | None = None
    ) -> None:
        """Write the reading and list the process as live until its TTL, and add the counts to
        their pools' current buckets (pools.gateway.counters); raise RedisError."""
        expires = readings.published_at + self._ttl_s
        bucket = counters.bucket_of(readings.published_at)
        async with self._redis.pipeline(transaction=False) as pipe:
            for pool_id, pool_counts in (counts or {}).items():
                key = counters.counts_key(self._prefix, pool_id, bucket)
                for name, n in pool_counts.fields().items():
                    pipe.hincrby(key, name, n)
                pipe.expire(key, counters.KEEP_S)
            pipe.set(self._key, encode(readings), px=int(self._ttl_s * 1000))
            pipe.zadd(self._index, {self.process: expires})
            # Processes that stopped without a word leave the index once their reading expired.
            pipe.zremrangebyscore(self._index, "-inf", readings.published_at)
            pipe.zcard(self._index)
            *_, live = await pipe.execute()
        self.live_processes = max(1, int(live))

    async def aclose(self) -> None:
        """Stop publishing and withdraw the reading, so readers stop counting this process."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.delete(self._key, self._questions)
                pipe.zrem(self._index, self.process)
                await pipe.execute()
        except (RedisError, OSError):
            pass  # it expires with its TTL
        await self._redis.aclose()

    async def _publish_forever(
        self,
        read: Callable[[str], GatewayReadings],
        affinity: Affinity,
        take_counts: Callable[[], dict[int, PoolCounts]],
    ) -> None:
        # An outage is logged when it starts and when it ends, not at every attempt.
        lost = False
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            try:
                if loop.time() >= due:
                    due = loop.time() + self.interval_s
                    # Counts of a publication that fails are lost: Live shows a dip, not a lie.
                    await self.publish(read(self.process), take_counts())
                    if lost:
                        log.info("gateway live state published again")
                        lost = False
                # Until the next publication, answer whatever is asked.
                asked = await self._redis.blpop(
                    [self._questions], timeout=max(0.01, due - loop.time())
                )
                if asked is not None:
                    await self._answer(asked[1], affinity)
            except (RedisError, OSError):
                if not lost:
                    log.warning("gateway live state not published (Redis unreachable)")
                    lost = True
                await asyncio.sleep(self.interval_s)
            except Exception:
                log.exception("gateway live state could not be read; retrying")
                await asyncio.sleep(self.interval_s)

    async def _answer(self, question: bytes | str, affinity: Affinity) -> None:
        try:
            asked = json.loads(question)
            session, prefix, reply = asked["s"], asked["x"], str(asked["r"])
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring a malformed affinity question")
            return
        sticky, prefixed = affinity(session, prefix)
        answer = json.dumps({"s": sticky, "x": prefixed}, separators=(",", ":"))
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.rpush(reply, answer)
            pipe.expire(reply, REPLY_TTL_S)
            await pipe.execute()
