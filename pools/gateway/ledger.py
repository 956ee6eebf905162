"""The load ledger: in-flight requests per target, in this process or shared through Redis.

It also keeps each client token's limits (pools.balancer.limits): `admit` counts a request against
the token's windows and concurrency before it is routed, `settle` gives back what it held and
counts the tokens its answer used. With Redis every gateway process shares one budget per token.

Every granted acquire hands out a `Lease`; releasing it is the only way to give the slot back, and
releasing it twice changes nothing. `in_flight()` never does I/O: the balancer's decision reads
the count the ledger last learned (exact in memory; from the last acquire, release or refresh
with Redis).

A Redis outage never fails a request: the Redis ledger then admits from this process's share of
each target's capacity (capacity divided by the live gateway processes, as last published), logs
the outage once when it starts and once when it ends, and when Redis answers again writes back
the leases this process holds and removes the ones it released meanwhile.

When Redis goes away, a process may hold more than its share (Redis let the processes split the
capacity as the traffic came), and the others cannot see those leases end. So, at first, each
process keeps to what it held when the outage began (Redis kept that total within the capacity),
and takes its whole share only once the longest request it has seen on the target could have
ended since. A process that has seen no request on the target end has no such length, and takes
its share at once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import redis.asyncio as aioredis
from django.conf import settings
from redis.exceptions import RedisError

from pools.balancer.limits import CONCURRENCY_RETRY_S, Limit, TokenLimits, prune, retry_after

log = logging.getLogger(__name__)

# Redis calls sit on the hot path: fail in about a second rather than hold a request for long.
REDIS_SOCKET_TIMEOUT_S = 1.0
# Connections this process may open to Redis; more concurrent calls wait for a free one.
REDIS_MAX_CONNECTIONS = 32
# During an outage, how often the background refresh tries Redis again, and how many write-backs
# one attempt makes while requests keep changing what this process holds.
RECONNECT_INTERVAL_S = 1.0
RECONCILE_ROUNDS = 5
# After its outage, how long a process still keeps to its share: the other processes write their
# leases back within about a reconnect interval of each other, and until they have, the shared
# counts miss theirs.
SETTLE_AFTER_OUTAGE_S = 3 * RECONNECT_INTERVAL_S
# How many of a target's latest request lengths a process keeps, for the longest of them.
KEPT_LENGTHS = 32


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


@dataclass(frozen=True, slots=True)
class Admission:
    """A token's request let through its limits (or refused: `refused` says by which one)."""

    token_id: int
    lease_id: str | None = None  # a concurrency slot, given back by settle()
    counts_tokens: bool = False  # the token has a tokens-per-minute limit: settle() counts them
    refused: Limit | None = None
    retry_after_s: float = 0.0


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

    async def admit(self, token_id: int, limits: TokenLimits) -> Admission:
        """Let a request of the token through its limits, or say which refuses it and for how
        long; never raises (an unreachable shared ledger lets it through)."""
        ...

    async def settle(self, admission: Admission, tokens: int) -> None:
        """End an admitted request: give back its concurrency slot, count the tokens it used."""
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


