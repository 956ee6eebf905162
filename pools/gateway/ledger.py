"""The load ledger: in-flight requests per target, in this process or shared through Redis.

Every granted acquire hands out a `Lease`; releasing it is the only way to give the slot back, and
releasing it twice changes nothing. `in_flight()` never does I/O: the balancer's decision reads
the count the ledger last learned (exact in memory; from the last acquire, release or refresh
with Redis).

A Redis outage never fails a request: the Redis ledger then admits from this process's share of
each target's capacity (capacity divided by the live gateway processes, as last published), logs
the outage once when it starts and once when it ends, and when Redis answers again writes back
the leases this process holds and removes the ones it released meanwhile.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import redis.asyncio as aioredis
from django.conf import settings
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

# Redis calls sit on the hot path: fail in about a second rather than hold a request for long.
REDIS_SOCKET_TIMEOUT_S = 1.0
# Connections this process may open to Redis; more concurrent calls wait for a free one.
REDIS_MAX_CONNECTIONS = 32
# During an outage, how often the background refresh tries Redis again.
RECONNECT_INTERVAL_S = 1.0


@dataclass(frozen=True, slots=True)
class Lease:
    """One granted slot on a target, to be released exactly once."""

    target_id: int
    lease_id: str


@dataclass(frozen=True, slots=True)
class LedgerStatus:
    """How the ledger counts right now, for /healthz."""

    kind: str  # "memory" or "redis"
    shared: bool  # False also while the Redis ledger serves from its local share
    outage_since: float | None = None  # epoch seconds the Redis outage began
    processes: int = 1  # the share each process takes during an outage: 1/processes

    def report(self) -> dict[str, Any]:
        """Return the status as /healthz shows it."""
        if self.outage_since is None:
            return {"status": "ok", "kind": self.kind, "shared": self.shared}
        return {
            "status": "degraded",
            "kind": self.kind,
            "shared": False,
            "detail": (
                "Redis is unreachable: this gateway process admits from its share "
                f"(1/{self.processes}) of each target's capacity until it returns"
            ),
            "outage_for_s": round(time.time() - self.outage_since, 1),
            "processes": self.processes,
        }


class LoadLedger(Protocol):
    """Count in-flight requests per target and admit one only below the target's capacity."""

    # Whether the counts are shared by every gateway process (Redis) or this process's own.
    shared: bool

    async def try_acquire(self, target_id: int, capacity: int) -> Lease | None:
        """Take a slot if fewer than capacity are in flight; return None when full."""
        ...

    async def release(self, lease: Lease) -> None:
        """Give the slot back; a second release of the same lease does nothing."""
        ...

    def in_flight(self, target_id: int) -> int:
        """Return the last known in-flight count, without I/O."""
        ...

    async def refresh(self, target_ids: Iterable[int]) -> None:
        """Pull the shared counts of these targets into the local view."""
        ...

    async def renew(self, leases: Iterable[Lease]) -> None:
        """Extend the leases of requests still running."""
        ...

    async def aclose(self) -> None:
        """Stop background work and close connections."""
        ...

    def status(self) -> LedgerStatus:
        """Return how the ledger counts now, without I/O."""
        ...


def lease_set_key(prefix: str, target_id: int) -> str:
    """Return the Redis key of a target's lease set (prefix: NEXUS_REDIS_PREFIX)."""
    return f"{prefix}:ledger:target:{target_id}"


class _LeaseIds:
    """Lease ids unique across processes: a random per-process half and a counter."""

    def __init__(self) -> None:
        self._prefix = secrets.token_hex(8)
        self._numbers = itertools.count(1)

    def next(self) -> str:
        return f"{self._prefix}{next(self._numbers):x}"


class MemoryLedger:
    """The ledger of one process: exact counts in a dict, no I/O."""

    shared = False

    def __init__(self) -> None:
        self._counts: dict[int, int] = defaultdict(int)
        self._held: set[str] = set()
        self._ids = _LeaseIds()

    async def try_acquire(self, target_id: int, capacity: int) -> Lease | None:
        # No await between the check and the increment: atomic on the event loop.
        if self._counts[target_id] >= capacity:
            return None
        lease = Lease(target_id, self._ids.next())
        self._counts[target_id] += 1
        self._held.add(lease.lease_id)
        return lease

    async def release(self, lease: Lease) -> None:
        if lease.lease_id not in self._held:
            return
        self._held.discard(lease.lease_id)
        self._counts[lease.target_id] = max(0, self._counts[lease.target_id] - 1)

    def in_flight(self, target_id: int) -> int:
        return self._counts.get(target_id, 0)

    async def refresh(self, target_ids: Iterable[int]) -> None:
        return None

    async def renew(self, leases: Iterable[Lease]) -> None:
        return None

    async def aclose(self) -> None:
        return None

    def status(self) -> LedgerStatus:
        return LedgerStatus(kind="memory", shared=False)


