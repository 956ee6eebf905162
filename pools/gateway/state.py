"""A gateway process's live state: load, health, speed, affinity and queues, kept off the database.

The balancer core decides from TargetViews built here, per request, from the configuration
snapshot and these in-memory readings. Background work (engine scrapes, shared-ledger refreshes,
finishing drains, waking queues that another process freed room for) runs in one maintenance
task so that the request path does no I/O besides the ledger's acquire and release.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import defaultdict

from asgiref.sync import sync_to_async

from nexus import upstream
from pools import services
from pools.balancer.continuity import AffinityMap, continuity_key, prefix_fingerprint
from pools.balancer.health import LatencyStats, PassiveHealth
from pools.balancer.queue import PoolQueue
from pools.balancer.retry import RetryBudget
from pools.balancer.snapshot import Decision, DrainState, RequestFacts, TargetView
from pools.balancer.strategies import decide
from pools.gateway import metrics
from pools.gateway.engine_metrics import SCRAPE_INTERVAL_S, EngineLoads
from pools.gateway.history import HistoryWriter
from pools.gateway.ledger import LedgerUnavailable, LoadLedger, build_ledger
from pools.gateway.registry import Registry
from pools.gateway.snapshot import PoolEntry, Snapshot, TargetEntry

log = logging.getLogger(__name__)

# A target that served a request this recently counts as warm (its model is loaded).
WARM_WINDOW_S = 300.0
# How often waiting queues are checked for room freed elsewhere, and shared counts refreshed.
MAINTENANCE_INTERVAL_S = 0.25
# Conversations and prompt prefixes remembered per process.
SESSION_ENTRIES, SESSION_TTL_S = 100_000, 1800.0
PREFIX_ENTRIES, PREFIX_TTL_S = 50_000, 600.0


_current: GatewayState | None = None


def current() -> GatewayState | None:
    """Return the state of this process's running gateway, if it has served a request."""
    return _current


