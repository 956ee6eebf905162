"""Dry run and replay: what the balancer would decide now, routing nothing.

Decisions use this process's live gateway state (in-flight counts, health, speed, affinity) when
a gateway runs here, read on its own event loop so nothing is touched from another thread;
otherwise they use the configuration at rest (nothing in flight, no history of speed).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

from pools.balancer.snapshot import Decision, RequestFacts
from pools.gateway.ledger import MemoryLedger
from pools.gateway.snapshot import explain_unavailable, pool_entry
from pools.gateway.state import GatewayState, current
from pools.models import Pool, RoutingRecord

T = TypeVar("T")
LIVE_STATE_TIMEOUT_S = 5.0


def dry_run(pool: Pool, *, kind: str, headers: dict[str, str], body: dict[str, Any]) -> dict:
    """Return the ranking the pool's strategy would produce now for a sample request."""
    entry = pool_entry(pool)

    def explain(state: GatewayState) -> tuple[RequestFacts, Decision]:
        facts, _, _ = state.request_facts(entry, kind, headers, body, time.monotonic())
        return facts, state.decide_now(entry, facts)

    (facts, decision), live = _on_gateway(explain)
    ranking = decision.to_dict()
    explain_unavailable(entry, ranking["skipped"])
    return {"pool": pool.slug, "live": live, "request": _facts(facts), **ranking}


def replay(record: RoutingRecord) -> dict:
    """Re-rank a past request against the current configuration and state; say what changed."""
    asked = record.decision.get("request", {})
    facts = RequestFacts(
        kind=record.kind,
        sticky_target_id=asked.get("sticky_target_id"),
        prefix_target_id=asked.get("prefix_target_id"),
    )
    entry = pool_entry(record.pool)
    decision, live = _on_gateway(lambda state: state.decide_now(entry, facts))
    then_target = record.decision.get("target_id", record.target_id)
    now = decision.to_dict()
    explain_unavailable(entry, now["skipped"])
    return {
        "request_id": record.request_id,
        "live": live,
        "then": record.decision,
        "now": {"request": _facts(facts), **now},
        "changed": then_target != decision.target_id,
    }


def _on_gateway(work: Callable[[GatewayState], T]) -> tuple[T, bool]:
    state = current()
    loop = state.loop if state is not None else None
    if state is not None and loop is not None and loop.is_running():

        async def on_loop() -> T:
            return work(state)

        future = asyncio.run_coroutine_threadsafe(on_loop(), loop)
        return future.result(timeout=LIVE_STATE_TIMEOUT_S), True
    return work(GatewayState(ledger=MemoryLedger())), False


def _facts(facts: RequestFacts) -> dict[str, Any]:
    return {
        "kind": facts.kind,
        "sticky_target_id": facts.sticky_target_id,
        "prefix_target_id": facts.prefix_target_id,
    }