# Scores are expiry times in milliseconds of the Redis server's clock, so that gateways on
# machines whose clocks disagree still agree on which leases have expired. Each answer carries
# the server time in microseconds too, which orders answers that arrive out of order.
_NOW = """
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
"""

# KEYS[1] target's lease set; ARGV: capacity, lease id, ttl ms. Returns {granted, count, time}.
ACQUIRE_LUA = (
    _NOW
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local count = redis.call('ZCARD', KEYS[1])
if count >= tonumber(ARGV[1]) then
  return {0, count, now_us}
end
local ttl = tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[2])
-- The set outlives its newest lease, then disappears with the target's last request.
redis.call('PEXPIRE', KEYS[1], ttl)
return {1, count + 1, now_us}
"""
)

# KEYS[1] target's lease set; ARGV[1] lease id. Returns {count left, time}.
RELEASE_LUA = (
    _NOW
    + """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return {redis.call('ZCARD', KEYS[1]), now_us}
"""
)

# KEYS[1] target's lease set. Returns {live count, time}.
COUNT_LUA = (
    _NOW
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return {redis.call('ZCARD', KEYS[1]), now_us}
"""
)

# KEYS[1] target's lease set; ARGV: ttl ms, lease ids. Returns the ids no longer in the set.
# A lease that already expired is not brought back: its slot may have gone to someone else.
RENEW_LUA = (
    _NOW
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local ttl = tonumber(ARGV[1])
local lost = {}
for i = 2, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], now + ttl, ARGV[i])
  else
    table.insert(lost, ARGV[i])
  end
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return lost
"""
)

# KEYS[1] target's lease set; ARGV: ttl ms, the leases this process holds, "-", the leases it
# released while Redis was away. Returns {live count, time}. Held leases are written back even if
# they expired (or Redis restarted empty): their requests still run and must be counted.
RECLAIM_LUA = (
    _NOW
    + """
