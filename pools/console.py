"""What a pool's page shows of its targets now: configuration joined with the gateways' live state.

The pool page's live card is re-rendered about once a second from `pool_live_context`, for the
first render and every tick alike (docs/pools-console.md). Each row says the truth in the words of
`nexus.ui.badges`: a drained, ejected or node-offline target never reads "Healthy".
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from nexus.ui import badges
from pools import live
from pools.balancer.health import CircuitReport
from pools.gateway.publish import TargetReading
from pools.models import Pool, Target, TargetHealth, TargetState


@dataclass(frozen=True)
class TargetRow:
    """One target as the pool page shows it now."""

    target: Target
    # Every badge that is not plain good news, worst first; the one "Active" badge when all is well.
    badges: list[badges.Badge]
    in_flight: int
    capacity: int
    engine_running: int | None
    engine_waiting: int | None
    ttft_ms: float | None
    error_rate: float | None  # None: no gateway has routed to it yet
    resumable: bool  # draining or drained, so that Resume applies


def health_of(target: Target, circuit: CircuitReport | None) -> tuple[str, dict[str, Any]]:
    """Return the target's health state and its facts: the probes' verdict or an open circuit."""
    if target.health == TargetHealth.UNHEALTHY or (circuit is not None and circuit.probe_failing):
        return TargetHealth.UNHEALTHY.value, {}
    if circuit is not None:
        # Half-open with its trial out has no time left to wait: the trial is the next verdict.
        return "ejected", {"trial_in_s": circuit.trial_in_s, "cause": circuit.cause}
    return str(target.health), {}


def node_facts(target: Target) -> dict[str, Any]:
    """Return what `badges.health` takes of the target's node; nothing for a target on none."""
    node = target.node
    if node is None:
        return {}
    return {
        "node_trust": node.trust,
        "node_status": node.status,
        "node_since": node.status_changed_at,
        "node_error": node.last_error,
    }


def target_badges(target: Target, reading: TargetReading, now: datetime) -> list[badges.Badge]:
    """Return the badges of a target's row: its traffic state and health that are not good
    news, worst first, or its one good state."""
    state = badges.target(target.state, enabled=target.enabled, in_flight=reading.in_flight)
    health, facts = health_of(target, reading.circuit)
    health_badge = badges.health(health, now=now, **facts, **node_facts(target))
    shown = sorted(
        (badge for badge in (state, health_badge) if badge.tone != badges.Tone.OK),
        key=lambda badge: -badge.severity,
    )
    return shown or [state]


def target_rows(targets: list[Target], state: live.LiveState, now: datetime) -> list[TargetRow]:
    """Return each target's row from its configuration and the merged live state."""
    rows = []
    for target in targets:
        reading = state.targets.get(target.id) or TargetReading(in_flight=0)
        routed = reading.ttft_s is not None or reading.last_served_at is not None
        rows.append(
            TargetRow(
                target=target,
                badges=target_badges(target, reading, now),
                in_flight=reading.in_flight,
                capacity=target.capacity_weight,
                engine_running=reading.engine_running,
                engine_waiting=reading.engine_waiting,
                ttft_ms=reading.ttft_s * 1000 if reading.ttft_s is not None else None,
                error_rate=reading.error_rate if routed or reading.error_rate else None,
                resumable=target.state != TargetState.ACTIVE,
            )
        )
    return rows


def pool_targets(pool: Pool) -> list[Target]:
    """Return the pool's targets with their nodes, in the balancer's order."""
    return list(Target.objects.filter(pool=pool).select_related("node"))


def pool_live_context(pool: Pool, *, can_manage: bool) -> dict[str, Any]:
    """Return what the pool page's live card needs, for the first render and every tick."""
    targets = pool_targets(pool)
    state = live.live_state([target.id for target in targets])
    return {
        "pool": pool,
        "rows": target_rows(targets, state, datetime.now(UTC)),
        "queued": state.queued.get(pool.id, 0),
        "gateways": state.gateways,
        "in_flight": sum(reading.in_flight for reading in state.targets.values()),
        "capacity": sum(target.capacity_weight for target in targets if target.enabled),
        "draining": any(target.state != TargetState.ACTIVE for target in targets),
        "can_manage": can_manage,
    }
