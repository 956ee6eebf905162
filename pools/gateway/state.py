"""A gateway process's live state: load, health, speed, affinity and queues, kept off the database.

The router (pools.gateway.flight) works through the operations below: what a request is
(`request_facts`), where it goes (`decide`), taking and giving back a slot (`claim`, `release`),
waiting for one (`wait`), and what its attempts taught (`record_outcome`, `record_served`). The
balancer core decides from TargetViews built here, per request, from the configuration snapshot
and these in-memory readings. Background work (engine scrapes, shared-ledger refreshes,
finishing drains, waking queues that another process freed room for) runs in one maintenance
task, and the readings are published for other processes (pools.gateway.publish) by another,
so that the request path does no I/O besides the ledger's acquire and release.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import defaultdict
from dataclasses import replace

from asgiref.sync import sync_to_async
from django.conf import settings

from nexus import upstream
from nexus.graceful import stop_part
from pools import services
from pools.balancer.continuity import AffinityMap, continuity_keys
from pools.balancer.health import LatencyStats, PassiveHealth, ServerErrorMemory
from pools.balancer.limits import TokenLimits
from pools.balancer.queue import Affinity, PoolQueue
from pools.balancer.retry import FailurePhase, RetryBudget, may_retry
from pools.balancer.snapshot import Decision, DrainState, Health, RequestFacts, TargetView
from pools.balancer.sticky import sticky_wait
from pools.balancer.strategies import decide
from pools.gateway import metrics
from pools.gateway.counters import LiveCounters
from pools.gateway.engine_metrics import SCRAPE_INTERVAL_S, EngineLoads
from pools.gateway.history import SHUTDOWN_SHIP_TIMEOUT_S, HistoryRecord, HistoryShipper
from pools.gateway.ledger import Admission, Lease, LedgerStatus, LoadLedger, build_ledger
from pools.gateway.publish import GatewayReadings, Publisher, TargetReading
from pools.gateway.registry import Registry
from pools.gateway.snapshot import WARM_WINDOW_S, PoolEntry, Snapshot, TargetEntry

log = logging.getLogger(__name__)

# How often waiting queues are checked for room freed elsewhere, and shared counts refreshed.
MAINTENANCE_INTERVAL_S = 0.25
# How long the routing history may take to stop at shutdown: its last shipment to Redis, then
# writing what Redis did not take to the database.
HISTORY_STOP_S = SHUTDOWN_SHIP_TIMEOUT_S + 10.0
# Conversations and prompt prefixes remembered per process.
SESSION_ENTRIES, SESSION_TTL_S = 100_000, 1800.0
PREFIX_ENTRIES, PREFIX_TTL_S = 50_000, 600.0


def _max_tokens(payload: dict[str, object]) -> int | None:
    """Return the answer's length bound the request sets (max_completion_tokens, max_tokens)."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = payload.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


