"""Tests of the balancer's pure core: no database, no network. Shared builders live here."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from pools.balancer.snapshot import Decision, PoolPolicy, RequestFacts, TargetView
from pools.balancer.strategies import decide

ALL_KINDS = frozenset({"chat", "completions", "embeddings"})


def target(target_id: int, **fields: Any) -> TargetView:
    """Return a healthy, idle tier-1 target of capacity 4, named t<id>, in id order."""
    values: dict[str, Any] = {
        "id": target_id,
        "name": f"t{target_id}",
        "priority": 1,
        "capacity": 4,
        "position": target_id,
        "kinds": ALL_KINDS,
        "model_id": "demo-8b",
    }
    values.update(fields)
    return TargetView(**values)


def route(
    targets: Sequence[TargetView],
    strategy: str = "smart",
    *,
    kind: str = "chat",
    sticky: int | None = None,
    prefix: int | None = None,
    threshold: float = 0.25,
    continuity: bool = True,
    turn: int = 0,
    exclude: frozenset[int] = frozenset(),
    seed: int = 0,
) -> Decision:
    """Return the decision for one request with these facts."""
    return decide(
        targets,
        PoolPolicy(
            strategy=strategy, continuity_enabled=continuity, continuity_threshold=threshold
        ),
        RequestFacts(kind=kind, sticky_target_id=sticky, prefix_target_id=prefix),
        rng=random.Random(seed),
        turn=turn,
        exclude=exclude,
    )


def ranked_ids(decision: Decision) -> list[int]:
    """Return the ranking's target ids, best first."""
    return [ranked.target_id for ranked in decision.ranking]


def skipped_reasons(decision: Decision) -> dict[int, str]:
    """Return each skipped target's reason by id."""
    return {skip.target_id: skip.reason.value for skip in decision.skipped}