local ttl = tonumber(ARGV[1])
local released = false
for i = 2, #ARGV do
  if ARGV[i] == '-' then
    released = true
  elseif released then
    redis.call('ZREM', KEYS[1], ARGV[i])
  else
    redis.call('ZADD', KEYS[1], now + ttl, ARGV[i])
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return {redis.call('ZCARD', KEYS[1]), now_us}
"""
)
# An answer older than the newest one seen by more than this is not a reordering (those are a
# round trip apart) but the Redis clock stepping back: take it rather than freeze the count.
CLOCK_STEP_US = 5_000_000


class RedisLedger:
    """The ledger shared by every gateway process through Redis, with leases that expire.

    While Redis is unreachable it admits from this process's share of each capacity instead
    (see the module's docstring); `status()` says which it does.
    """

    shared = True

    def __init__(
        self,
        url: str,
        *,
        prefix: str,
        lease_ttl_s: float = 60.0,
        processes: Callable[[], int] = lambda: 1,
    ) -> None:
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=REDIS_MAX_CONNECTIONS,
            timeout=REDIS_SOCKET_TIMEOUT_S,
            socket_timeout=REDIS_SOCKET_TIMEOUT_S,
            socket_connect_timeout=REDIS_SOCKET_TIMEOUT_S,
        )
        self._redis = aioredis.Redis(connection_pool=pool)
        self._prefix = prefix
        self._ttl_ms = max(1, int(lease_ttl_s * 1000))
        # How many gateway processes share the targets (the published live state says; 1 when
        # unknown): during an outage each takes capacity // processes of every target.
        self.processes = processes
        # Renew well before expiry: a renewal may be late by a slow Redis call or a busy loop.
        self.renew_interval_s = lease_ttl_s / 3
        self._acquire = self._redis.register_script(ACQUIRE_LUA)
        self._release = self._redis.register_script(RELEASE_LUA)
        self._count = self._redis.register_script(COUNT_LUA)
        self._renew = self._redis.register_script(RENEW_LUA)
        self._reclaim = self._redis.register_script(RECLAIM_LUA)
        self._counts: dict[int, int] = {}
        self._count_times: dict[int, int] = {}
        self._held: dict[str, Lease] = {}
        # Leases this process holds per target, wherever they were granted.
        self._mine: defaultdict[int, int] = defaultdict(int)
        self._ids = _LeaseIds()
        self._renewer: asyncio.Task[None] | None = None
        # The loop keeps only weak references to tasks: hold the fire-and-forget ones here.
        self._background: set[asyncio.Task[None]] = set()
        self.lost_leases = 0
        # During an outage: when it began (epoch and monotonic), the share it was computed for,
        # and the leases released meanwhile that Redis may still hold.
        self._outage_since: float | None = None
        self._outage_began = 0.0
        self._outage_processes = 1
        self._last_reconnect = 0.0
        self._unreleased: dict[str, Lease] = {}

    def key(self, target_id: int) -> str:
        """Return the Redis key of the target's lease set."""
        return lease_set_key(self._prefix, target_id)

    async def try_acquire(self, target_id: int, capacity: int) -> Lease | None:
        if self._outage_since is not None:
            return self._acquire_locally(target_id, capacity)
        lease = Lease(target_id, self._ids.next())
        # Shielded: if the caller is cancelled (client gone) after Redis granted the lease, the
        # grant still arrives here and is released at once instead of holding a slot for a TTL.
        call = asyncio.ensure_future(
            self._acquire(keys=[self.key(target_id)], args=[capacity, lease.lease_id, self._ttl_ms])
        )
        try:
            granted, count, at = await asyncio.shield(call)
        except asyncio.CancelledError:
            call.add_done_callback(lambda done: self._release_orphan(done, lease))
            raise
        except (RedisError, OSError):
            # Whether Redis took the lease is unknown: it is written back, or removed, with the
            # others when Redis returns, so count it as released while away.
            self._unreleased[lease.lease_id] = lease
            self._begin_outage()
            return self._acquire_locally(target_id, capacity)
        self._learn(target_id, count, at)
        if not granted:
            return None
        self._hold(lease)
        return lease

    async def release(self, lease: Lease) -> None:
        # Forget it locally first: whatever happens to the Redis call, this lease is never
        # renewed or released again, so at worst it expires after its TTL.
        if self._held.pop(lease.lease_id, None) is None:
            return
        self._mine[lease.target_id] = max(0, self._mine[lease.target_id] - 1)
        self._counts[lease.target_id] = max(0, self._counts.get(lease.target_id, 1) - 1)
        if self._outage_since is not None:
            self._unreleased[lease.lease_id] = lease
            return
        call = asyncio.ensure_future(
            self._release(keys=[self.key(lease.target_id)], args=[lease.lease_id])
        )
        try:
            count, at = await asyncio.shield(call)
        except (RedisError, OSError):
            self._unreleased[lease.lease_id] = lease
            self._begin_outage()
            return
        self._learn(lease.target_id, count, at)

    def in_flight(self, target_id: int) -> int:
        if self._outage_since is not None:
            # What this process sees of the target is its share: report it scaled to the whole.
            return self._mine[target_id] * self._outage_processes
        return self._counts.get(target_id, 0)

    async def refresh(self, target_ids: Iterable[int]) -> None:
        """Pull the shared counts; during an outage, try Redis again (about once a second)."""
        ids = list(dict.fromkeys(target_ids))
        if self._outage_since is not None:
            await self._try_reconnect(ids)
            return
        if not ids:
            return
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for target_id in ids:
                    await self._count(keys=[self.key(target_id)], client=pipe)
                counts = await pipe.execute()
        except (RedisError, OSError):
            self._begin_outage()
            return
        for target_id, (count, at) in zip(ids, counts, strict=True):
            self._learn(target_id, count, at)

    async def renew(self, leases: Iterable[Lease]) -> None:
        if self._outage_since is not None:
            return  # written back with a fresh TTL when Redis returns
        by_target: dict[int, list[str]] = defaultdict(list)
        for lease in leases:
            by_target[lease.target_id].append(lease.lease_id)
        if not by_target:
            return
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for target_id, lease_ids in by_target.items():
                    await self._renew(
                        keys=[self.key(target_id)], args=[self._ttl_ms, *lease_ids], client=pipe
                    )
                answers = await pipe.execute()
        except (RedisError, OSError):
            self._begin_outage()
            return
        lost = [lease_id.decode() for answer in answers for lease_id in answer]
        if lost:
            # The renewer fell behind by a whole TTL (the loop blocked): these slots may already
            # serve other requests, so capacity can be exceeded until they end. Stop renewing
            # them; their release then has nothing left to give back.
            for lease_id in lost:
                if (gone := self._held.pop(lease_id, None)) is not None:
                    self._mine[gone.target_id] = max(0, self._mine[gone.target_id] - 1)
            self.lost_leases += len(lost)
            log.warning("%d leases expired before renewal: %s", len(lost), ", ".join(lost[:10]))

    async def aclose(self) -> None:
        """Stop renewing and close the connections; leases still held expire after the TTL."""
        if self._renewer is not None:
            self._renewer.cancel()
            await asyncio.gather(self._renewer, return_exceptions=True)
            self._renewer = None
        await self._redis.aclose()

    def status(self) -> LedgerStatus:
        return LedgerStatus(
            kind="redis",
            shared=self._outage_since is None,
            outage_since=self._outage_since,
            processes=self._outage_processes,
        )

    def _hold(self, lease: Lease) -> None:
        self._held[lease.lease_id] = lease
        self._mine[lease.target_id] += 1
        self._ensure_renewer()

    def _acquire_locally(self, target_id: int, capacity: int) -> Lease | None:
        # No await: atomic on the event loop, like the memory ledger. At least one slot each, so
        # that a target smaller than the number of processes still serves (over by at most
        # processes - capacity while Redis is away).
        if self._mine[target_id] >= max(1, capacity // self._outage_processes):
            return None
        lease = Lease(target_id, self._ids.next())
        self._hold(lease)
        return lease

    def _begin_outage(self) -> None:
        if self._outage_since is not None:
            return
        self._outage_since = time.time()
        self._outage_began = self._last_reconnect = time.monotonic()
        self._outage_processes = max(1, self.processes())
        log.warning(
            "load ledger: Redis unreachable; admitting from this process's share (1/%d) of each"
            " target's capacity until it returns",
            self._outage_processes,
        )

    async def _try_reconnect(self, target_ids: list[int]) -> None:
        """Write this process's leases back to Redis and end the outage, if Redis answers."""
        now = time.monotonic()
        if now - self._last_reconnect < RECONNECT_INTERVAL_S:
            return
        self._last_reconnect = now
        held: dict[int, list[str]] = defaultdict(list)
        for lease in self._held.values():
            held[lease.target_id].append(lease.lease_id)
        released: dict[int, list[str]] = defaultdict(list)
        for lease in self._unreleased.values():
            released[lease.target_id].append(lease.lease_id)
        ids = list(dict.fromkeys([*target_ids, *held, *released]))
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for target_id in ids:
                    args: list[str | int] = [self._ttl_ms, *held[target_id], "-"]
                    args += released[target_id]
                    await self._reclaim(keys=[self.key(target_id)], args=args, client=pipe)
                counts = await pipe.execute()
        except (RedisError, OSError):
            return
        for target_id, (count, at) in zip(ids, counts, strict=True):
            self._count_times.pop(target_id, None)
            self._learn(target_id, count, at)
        log.warning(
            "load ledger: Redis reachable again after %.1f s; wrote back %d held leases,"
            " removed %d released meanwhile",
            now - self._outage_began,
            len(self._held),
            len(self._unreleased),
        )
        self._unreleased.clear()
        self._outage_since = None

    def _learn(self, target_id: int, count: int, at: int) -> None:
        # Concurrent calls answer in any order: keep the count Redis computed last.
        last = self._count_times.get(target_id, 0)
        if at >= last or last - at > CLOCK_STEP_US:
            self._counts[target_id] = int(count)
            self._count_times[target_id] = at

    def _ensure_renewer(self) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew_forever())

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.renew_interval_s)
            await self.renew(list(self._held.values()))

    def _release_orphan(self, call: asyncio.Future[Any], lease: Lease) -> None:
        if call.cancelled() or call.exception() is not None or not call.result()[0]:
            return
        self._hold(lease)
        task = asyncio.get_running_loop().create_task(self.release(lease))
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def build_ledger(processes: Callable[[], int] = lambda: 1) -> LoadLedger:
    """Return the ledger this process should use, as settings.NEXUS_LEDGER says.

    processes: how many gateway processes share the targets (for the share taken during a
    Redis outage).
    """
    choice = settings.NEXUS_LEDGER  # one of auto, memory, redis: settings check it
    # "auto": an operator who set REDIS_URL runs (or may run) several gateway processes that must
    # share counts; the bundled Redis means one embedded process, where memory is exact and free.
    if choice == "redis" or (choice == "auto" and not settings.NEXUS_BUNDLED_REDIS):
        return RedisLedger(
            settings.REDIS_URL,
            prefix=settings.NEXUS_REDIS_PREFIX,
            lease_ttl_s=settings.NEXUS_LEDGER_LEASE_TTL_S,
            processes=processes,
        )
    return MemoryLedger()
