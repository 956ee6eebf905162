"""The cross-app entry of pools: operations other apps and commands may call."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db import transaction

from pools.models import Pool, Target


def pool_slugs() -> set[str]:
    """Return every pool's slug (client tokens are scoped by them)."""
    return set(Pool.objects.values_list("slug", flat=True))


DEMO_POOL_SLUG = "demo"
DEMO_MODEL = "demo-8b"


@dataclass(frozen=True)
class DemoEngine:
    """One simulated engine of the demo pool: its name and its speed."""

    name: str
    ttft_ms: int
    tpot_ms: int
    concurrency: int


# Unequal on purpose, so the demo shows the balancer preferring the engine with the shorter wait.
DEMO_ENGINES = (
    DemoEngine("fast", ttft_ms=40, tpot_ms=8, concurrency=8),
    DemoEngine("medium", ttft_ms=80, tpot_ms=15, concurrency=6),
    DemoEngine("slow", ttft_ms=150, tpot_ms=30, concurrency=4),
)


@transaction.atomic
def ensure_demo_pool(ports: Sequence[int]) -> tuple[Pool, bool]:
    """Create the demo pool over simulators on these ports unless it exists; say if created."""
    if len(ports) != len(DEMO_ENGINES):
        raise ValueError(f"the demo pool needs {len(DEMO_ENGINES)} ports, got {list(ports)}")
    pool, created = Pool.objects.get_or_create(
        slug=DEMO_POOL_SLUG,
        defaults={
            "name": "Demo",
            "description": "Three simulated engines of different speeds, started by `make run`.",
        },
    )
    if not created:
        # The operator may have edited or emptied the pool since: never undo their changes.
        return pool, False
    for position, (engine, port) in enumerate(zip(DEMO_ENGINES, ports, strict=True)):
        Target.objects.create(
            pool=pool,
            name=engine.name,
            base_url=f"http://127.0.0.1:{port}/v1",
            model_id=DEMO_MODEL,
            # Capacity weight never exceeds what the engine really runs at once (DESIGN.md).
            capacity_weight=engine.concurrency,
            position=position,
        )
    return pool, True