class GatewayState:
    """Everything a gateway process knows about its targets beyond their configuration."""

    def __init__(self, ledger: LoadLedger | None = None, history: HistoryWriter | None = None):
        self.ledger = ledger or build_ledger()
        self.history = history or HistoryWriter()
        self.engine_loads = EngineLoads()
        self.health = PassiveHealth()
        self.latency: defaultdict[int, LatencyStats] = defaultdict(LatencyStats)
        self.sessions = AffinityMap(max_entries=SESSION_ENTRIES, ttl_s=SESSION_TTL_S)
        self.prefixes = AffinityMap(max_entries=PREFIX_ENTRIES, ttl_s=PREFIX_TTL_S)
        # One queue per pool and request kind: an embeddings request never waits behind chat
        # requests that wait for chat-only targets.
        self.queues: dict[tuple[int, str], PoolQueue] = {}
        self.turns: defaultdict[int, int] = defaultdict(int)
        self.active: defaultdict[int, int] = defaultdict(int)  # requests in progress per pool
        self.budget = RetryBudget()
        self.last_served: dict[int, float] = {}
        self.rng = random.Random()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._maintenance: asyncio.Task[None] | None = None

    def request_facts(
        self,
        pool: PoolEntry,
        kind: str,
        headers: dict[str, str],
        payload: dict[str, object],
        now: float,
    ) -> tuple[RequestFacts, str | None, str | None]:
        """Return what the balancer needs to know of a request, and its continuity keys."""
        if not pool.policy.continuity_enabled:
            return RequestFacts(kind=kind), None, None
        session_key = continuity_key(pool.slug, headers, payload)
        prefix_key = prefix_fingerprint(pool.slug, payload, kind)
        facts = RequestFacts(
            kind=kind,
            sticky_target_id=self.sessions.get(session_key, now) if session_key else None,
            prefix_target_id=self.prefixes.get(prefix_key, now) if prefix_key else None,
        )
        return facts, session_key, prefix_key

    def decide_now(self, pool: PoolEntry, facts: RequestFacts) -> Decision:
        """Return the decision the pool would make now, routing nothing (dry run, replay)."""
        return decide(
            self.views(pool, time.monotonic()),
            pool.policy,
            facts,
            rng=random.Random(0),
            turn=self.turns[pool.id],
        )

    def views(self, pool: PoolEntry, now: float) -> list[TargetView]:
        """Return the pool's targets as the balancer sees them now."""
        views = []
        for target in pool.targets:
            load = self.engine_loads.fresh(target.id, now)
            stats = self.latency.get(target.id)
            served = self.last_served.get(target.id)
            views.append(
                TargetView(
                    id=target.id,
                    name=target.name,
                    priority=target.priority,
                    capacity=target.capacity,
                    position=target.position,
                    kinds=target.kinds,
                    model_id=target.model_id,
                    enabled=target.enabled,
                    drain=target.drain,
                    health=target.health,
                    circuit_open=self.health.circuit_open(target.id, now),
                    in_flight=self.ledger.in_flight(target.id),
                    engine_running=load.running if load else None,
                    engine_waiting=load.waiting if load else None,
                    ttft_s=stats.ttft_s if stats else None,
                    tpot_s=stats.tpot_s if stats else None,
                    error_rate=self.health.error_rate(target.id),
                    warm=served is not None and now - served < WARM_WINDOW_S,
                )
            )
        return views

    def queue(self, pool: PoolEntry, kind: str) -> PoolQueue:
        """Return the queue of the pool's requests of this kind, sized by its current setting."""
        key = (pool.id, kind)
        found = self.queues.get(key)
        if found is None or found.fair.max_size != pool.max_queue:
            replaced, found = found, PoolQueue(pool.max_queue)
            self.queues[key] = found
            if replaced is not None:
                # Waiters of a resized queue decide again, and wait again first in line.
                while replaced.wake_next():
                    pass
        return found

    def freed(self, pool: PoolEntry, target: TargetEntry) -> None:
        """Hand a slot freed on the target to a waiter that can use it."""
        for kind in target.kinds:
            queue = self.queues.get((pool.id, kind))
            if queue:
                queue.wake_next()

    def start(self, registry: Registry) -> None:
        """Start the maintenance task (once, on the first request)."""
        global _current
        if self._maintenance is None:
            self.loop = asyncio.get_running_loop()
            self._maintenance = asyncio.create_task(self._maintain_forever(registry))
            _current = self

    async def aclose(self) -> None:
        """Stop background work and write what is buffered."""
        if self._maintenance is not None:
            self._maintenance.cancel()
            self._maintenance = None
        await self.history.aclose()
        await self.ledger.aclose()

    async def _maintain_forever(self, registry: Registry) -> None:
        last_scrape = 0.0
        version = registry.snapshot.version
        while True:
            await asyncio.sleep(MAINTENANCE_INTERVAL_S)
            snapshot = registry.snapshot
            if snapshot.version != version:
                # A target's address may have changed: ask every one for /metrics again.
                version = snapshot.version
                self.engine_loads.forget_unsupported()
            try:
                await self.ledger.refresh(
                    [target.id for pool in snapshot.pools.values() for target in pool.targets]
                )
                now = time.monotonic()
                if now - last_scrape >= SCRAPE_INTERVAL_S:
                    last_scrape = now
                    await self._scrape(snapshot)
                self._wake_queues(snapshot, now)
                await self._finish_drains(snapshot)
            except LedgerUnavailable:
                log.warning("load ledger unreachable; keeping the last known counts")
            except Exception:
                log.exception("gateway maintenance failed; retrying")

    async def _scrape(self, snapshot: Snapshot) -> None:
        targets = [
            (target.id, target.base_url)
            for pool in snapshot.pools.values()
            for target in pool.targets
            if target.enabled
        ]
        await self.engine_loads.scrape(upstream.get().client, targets)
        pairs = [
            (pool.slug, target.name) for pool in snapshot.pools.values() for target in pool.targets
        ]
        metrics.retain(pairs)
        for pool in snapshot.pools.values():
            for target in pool.targets:
                metrics.set_in_flight(pool.slug, target.name, self.ledger.in_flight(target.id))
            queued = sum(len(q) for (pool_id, _), q in self.queues.items() if pool_id == pool.id)
            metrics.set_queued(pool.slug, queued)

    def _wake_queues(self, snapshot: Snapshot, now: float) -> None:
        """Wake waiters when a target has room that another process (or a drain) freed."""
        for (pool_id, kind), queue in self.queues.items():
            pool = next((p for p in snapshot.pools.values() if p.id == pool_id), None)
            if pool is None or not queue:
                continue
            room = sum(
                max(0, view.capacity - view.in_flight)
                for view in self.views(pool, now)
                if kind in view.kinds
                and view.enabled
                and view.drain is DrainState.ACTIVE
                and not view.circuit_open
            )
            for _ in range(room):
                if not queue.wake_next():
                    break

    async def _finish_drains(self, snapshot: Snapshot) -> None:
        """Mark draining targets drained once nothing is in flight on them."""
        empty = [
            target.id
            for pool in snapshot.pools.values()
            for target in pool.targets
            if target.drain is DrainState.DRAINING and self.ledger.in_flight(target.id) == 0
        ]
        if empty:
            await sync_to_async(services.mark_drained)(empty)