class GatewayState:
    """Everything a gateway process knows about its targets beyond their configuration."""

    def __init__(
        self,
        ledger: LoadLedger | None = None,
        history: HistoryShipper | None = None,
        *,
        budget: RetryBudget | None = None,
        publisher: Publisher | None = None,
    ):
        self._ledger = ledger or build_ledger(processes=self._live_processes)
        self._history = history or HistoryShipper()
        self._counters = LiveCounters()
        self._budget = budget or RetryBudget()
        self._publisher = publisher
        self._engine_loads = EngineLoads()
        # Requests this process ever started per target (EngineLoads tells the engine's count
        # of Nexus's own requests from other clients' by it).
        self._started: defaultdict[int, int] = defaultdict(int)
        self._health = PassiveHealth()
        self._server_errors = ServerErrorMemory()
        self._latency: defaultdict[int, LatencyStats] = defaultdict(LatencyStats)
        self._sessions = AffinityMap(max_entries=SESSION_ENTRIES, ttl_s=SESSION_TTL_S)
        self._prefixes = AffinityMap(max_entries=PREFIX_ENTRIES, ttl_s=PREFIX_TTL_S)
        # One queue per pool and request kind: an embeddings request never waits behind chat
        # requests that wait for chat-only targets.
        self._queues: dict[tuple[int, str], PoolQueue] = {}
        self._turns: defaultdict[int, int] = defaultdict(int)
        self._active: defaultdict[int, int] = defaultdict(int)  # requests in progress per pool
        self._last_served: dict[int, float] = {}
        self._rng = random.Random()
        self._maintenance: asyncio.Task[None] | None = None
        # Set when the shutdown grace ran out: requests cancelled from now on were cut by it.
        self.cutting = False

    # -- a request's way ---------------------------------------------------------------------

    def request_facts(
        self,
        pool: PoolEntry,
        kind: str,
        headers: dict[str, str],
        payload: dict[str, object],
        now: float,
    ) -> tuple[RequestFacts, str | None, str | None]:
        """Return what the balancer needs to know of a request, and its continuity keys."""
        enabled = pool.policy.continuity_enabled
        session_key, prefix_key = continuity_keys(pool.slug, enabled, kind, headers, payload)
        if session_key is None and prefix_key is None:
            return RequestFacts(kind=kind), None, None
        sticky, prefix = self.affinity(session_key, prefix_key, now)
        if sticky is None and prefix is None:
            return RequestFacts(kind=kind), session_key, prefix_key
        facts = RequestFacts(
            kind=kind,
            sticky_target_id=sticky,
            prefix_target_id=prefix,
            output_tokens=_max_tokens(payload),
        )
        return facts, session_key, prefix_key

    def affinity(
        self, session_key: str | None, prefix_key: str | None, now: float
    ) -> tuple[int | None, int | None]:
        """Return where this conversation and this prompt prefix went last, as far as known."""
        return (
            self._sessions.get(session_key, now) if session_key else None,
            self._prefixes.get(prefix_key, now) if prefix_key else None,
        )

    def begin(self, pool: PoolEntry) -> None:
        """Count a request in progress in the pool (the retry budget is a share of them)."""
        self._active[pool.id] += 1

    def end(
        self, pool: PoolEntry, retries_held: int, record: HistoryRecord, streamed_chunks: int = 0
    ) -> None:
        """Count the request out, give back its retry slots, hand its record to the history and
        count it for the Live page (a stream without `usage`: its chunks stand for its tokens)."""
        self._active[pool.id] -= 1
        for _ in range(retries_held):
            self._budget.release()
        self._history.record(record)
        completion = record.completion_tokens
        self._counters.add(
            pool.id,
            record.target_id,
            record.outcome,
            record.ttft_ms,
            record.prompt_tokens,
            completion if completion is not None else streamed_chunks,
        )

    async def admit(self, token_id: int, limits: TokenLimits) -> Admission:
        """Let a token's request through its limits, or say which one refuses it."""
        return await self._ledger.admit(token_id, limits)

    async def settle(self, admission: Admission, tokens: int) -> None:
        """End an admitted request: its concurrency slot back, the tokens it used counted."""
        await self._ledger.settle(admission, tokens)

    def decide(
        self, pool: PoolEntry, facts: RequestFacts, exclude: frozenset[int], now: float
    ) -> Decision:
        """Return where the request goes now, explained; targets in `exclude` were tried.

        With `facts.may_wait_s`, a request whose sticky target is full may get the verdict to
        wait for it (`decision.sticky_wait`, balancer.sticky) instead of moving.
        """
        views = self.views(pool, now)
        decision = decide(
            views, pool.policy, facts, rng=self._rng, turn=self._turns[pool.id], exclude=exclude
        )
        if facts.may_wait_s > 0.0 and decision.target_id is not None:
            home = facts.sticky_target_id or facts.prefix_target_id
            queue = self._queues.get((pool.id, facts.kind))
            # Every waiter whose conversation lives there goes first too (affinity wake-up).
            ahead = queue.fair.bound_for(home) if queue is not None and home else 0
            wait = sticky_wait(views, pool.policy, facts, decision, ahead=ahead)
            if wait is not None:
                decision = replace(decision, sticky_wait=wait)
        return decision

    def has_waiters(self, pool: PoolEntry, kind: str) -> bool:
        """Say whether requests of this kind wait in the pool's queue (newcomers go behind);
        those waiting for one target only (sticky waits) do not count: a slot elsewhere is not
        theirs."""
        return self._queue(pool, kind).unpinned() > 0

    async def claim(
        self, pool: PoolEntry, target: TargetEntry, now: float, *, readmitted: bool = False
    ) -> Lease | None:
        """Take a slot on the chosen target (its half-open trial, if on trial); None if gone.

        readmitted: the decision took an ejected target because ejection is past the pool's
        cap; its circuit stays open, so it is not asked. The pool's round-robin turn moves on
        either way: the decision used it.
        """
        self._turns[pool.id] += 1
        if not readmitted and not self._health.allow(target.id, now):
            return None
        lease = await self._ledger.try_acquire(target.id, target.capacity)
        if lease is None:
            # Another request took the last slot: the trial, if this was one, is not out.
            self._health.abandon(target.id)
        else:
            self._started[target.id] += 1
        return lease

    async def release(
        self, pool: PoolEntry, kind: str, target: TargetEntry, lease: Lease, held_s: float
    ) -> None:
        """Give the slot back and hand it to a waiter that can use it, first one whose
        conversation or prompt prefix lives on this target (queue.FairQueue.pop_for)."""
        # How long a slot stays taken: the queue's wait estimate (Retry-After) uses it, and the
        # target's own average predicts when it frees a slot (balancer.sticky).
        self._queue(pool, kind).record_service_time(held_s)
        self._latency[target.id].record(service_s=held_s)
        await self._ledger.release(lease)
        for served_kind in target.kinds:
            queue = self._queues.get((pool.id, served_kind))
            if queue:
                queue.wake_for(target.id, target.name)

    async def wait(
        self,
        pool: PoolEntry,
        kind: str,
        queue_id: int,
        timeout_s: float,
        facts: RequestFacts,
        *,
        again: bool,
        only: int | None = None,
    ) -> str:
        """Wait in the pool's fair queue for a slot; raise QueueFull or QueueTimeout; return
        the rule that woke the request (for its history).

        again: the request was woken before but lost the slot; it waits first in line.
        only: wait for a slot on this target alone (a sticky wait), at most timeout_s.
        """
        capacity = sum(t.capacity for t in pool.targets if t.enabled and kind in t.kinds)
        affinity = Affinity(facts.sticky_target_id, facts.prefix_target_id)
        try:
            return await self._queue(pool, kind).wait(
                queue_id,
                timeout_s,
                capacity=max(1, capacity),
                again=again,
                affinity=affinity,
                only=only,
                joined=lambda: self._report_queued(pool),
            )
        finally:
            self._report_queued(pool)

    def pass_on(self, pool: PoolEntry, kind: str, target: TargetEntry) -> None:
        """Hand a slot on this target, which a woken request declined to wait for its sticky
        target instead, to the waiter that the affinity wake-up picks (if any)."""
        queue = self._queues.get((pool.id, kind))
        if queue:
            queue.wake_for(target.id, target.name)

    def may_retry(
        self,
        pool: PoolEntry,
        phase: FailurePhase,
        attempt: int,
        status: int | None,
        *,
        delivered: bool,
    ) -> tuple[bool, str]:
        """Say whether a failed attempt moves to another target, and why; True for a delivered
        request holds a slot of the retry budget, given back by `end`."""
        return may_retry(
            phase,
            attempt,
            pool.max_attempts,
            self._budget,
            self._active[pool.id],
            status=status,
            delivered=delivered,
        )

    def record_outcome(self, target: TargetEntry, ok: bool, now: float, why: str = "") -> None:
        """Count an attempt's verdict in the target's passive health (why: see health.record)."""
        degraded = target.health is Health.DEGRADED
        self._health.record(target.id, ok=ok, now=now, degraded=degraded, why=why)

    def request_at_fault(
        self, pool: PoolEntry, target: TargetEntry, fingerprint: str, now: float
    ) -> list[str] | None:
        """Say whether a server error is the request's fault: other targets failed it too.

        Returns their names (their own failures on it are taken back), or None when this is the
        first target to fail the request, which then counts as the target's fault.
        """
        others = self._server_errors.note(fingerprint, target.id, now)
        if not others:
            return None
        names = []
        for other in pool.targets:
            if other.id in others:
                self._health.forgive(other.id)
                names.append(other.name)
        return names

    def abandon(self, target: TargetEntry) -> None:
        """End an attempt that gave no verdict (the client left), freeing a trial it held."""
        self._health.abandon(target.id)

    def record_served(
        self,
        target: TargetEntry,
        now: float,
        *,
        ttft_s: float | None,
        tpot_s: float | None,
        session_key: str | None,
        prefix_key: str | None,
    ) -> None:
        """Learn from a served request: the target's speed, warmth and the conversation's place."""
        if ttft_s is not None:
            self._latency[target.id].record(ttft_s=ttft_s, tpot_s=tpot_s)
        self._last_served[target.id] = now
        if session_key is not None:
            self._sessions.put(session_key, target.id, now)
        if prefix_key is not None:
            self._prefixes.put(prefix_key, target.id, now)

    def views(self, pool: PoolEntry, now: float) -> list[TargetView]:
        """Return the pool's targets as the balancer sees them now."""
        health = self._health
        views = []
        for target in pool.targets:
            load = self._engine_loads.fresh(target.id, now)
            stats = self._latency.get(target.id)
            served = self._last_served.get(target.id)
            circuit_open = health.circuit_open(target.id, now)
            views.append(
                target.view(
                    circuit_open=circuit_open,
                    # Explained only when open: the common path computes nothing for it.
                    circuit_detail=(health.explain(target.id, now) or "") if circuit_open else "",
                    in_flight=self._ledger.in_flight(target.id),
                    engine_running=load.running if load else None,
                    engine_waiting=load.waiting if load else None,
                    engine_counted=load.counted if load else None,
                    ttft_s=stats.ttft_s if stats else None,
                    tpot_s=stats.tpot_s if stats else None,
                    error_rate=health.error_rate(target.id),
                    warm=served is not None and now - served < WARM_WINDOW_S,
                    service_s=stats.service_s if stats else None,
                )
            )
        return views

    # -- what other processes see ----------------------------------------------------------

    def ledger_status(self) -> LedgerStatus:
        """Return how this process counts in-flight requests now (shared, or its own share)."""
        return self._ledger.status()

    def _live_processes(self) -> int:
        return self._publisher.live_processes if self._publisher is not None else 1

    def readings(self, snapshot: Snapshot, process: str) -> GatewayReadings:
        """Return this process's live state for publication (pools.gateway.publish)."""
        now = time.monotonic()
        wall = time.time()
        health = self._health
        targets = {}
        for pool in snapshot.pools.values():
            for target in pool.targets:
                load = self._engine_loads.fresh(target.id, now)
                stats = self._latency.get(target.id)
                served = self._last_served.get(target.id)
                targets[target.id] = TargetReading(
                    in_flight=self._ledger.in_flight(target.id),
                    circuit=health.report(target.id, now)
                    if health.circuit_open(target.id, now)
                    else None,
                    ttft_s=stats.ttft_s if stats else None,
                    tpot_s=stats.tpot_s if stats else None,
                    error_rate=health.error_rate(target.id),
                    last_served_at=wall - (now - served) if served is not None else None,
                    engine_running=load.running if load else None,
                    engine_waiting=load.waiting if load else None,
                    engine_read_at=wall - (now - load.read_at) if load else None,
                    engine_counted=load.counted if load else None,
                )
        queued: defaultdict[int, int] = defaultdict(int)
        for (pool_id, _), queue in self._queues.items():
            queued[pool_id] += len(queue)
        return GatewayReadings(
            process=process,
            published_at=wall,
            shared_ledger=self._ledger.shared,
            targets=targets,
            queued=dict(queued),
            turns=dict(self._turns),
        )

    # -- background work ---------------------------------------------------------------------

    def start(self, registry: Registry) -> None:
        """Start the maintenance and publication tasks (once, on the first request)."""
        if self._maintenance is None:
            self._maintenance = asyncio.create_task(self._maintain_forever(registry))
            if self._publisher is None:
                self._publisher = Publisher(settings.REDIS_URL, settings.NEXUS_REDIS_PREFIX)
            self._publisher.start(
                lambda process: self.readings(registry.snapshot, process),
                lambda session, prefix: self.affinity(session, prefix, time.monotonic()),
                self._counters.take,
            )

    async def aclose(self) -> None:
        """Stop background work and write what is buffered."""
        if self._maintenance is not None:
            self._maintenance.cancel()
            self._maintenance = None
        # The routing history first: it is what the requests left behind. Its own bound covers
        # its last shipment to Redis and then writing the rest to the database.
        await stop_part(self._history.aclose(), "routing history", HISTORY_STOP_S)
        if self._publisher is not None:
            await stop_part(self._publisher.aclose(), "live-state publisher")
        await stop_part(self._ledger.aclose(), "load ledger")

    def _queue(self, pool: PoolEntry, kind: str) -> PoolQueue:
        """Return the queue of the pool's requests of this kind, sized by its current setting."""
        key = (pool.id, kind)
        found = self._queues.get(key)
        if found is None or found.fair.max_size != pool.max_queue:
            replaced, found = found, PoolQueue(pool.max_queue)
            self._queues[key] = found
            if replaced is not None:
                # Waiters of a resized queue decide again, and wait again first in line.
                while replaced.wake_next():
                    pass
        return found

    async def _maintain_forever(self, registry: Registry) -> None:
        last_scrape = 0.0
        version = registry.snapshot.version
        while True:
            await asyncio.sleep(MAINTENANCE_INTERVAL_S)
            snapshot = registry.snapshot
            if snapshot.version != version:
                # A target's address may have changed: ask every one for /metrics again.
                version = snapshot.version
                self._engine_loads.forget_unsupported()
            try:
                await self._ledger.refresh(
                    [target.id for pool in snapshot.pools.values() for target in pool.targets]
                )
                now = time.monotonic()
                if now - last_scrape >= SCRAPE_INTERVAL_S:
                    last_scrape = now
                    await self._scrape(snapshot)
                self._wake_queues(snapshot, now)
                await self._finish_drains(snapshot)
            except Exception:
                log.exception("gateway maintenance failed; retrying")

    async def _scrape(self, snapshot: Snapshot) -> None:
        targets = [
            (target.id, target.base_url)
            for pool in snapshot.pools.values()
            for target in pool.targets
            if target.enabled
        ]
        await self._engine_loads.scrape(
            upstream.get().client, targets, self._ledger.in_flight, self._started.__getitem__
        )
        pairs = [
            (pool.slug, target.name) for pool in snapshot.pools.values() for target in pool.targets
        ]
        metrics.retain(pairs)
        for pool in snapshot.pools.values():
            for target in pool.targets:
                metrics.set_in_flight(pool.slug, target.name, self._ledger.in_flight(target.id))
            self._report_queued(pool)

    def _report_queued(self, pool: PoolEntry) -> None:
        """Set the pool's queued gauge: as requests join and leave, and on every scrape."""
        queued = sum(len(q) for (pool_id, _), q in self._queues.items() if pool_id == pool.id)
        metrics.set_queued(pool.slug, queued)

    def _wake_queues(self, snapshot: Snapshot, now: float) -> None:
        """Wake waiters when a target has room that another process (or a drain) freed."""
        pools = {pool.id: pool for pool in snapshot.pools.values()}
        for (pool_id, kind), queue in self._queues.items():
            pool = pools.get(pool_id)
            if pool is None or not queue:
                continue
            for view in self.views(pool, now):
                if not (
                    kind in view.kinds
                    and view.enabled
                    and view.drain is DrainState.ACTIVE
                    and not view.circuit_open
                ):
                    continue
                for _ in range(view.capacity - view.in_flight):
                    if not queue.wake_for(view.id, view.name):
                        break
                if not queue:
                    break

    async def _finish_drains(self, snapshot: Snapshot) -> None:
        """Mark draining targets drained once nothing is in flight on them."""
        empty = [
            target.id
            for pool in snapshot.pools.values()
            for target in pool.targets
            if target.drain is DrainState.DRAINING and self._ledger.in_flight(target.id) == 0
        ]
        if empty:
            await sync_to_async(services.mark_drained)(empty)