def token_limit_keys(prefix: str, token_id: int) -> list[str]:
    """Return the Redis keys of a token's request window, token window and running set."""
    base = f"{prefix}:ledger:token:{token_id}"
    return [f"{base}:requests", f"{base}:tokens", f"{base}:running"]


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
        self._request_windows: defaultdict[int, dict[int, int]] = defaultdict(dict)
        self._token_windows: defaultdict[int, dict[int, int]] = defaultdict(dict)
        self._running: defaultdict[int, int] = defaultdict(int)
        self._admitted: set[str] = set()

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

    async def admit(self, token_id: int, limits: TokenLimits) -> Admission:
        # No await anywhere: the checks and the counting are atomic on the event loop.
        now = time.time()
        requests = self._request_windows[token_id]
        checks = (
            (Limit.REQUESTS_PER_MINUTE, limits.requests_per_minute, requests),
            (Limit.TOKENS_PER_MINUTE, limits.tokens_per_minute, self._token_windows[token_id]),
        )
        for limit, value, window in checks:
            if value is not None:
                wait = retry_after(window, prune(window, now), value, now)
                if wait is not None:
                    return Admission(token_id, refused=limit, retry_after_s=wait)
        if limits.concurrent is not None and self._running[token_id] >= limits.concurrent:
            return Admission(token_id, refused=Limit.CONCURRENT, retry_after_s=CONCURRENCY_RETRY_S)
        if limits.requests_per_minute is not None:
            requests[int(now)] = requests.get(int(now), 0) + 1
        lease_id = None
        if limits.concurrent is not None:
            lease_id = self._ids.next()
            self._running[token_id] += 1
            self._admitted.add(lease_id)
        return Admission(token_id, lease_id, counts_tokens=limits.tokens_per_minute is not None)

    async def settle(self, admission: Admission, tokens: int) -> None:
        token_id = admission.token_id
        if admission.lease_id is not None and admission.lease_id in self._admitted:
            self._admitted.discard(admission.lease_id)
            self._running[token_id] = max(0, self._running[token_id] - 1)
        if admission.counts_tokens and tokens > 0:
            window = self._token_windows[token_id]
            second = int(time.time())
            window[second] = window.get(second, 0) + tokens

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
# A token's limits, the rule of pools.balancer.limits in Lua. KEYS: the token's request window,
# token window (hashes: epoch second -> amount) and running set (a lease set, as a target's).
# ARGV: requests per minute, tokens per minute, concurrent (0: no limit), lease id, lease ttl ms.
# Returns {0, 0} when admitted, else {1|2|3 (the limit refusing), retry after in ms}.
ADMIT_LUA = (
    _NOW
    + """
local window_s = 60
local function refusal(key, limit)
  local flat = redis.call('HGETALL', key)
  local total, kept = 0, {}
  for i = 1, #flat, 2 do
    local second, amount = tonumber(flat[i]), tonumber(flat[i + 1])
    if second <= math.floor(now_us / 1000000) - window_s then
      redis.call('HDEL', key, flat[i])
    else
      total = total + amount
      table.insert(kept, {second, amount})
    end
  end
  if total < limit then return nil end
  table.sort(kept, function(a, b) return a[1] < b[1] end)
  for _, bucket in ipairs(kept) do
    total = total - bucket[2]
    if total < limit then return (bucket[1] + window_s) * 1000 - now end
  end
  return window_s * 1000
end
local rpm, tpm, concurrent = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if rpm > 0 then
  local wait = refusal(KEYS[1], rpm)
  if wait then return {1, wait} end
end
if tpm > 0 then
  local wait = refusal(KEYS[2], tpm)
  if wait then return {2, wait} end
end
local ttl = tonumber(ARGV[5])
if concurrent > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  if redis.call('ZCARD', KEYS[3]) >= concurrent then return {3, 0} end
  redis.call('ZADD', KEYS[3], now + ttl, ARGV[4])
  redis.call('PEXPIRE', KEYS[3], ttl)
end
if rpm > 0 then
  redis.call('HINCRBY', KEYS[1], math.floor(now_us / 1000000), 1)
  redis.call('EXPIRE', KEYS[1], window_s + 1)
end
return {0, 0}
"""
)
# KEYS: the token's token window and running set; ARGV: tokens used, lease id ("" for none).
SETTLE_LUA = (
    _NOW
    + """
if ARGV[2] ~= '' then redis.call('ZREM', KEYS[2], ARGV[2]) end
local tokens = tonumber(ARGV[1])
if tokens > 0 then
  redis.call('HINCRBY', KEYS[1], math.floor(now_us / 1000000), tokens)
  redis.call('EXPIRE', KEYS[1], 61)
end
return 1
"""
)
# What ADMIT_LUA's first answer means.
REFUSALS = {1: Limit.REQUESTS_PER_MINUTE, 2: Limit.TOKENS_PER_MINUTE, 3: Limit.CONCURRENT}
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
        self._admit = self._redis.register_script(ADMIT_LUA)
        self._settle = self._redis.register_script(SETTLE_LUA)
        self._running: dict[str, int] = {}  # concurrency lease id -> token id
        self._counts: dict[int, int] = {}
        self._count_times: dict[int, int] = {}
        # Releases on their way to Redis, per target: a count read before one arrived there
        # still holds its slot, which this process already gave back.
        self._releasing: defaultdict[int, int] = defaultdict(int)
        self._held: dict[str, Lease] = {}
        # Leases this process holds per target, wherever they were granted; when each was taken
        # (monotonic), and the lengths of the latest released, per target.
        self._mine: defaultdict[int, int] = defaultdict(int)
        self._taken_at: dict[str, float] = {}
        self._lengths: defaultdict[int, deque[float]] = defaultdict(
            lambda: deque(maxlen=KEPT_LENGTHS)
        )
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
        # Per target, what this process held when the outage began, and until when (monotonic)
        # it keeps to that: the others may still hold what Redis granted them.
        self._held_at_outage: dict[int, int] = {}
        self._others_may_hold_until: dict[int, float] = {}
        self._last_reconnect = 0.0
        # Until then (monotonic), the share still bounds admissions after an outage.
        self._settling_until = 0.0
        self._unreleased: dict[str, Lease] = {}

    def key(self, target_id: int) -> str:
        """Return the Redis key of the target's lease set."""
        return lease_set_key(self._prefix, target_id)

    async def try_acquire(self, target_id: int, capacity: int) -> Lease | None:
        if self._outage_since is not None:
            return self._acquire_locally(target_id, capacity)
        if time.monotonic() < self._settling_until and self._mine[target_id] >= self._share(
            capacity
        ):
            # Just back from an outage: other processes may not have written their leases back
            # yet, so Redis undercounts; the share still bounds this process meanwhile.
            return None
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
        self._learn(target_id, count, at, taken=1 if granted else 0)
        if not granted:
            return None
        self._hold(lease)
        return lease

    async def release(self, lease: Lease) -> None:
        # Forget it locally first: whatever happens to the Redis call, this lease is never
        # renewed or released again, so at worst it expires after its TTL.
        if self._held.pop(lease.lease_id, None) is None:
            return
        self._forget(lease)
        self._counts[lease.target_id] = max(0, self._counts.get(lease.target_id, 1) - 1)
        if self._outage_since is not None:
            self._unreleased[lease.lease_id] = lease
            return
        call = asyncio.ensure_future(
            self._release(keys=[self.key(lease.target_id)], args=[lease.lease_id])
        )
        target_id = lease.target_id
        self._releasing[target_id] += 1
        call.add_done_callback(lambda _: self._arrived(target_id))
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
                    self._forget(gone)
            self.lost_leases += len(lost)
            log.warning("%d leases expired before renewal: %s", len(lost), ", ".join(lost[:10]))

    async def admit(self, token_id: int, limits: TokenLimits) -> Admission:
        if self._outage_since is not None:
            return Admission(token_id)  # Redis is away: limits wait for it (docs/access.md)
        keys = token_limit_keys(self._prefix, token_id)
        lease_id = self._ids.next() if limits.concurrent is not None else None
        args: list[int | str] = [
            limits.requests_per_minute or 0,
            limits.tokens_per_minute or 0,
            limits.concurrent or 0,
            lease_id or "",
            self._ttl_ms,
        ]
        admitted = Admission(token_id, lease_id, counts_tokens=limits.tokens_per_minute is not None)
        # Shielded as in try_acquire: a slot granted to a client that left is given back at once.
        call = asyncio.ensure_future(self._admit(keys=keys, args=args))
        try:
            code, wait_ms = await asyncio.shield(call)
        except asyncio.CancelledError:
            call.add_done_callback(lambda done: self._settle_orphan(done, admitted))
            raise
        except (RedisError, OSError):
            # A Redis outage never refuses a request: it goes unlimited until Redis is back.
            self._begin_outage()
            return Admission(token_id)
        if code:
            limit = REFUSALS[int(code)]
            wait_s = CONCURRENCY_RETRY_S if limit is Limit.CONCURRENT else int(wait_ms) / 1000
            return Admission(token_id, refused=limit, retry_after_s=wait_s)
        if lease_id is not None:
            self._running[lease_id] = token_id
            self._ensure_renewer()
        return admitted

    async def settle(self, admission: Admission, tokens: int) -> None:
        lease_id = admission.lease_id
        held = lease_id if lease_id and self._running.pop(lease_id, None) is not None else ""
        tokens = tokens if admission.counts_tokens else 0
        if not held and tokens <= 0:
            return
        if self._outage_since is not None:
            return  # limits are off while Redis is away; a held slot expires with its TTL
        keys = token_limit_keys(self._prefix, admission.token_id)
        try:
            await self._settle(keys=keys[1:], args=[tokens, held])
        except (RedisError, OSError):
            self._begin_outage()

    async def _renew_running(self) -> None:
        """Extend the concurrency leases of tokens' requests still running."""
        by_token: dict[int, list[str]] = defaultdict(list)
        for lease_id, token_id in self._running.items():
            by_token[token_id].append(lease_id)
        if not by_token or self._outage_since is not None:
            return
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for token_id, lease_ids in by_token.items():
                    key = token_limit_keys(self._prefix, token_id)[2]
                    await self._renew(keys=[key], args=[self._ttl_ms, *lease_ids], client=pipe)
                answers = await pipe.execute()
        except (RedisError, OSError):
            self._begin_outage()
            return
        for answer in answers:
            for lease_id in answer:
                self._running.pop(lease_id.decode(), None)

    def _settle_orphan(self, call: asyncio.Future[Any], admission: Admission) -> None:
        if call.cancelled() or call.exception() is not None or call.result()[0]:
            return
        if admission.lease_id is None:
            return  # nothing held; its request was counted, as it was sent
        self._running[admission.lease_id] = admission.token_id
        task = asyncio.get_running_loop().create_task(self.settle(admission, 0))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

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
        self._taken_at[lease.lease_id] = time.monotonic()
        self._mine[lease.target_id] += 1
        self._ensure_renewer()

    def _forget(self, lease: Lease) -> None:
        """Count a lease no longer held (it was in `_held`), and how long it was."""
        self._mine[lease.target_id] = max(0, self._mine[lease.target_id] - 1)
        taken_at = self._taken_at.pop(lease.lease_id, None)
        if taken_at is not None:
            self._lengths[lease.target_id].append(time.monotonic() - taken_at)

    def _acquire_locally(self, target_id: int, capacity: int) -> Lease | None:
        # No await: atomic on the event loop, like the memory ledger. The share is at least one
        # slot, so that a target smaller than the number of processes still serves (over by at
        # most processes - capacity while Redis is away), once the others' leases from before
        # the outage may have ended; until then, what this process held (the module's docstring).
        limit = self._share(capacity)
        if time.monotonic() < self._others_may_hold_until.get(target_id, 0.0):
            limit = min(limit, self._held_at_outage.get(target_id, 0))
        if self._mine[target_id] >= limit:
            return None
        lease = Lease(target_id, self._ids.next())
        self._hold(lease)
        return lease

    def _share(self, capacity: int) -> int:
        """Return the slots of a target this process may hold on its own: at least one."""
        return max(1, capacity // self._outage_processes)

    def _begin_outage(self) -> None:
        if self._outage_since is not None:
            return
        self._outage_since = time.time()
        self._outage_began = self._last_reconnect = time.monotonic()
        self._outage_processes = max(1, self.processes())
        now = self._outage_began
        self._held_at_outage = {target_id: held for target_id, held in self._mine.items() if held}
        self._others_may_hold_until = {
            target_id: now + max(lengths) for target_id, lengths in self._lengths.items() if lengths
        }
        log.warning(
            "load ledger: Redis unreachable; admitting from this process's share (1/%d) of each"
            " target's capacity until it returns",
            self._outage_processes,
        )

    async def _try_reconnect(self, target_ids: list[int]) -> None:
        """Write this process's leases back to Redis and end the outage, if Redis answers.

        Requests keep taking and releasing slots locally while a write-back is on its way, so
        it is repeated for what changed meanwhile, until one finds nothing left to write; the
        outage ends right then, with no await in between.
        """
        now = time.monotonic()
        if now - self._last_reconnect < RECONNECT_INTERVAL_S:
            return
        self._last_reconnect = now
        written: set[str] = set()  # held leases written back
        removed: set[str] = set()  # released leases removed
        reached = False
        ids = list(dict.fromkeys(target_ids))
        for _ in range(RECONCILE_ROUNDS):
            held: dict[int, list[str]] = defaultdict(list)
            for lease in self._held.values():
                if lease.lease_id not in written:
                    held[lease.target_id].append(lease.lease_id)
            released: dict[int, list[str]] = defaultdict(list)
            for lease in self._unreleased.values():
                if lease.lease_id not in removed:
                    released[lease.target_id].append(lease.lease_id)
            ids = list(dict.fromkeys([*ids, *held, *released]))
            if not ids and reached:
                break
            try:
                if not ids:  # nothing to write: whether Redis answers is all there is to learn
                    await self._redis.ping()
                    break
                async with self._redis.pipeline(transaction=False) as pipe:
                    for target_id in ids:
                        args: list[str | int] = [self._ttl_ms, *held[target_id], "-"]
                        args += released[target_id]
                        await self._reclaim(keys=[self.key(target_id)], args=args, client=pipe)
                    counts = await pipe.execute()
            except (RedisError, OSError):
                return
            reached = True
            for target_id, (count, at) in zip(ids, counts, strict=True):
                self._count_times.pop(target_id, None)
                self._learn(target_id, count, at)
            written.update(lease_id for lease_ids in held.values() for lease_id in lease_ids)
            removed.update(lease_id for lease_ids in released.values() for lease_id in lease_ids)
            # Only what changed during this round is left for the next one.
            ids = []
        else:
            return  # still changing: the next attempt writes the rest
        log.warning(
            "load ledger: Redis reachable again after %.1f s; wrote back %d held leases,"
            " removed %d released meanwhile",
            now - self._outage_began,
            len(self._held),
            len(self._unreleased),
        )
        self._unreleased.clear()
        self._outage_since = None
        self._settling_until = time.monotonic() + SETTLE_AFTER_OUTAGE_S

    def _learn(self, target_id: int, count: int, at: int, *, taken: int = 0) -> None:
        """Keep a count Redis computed at `at`, of which `taken` leases this call just took."""
        # Concurrent calls answer in any order: keep the count Redis computed last.
        last = self._count_times.get(target_id, 0)
        if at >= last or last - at > CLOCK_STEP_US:
            if self._releasing[target_id]:
                # It may predate a release still on its way: never let it bring that slot back
                # (a refresh read just before a release made an idle target look busy to the
                # next request). The release's own answer sets the count right.
                count = min(int(count), self._counts.get(target_id, 0) + taken)
            self._counts[target_id] = int(count)
            self._count_times[target_id] = at

    def _arrived(self, target_id: int) -> None:
        """A release's call to Redis ended (answered, failed or not sent)."""
        self._releasing[target_id] -= 1

    def _ensure_renewer(self) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew_forever())

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.renew_interval_s)
            await self.renew(list(self._held.values()))
            await self._renew_running()

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
