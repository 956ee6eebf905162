"""The cross-app entry of pools: operations other apps and commands may call."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import httpx
from django.db import transaction
from django.utils import timezone

from nexus.models import ConfigVersion
from pools import live
from pools.models import Pool, Target, TargetState


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


class CannotResume(Exception):
    """A target may return to service only when it answers again."""


def drain_target(target: Target) -> Target:
    """Stop new assignments to the target; it becomes drained when nothing is in flight."""
    if target.state == TargetState.ACTIVE:
        target.state = TargetState.DRAINING
        target.state_changed_at = timezone.now()
        target.save(update_fields=["state", "state_changed_at", "updated_at"])
    return target


def mark_drained(target_ids: list[int]) -> int:
    """Mark these draining targets drained (the gateway saw none of their requests left)."""
    changed = Target.objects.filter(pk__in=target_ids, state=TargetState.DRAINING).update(
        state=TargetState.DRAINED, state_changed_at=timezone.now()
    )
    if changed:
        # update() sends no signals: announce the change to every gateway and page ourselves.
        ConfigVersion.bump()
        transaction.on_commit(live.pools_changed, robust=True)
    return changed


def resume_target(target: Target, *, timeout_s: float = 3.0) -> Target:
    """Return a draining or drained target to service, once it answers its model list again."""
    if target.state == TargetState.ACTIVE:
        return target
    headers = {}
    if credential := target.upstream_credential():
        headers["Authorization"] = f"Bearer {credential}"
    url = target.base_url.rstrip("/") + "/models"
    try:
        response = httpx.get(url, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise CannotResume(
            f"{target.name} does not answer at {url}: {type(exc).__name__}"
        ) from None
    if response.status_code != 200:
        raise CannotResume(f"{target.name} answers {url} with {response.status_code}")
    target.state = TargetState.ACTIVE
    target.state_changed_at = timezone.now()
    target.save(update_fields=["state", "state_changed_at", "updated_at"])
    return target
