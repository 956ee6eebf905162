"""The cross-app entry of pools: operations other apps and commands may call."""

from __future__ import annotations

import random
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import httpx
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F, Sum
from django.utils import timezone

from nexus.models import DEFAULT_PROJECT, ApiToken, project_named
from nexus.ui import format as ui_format
from nodes.models import NodeStatus, NodeTrust
from pools import live, traffic, validation
from pools.balancer.continuity import continuity_keys
from pools.balancer.snapshot import Decision, RequestFacts
from pools.balancer.strategies import decide
from pools.gateway.snapshot import PoolEntry, pool_entry
from pools.models import (
    CompatibilityMode,
    Pool,
    RoutingRecord,
    Target,
    TargetHealth,
    TargetState,
    TokenUsage,
    TrafficRun,
    TrafficRunStatus,
    all_request_kinds,
)

if TYPE_CHECKING:
    from nodes.models import Node


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


# -- dry run and replay: what the balancer would decide now, from any process ------------------


def dry_run(
    pool: Pool, *, kind: str, headers: Mapping[str, str], body: Mapping[str, Any]
) -> dict[str, Any]:
    """Return the ranking the pool's strategy would produce now for a sample request.

    Nothing is routed. The targets' live state is what every gateway process published
    (pools.live), so the answer is the same whichever process the call lands in; `live` says
    whether any gateway process was seen (else the configuration at rest: nothing in flight).
    """
    entry = pool_entry(pool)
    state = live.live_state([target.id for target in entry.targets])
    enabled = entry.policy.continuity_enabled
    session_key, prefix_key = continuity_keys(entry.slug, enabled, kind, headers, body)
    sticky, prefixed = live.ask_affinity(state.processes, session_key, prefix_key)
    facts = RequestFacts(kind=kind, sticky_target_id=sticky, prefix_target_id=prefixed)
    return {
        "pool": pool.slug,
        "live": state.gateways > 0,
        "gateways": state.gateways,
        "request": _facts(facts),
        **_decide_now(entry, facts, state).to_dict(),
        "tiers": _every_tier(entry, facts, state),
    }


def _every_tier(
    entry: PoolEntry, facts: RequestFacts, state: live.LiveState
) -> list[dict[str, Any]]:
    """Return how each tier would rank its targets were it the one to take the request.

    The decision itself ranks only the tier that takes the request; an operator also wants to
    see what the tiers above it would do once it is full or gone. Each tier is decided alone,
    so the ejection cap counts that tier's capacity only.
    """
    views = [state.view(target) for target in entry.targets]
    tiers = sorted({view.priority for view in views})
    ranked = []
    for tier in tiers:
        alone = decide(
            [view for view in views if view.priority == tier],
            entry.policy,
            facts,
            rng=random.Random(0),
            turn=state.turns.get(entry.id, 0),
        ).to_dict()
        ranked.append({"tier": tier, "ranking": alone["ranking"], "skipped": alone["skipped"]})
    return ranked


def replay(record: RoutingRecord) -> dict[str, Any]:
    """Re-rank a past request against the current configuration and live state; say what changed."""
    asked = record.decision.get("request", {})
    facts = RequestFacts(
        kind=record.kind,
        sticky_target_id=asked.get("sticky_target_id"),
        prefix_target_id=asked.get("prefix_target_id"),
    )
    entry = pool_entry(record.pool)
    state = live.live_state([target.id for target in entry.targets])
    decision = _decide_now(entry, facts, state)
    # The request as it arrived: a retried one's first ranking, before any target was tried
    # (its latest decision excludes the targets that failed it).
    per_attempt = record.decision.get("per_attempt")
    then = per_attempt[0] if per_attempt else record.decision
    then_target = then.get("target_id", record.target_id)
    return {
        "request_id": record.request_id,
        "live": state.gateways > 0,
        "gateways": state.gateways,
        "then": then,
        "now": {"request": _facts(facts), **decision.to_dict()},
        "changed": then_target != decision.target_id,
    }


def _decide_now(entry: PoolEntry, facts: RequestFacts, state: live.LiveState) -> Decision:
    """Return the pool's decision now from the gateways' merged live state, routing nothing."""
    return decide(
        [state.view(target) for target in entry.targets],
        entry.policy,
        facts,
        rng=random.Random(0),
        turn=state.turns.get(entry.id, 0),
    )


def _facts(facts: RequestFacts) -> dict[str, Any]:
    return {
        "kind": facts.kind,
        "sticky_target_id": facts.sticky_target_id,
        "prefix_target_id": facts.prefix_target_id,
    }


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
        # update() sends no signals: tell the pages ourselves (the gateways hear of it from
        # Target's queryset).
        transaction.on_commit(live.pools_changed, robust=True)
    return changed


def resume_refusal(target: Target) -> str:
    """Return why the target may not return to service now; empty when its health allows it.

    The probes' verdict, its node's state and every gateway's circuit count: a target that
    traffic would eject again at once stays out.
    """
    node = target.node
    if node is not None and node.trust != NodeTrust.TRUSTED:
        return f"{target.name}'s node {node.name} is not trusted."
    if node is not None and node.status == NodeStatus.OFFLINE:
        why = f": {node.last_error}" if node.last_error else ""
        return f"{target.name}'s node {node.name} is offline{why}."
    if target.health == TargetHealth.UNHEALTHY:
        return f"{target.name} fails its health probes."
    circuit = live.live_state([target.id]).targets[target.id].circuit
    if circuit is not None:
        return f"{target.name} is ejected ({circuit.detail})."
    return ""


def resume_target(target: Target, *, timeout_s: float = 3.0) -> Target:
    """Return a draining or drained target to service, once it is healthy and answers its model
    list again."""
    if target.state == TargetState.ACTIVE:
        return target
    if refusal := resume_refusal(target):
        raise CannotResume(refusal)
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


def drain_pool(pool: Pool) -> list[Target]:
    """Drain every active target of the pool; return those that began draining."""
    started = []
    for target in pool.targets.filter(state=TargetState.ACTIVE):
        started.append(drain_target(target))
    return started


def resume_pool(pool: Pool) -> tuple[list[Target], list[str]]:
    """Resume every draining or drained target of the pool that may; return those resumed and
    why each other one was refused."""
    resumed, refusals = [], []
    for target in pool.targets.exclude(state=TargetState.ACTIVE).select_related("node"):
        try:
            resumed.append(resume_target(target))
        except CannotResume as refusal:
            refusals.append(str(refusal))
    return resumed, refusals


# -- editing a pool and its targets: the pool page and the admin API alike ----------------------

# What an operator changes of a target in place (the pool page's inline edit).
TRAFFIC_FIELDS = ("priority", "capacity_weight", "enabled")


def create_pool(fields: Mapping[str, Any]) -> Pool:
    """Create a pool (its slug is fixed from now on); its targets come next."""
    return Pool.objects.create(**fields)


def add_target(pool: Pool, fields: Mapping[str, Any], *, credential: str = "") -> Target:
    """Add a target to the pool, its credential stored encrypted (never shown again).

    Raises ValidationError (on `model_id`) when the pool is Exact replicas and what is stored
    says the target serves another model than the pool's targets (`identity_refusal`).
    """
    target = Target(pool=pool, **fields)
    refuse_other_identity(target)
    target.set_credential(credential)
    target.save()
    return target


def update_target(
    target: Target, changes: Mapping[str, Any], *, credential: str | None = None
) -> Target:
    """Change a target's fields (a credential given replaces the stored one; "" removes it).

    Raises ValidationError as add_target does when a changed model id or node makes it serve
    another model than the rest of an Exact-replicas pool.
    """
    for name, value in changes.items():
        setattr(target, name, value)
    if {"model_id", "node", "node_id"} & set(changes):
        refuse_other_identity(target)
    if credential is not None:
        target.set_credential(credential)
    target.save()
    return target


def identity_refusal(target: Target) -> str:
    """Return why this (new or changed) target may not serve in its Exact-replicas pool, ""
    when it may: its configured model id, or its node's digest of the model file, differs
    from the pool's other targets' (pools.validation.identity_refusal). Reads only what is
    stored: no target is asked anything at save time."""
    pool = target.pool
    if pool.compatibility_mode != CompatibilityMode.EXACT_REPLICAS:
        return ""
    others = pool.targets.select_related("node")
    if target.pk is not None:
        others = others.exclude(pk=target.pk)
    return validation.identity_refusal(
        validation.identity_of(target), [validation.identity_of(other) for other in others]
    )


def refuse_other_identity(target: Target) -> None:
    """Raise ValidationError (on `model_id`) when `identity_refusal` names a reason."""
    refusal = identity_refusal(target)
    if refusal:
        raise ValidationError({"model_id": refusal})


def remove_target(target: Target) -> None:
    """Remove a target: requests in flight finish; its history keeps its name."""
    target.delete()


def update_pool_settings(pool: Pool, changes: Mapping[str, Any]) -> Pool:
    """Change a pool's settings (its slug stays: apps call it).

    Raises ValidationError (on `compatibility_mode`) when the pool becomes Exact replicas while
    what is stored says its targets serve different models.
    """
    becomes_exact = (
        changes.get("compatibility_mode", pool.compatibility_mode)
        == CompatibilityMode.EXACT_REPLICAS
        and pool.compatibility_mode != CompatibilityMode.EXACT_REPLICAS
    )
    if becomes_exact:
        targets = pool.targets.select_related("node")
        refusal = validation.mode_refusal([validation.identity_of(t) for t in targets])
        if refusal:
            raise ValidationError({"compatibility_mode": refusal})
    for name, value in changes.items():
        setattr(pool, name, value)
    pool.save()
    return pool


# -- Try traffic and the failure drill: real requests, run by a worker (pools.traffic) ----------


def start_traffic(
    pool: Pool, kind: str, params: Mapping[str, Any], user: Any, *, target: Target | None = None
) -> TrafficRun:
    """Store a Try traffic or drill run and queue it once committed; return the row."""
    wanted = dict(params)
    if target is not None:
        wanted.update(target_id=target.pk, target_name=target.name)
    run = TrafficRun.objects.create(
        pool=pool, kind=kind, params=wanted, created_by=user if getattr(user, "pk", None) else None
    )
    # Imported here: the tasks module imports this one.
    from pools.tasks import run_traffic

    transaction.on_commit(lambda: run_traffic.delay(run.pk))
    return run


def run_claimed(run_id: int) -> str:
    """Run a queued traffic run, claimed atomically: a duplicate delivery does nothing."""
    claimed = TrafficRun.objects.filter(pk=run_id, status=TrafficRunStatus.QUEUED).update(
        status=TrafficRunStatus.RUNNING, started_at=timezone.now()
    )
    run = TrafficRun.objects.select_related("pool__project", "created_by").filter(pk=run_id).first()
    if not claimed or run is None:
        return "not queued"
    traffic.execute(run)
    return run.status


# -- managed pools: a model service's replicas (serving.pool_sync keeps them in step) ---------


class PoolConflict(Exception):
    """A pool of the service's name exists and no service owns it."""


@dataclass(frozen=True)
class ManagedTarget:
    """What one replica's target should be; `draining` while the replica leaves traffic."""

    node: Node
    base_url: str
    model_id: str
    capacity: int
    health: str = TargetHealth.HEALTHY
    position: int = 0
    draining: bool = False


def ensure_managed_pool(slug: str, name: str, project: str = DEFAULT_PROJECT) -> Pool:
    """Return the managed pool of this slug, created in the service's project if missing;
    refuse an operator's pool."""
    pool, _ = Pool.objects.get_or_create(
        slug=slug,
        defaults={
            "name": name,
            "project": project_named(project) or project_named(DEFAULT_PROJECT),
            "managed": True,
            "compatibility_mode": CompatibilityMode.EXACT_REPLICAS,
            "description": f"The replicas of model service {name}.",
        },
    )
    if not pool.managed:
        raise PoolConflict(f"the pool {slug} exists and belongs to no service; rename it")
    return pool


@transaction.atomic
def set_managed_targets(pool: Pool, wanted: Mapping[str, ManagedTarget]) -> dict[str, Target]:
    """Make the managed pool's targets exactly `wanted` (by target name); return them by name.

    Saved with bulk writes, not `Target.save()`, which would point a node target at the node's
    /v1: a replica is reached at its own process's URL on the agent. The bulk writes announce
    themselves to the gateways (Target's queryset); pages are told only when something changed.
    """
    # Locks the pool's row (where the database can) so that two callers (the reconciler and the
    # health probes) never both create one target.
    locked = Pool.objects.select_for_update().filter(pk=pool.pk, managed=True).values("pk")
    if not locked:
        return {}  # dropped meanwhile: its service is gone
    existing = {target.name: target for target in pool.targets.all()}
    now = timezone.now()
    gone = [target.pk for name, target in existing.items() if name not in wanted]
    created, changed = [], []
    for name, spec in wanted.items():
        target = existing.get(name)
        if target is None:
            target = Target(pool=pool, name=name, kinds=all_request_kinds(), state_changed_at=now)
            created.append(target)
        elif not _differs(target, spec):
            continue
        else:
            changed.append(target)
        target.node = spec.node
        target.base_url = spec.base_url
        target.model_id = spec.model_id
        target.capacity_weight = spec.capacity
        target.health = spec.health
        target.position = spec.position
        if spec.draining and target.state == TargetState.ACTIVE:
            target.state, target.state_changed_at = TargetState.DRAINING, now
        elif not spec.draining and target.state != TargetState.ACTIVE:
            target.state, target.state_changed_at = TargetState.ACTIVE, now
        target.updated_at = now
    if gone:
        Target.objects.filter(pk__in=gone).delete()
    Target.objects.bulk_create(created)
    Target.objects.bulk_update(
        changed, [*_MANAGED_FIELDS, "state", "state_changed_at", "updated_at"]
    )
    if gone or created or changed:
        transaction.on_commit(live.pools_changed, robust=True)
    return {target.name: target for target in pool.targets.all()}


_MANAGED_FIELDS = ("node", "base_url", "model_id", "capacity_weight", "health", "position")


def _differs(target: Target, spec: ManagedTarget) -> bool:
    """Say whether a target is not yet what its spec says."""
    stored = (
        target.node_id,
        target.base_url,
        target.model_id,
        target.capacity_weight,
        target.health,
        target.position,
        target.state != TargetState.ACTIVE,
    )
    wanted = (
        spec.node.pk,
        spec.base_url,
        spec.model_id,
        spec.capacity,
        spec.health,
        spec.position,
        spec.draining,
    )
    return stored != wanted


def drain_finished(target_id: int, grace_s: float) -> bool:
    """Say whether a draining target has nothing in flight, or has drained for `grace_s`.

    A gateway marks it drained once none of its requests is left; without a gateway (or with a
    stream that never ends) the grace period bounds the wait.
    """
    target = Target.objects.filter(pk=target_id).first()
    if target is None or target.state == TargetState.DRAINED:
        return True
    if target.state != TargetState.DRAINING or target.state_changed_at is None:
        return False
    return (timezone.now() - target.state_changed_at).total_seconds() >= grace_s


def pool_activity(pool_id: int) -> tuple[int, datetime | None]:
    """Return the requests in the pool now (queued or in flight, over every live gateway) and
    when its latest finished request arrived (None: never, or pruned from history)."""
    targets = list(Target.objects.filter(pool_id=pool_id).values_list("pk", flat=True))
    state = live.live_state(targets)
    busy = state.queued.get(pool_id, 0) + sum(
        reading.in_flight for reading in state.targets.values()
    )
    last = (
        RoutingRecord.objects.filter(pool_id=pool_id)
        .order_by("-created_at")
        .values_list("created_at", flat=True)
        .first()
    )
    return busy, last


def queued_requests() -> dict[int, int]:
    """Return how many requests wait in each pool's queue, over every live gateway."""
    queued: dict[int, int] = {}
    for reading in live.gateway_readings():
        for pool_id, waiting in reading.queued.items():
            queued[pool_id] = queued.get(pool_id, 0) + waiting
    return queued


def drop_managed_pool(pool_id: int) -> None:
    """Delete a managed pool with its targets (its service is gone)."""
    Pool.objects.filter(pk=pool_id, managed=True).delete()


def gateway_health() -> dict[str, Any] | None:
    """Return the health of this process's gateway (its ledger, its revocations), None before
    it served its first request."""
    # Imported here: the gateway's modules import this one.
    from pools.gateway.app import serving_health

    return serving_health()


# -- the tokens page ---------------------------------------------------------------------------

USAGE_WINDOWS = {"day": timedelta(hours=24), "month": timedelta(days=30)}


@dataclass(frozen=True)
class UsageTotals:
    """A token's usage over a window, summed from its hourly rows."""

    requests: int = 0
    errors: int = 0
    tokens: int = 0

    def describe(self) -> list[str]:
        """Say it in a few words, one line each: "12 requests", "1 error", "3,400 tokens"."""
        if not self.requests:
            return []
        parts = [ui_format.count(self.requests, "request")]
        if self.errors:
            parts.append(ui_format.count(self.errors, "error"))
        parts.append(ui_format.count(self.tokens, "token"))
        return parts


def token_usage(token_ids: Sequence[int], now: datetime) -> dict[int, dict[str, UsageTotals]]:
    """Return each token's usage over the last 24 h ("day") and 30 days ("month"): one query each.

    Hours count whole: the day is the 24 hours whose rows started after now - 24 h.
    """
    usage: dict[int, dict[str, UsageTotals]] = {
        token_id: dict.fromkeys(USAGE_WINDOWS, UsageTotals()) for token_id in token_ids
    }
    for window, span in USAGE_WINDOWS.items():
        rows = (
            TokenUsage.objects.filter(token_id__in=token_ids, hour__gt=now - span)
            .values("token_id")
            .annotate(
                requests=Sum("requests"),
                errors=Sum("errors"),
                tokens=Sum(F("prompt_tokens") + F("completion_tokens")),
            )
        )
        for row in rows:
            usage[row["token_id"]][window] = UsageTotals(
                row["requests"] or 0, row["errors"] or 0, row["tokens"] or 0
            )
    return usage


def describe_limits(token: ApiToken) -> list[str]:
    """Name the token's limits ("60 req/min", "10,000 tok/min", "4 at once"); empty for none."""
    limits = []
    if token.requests_per_minute is not None:
        limits.append(f"{ui_format.number(token.requests_per_minute)} req/min")
    if token.tokens_per_minute is not None:
        limits.append(f"{ui_format.number(token.tokens_per_minute)} tok/min")
    if token.max_concurrent is not None:
        limits.append(f"{ui_format.number(token.max_concurrent)} at once")
    return limits


def run_history_writer(stop: threading.Event, consumer: str | None = None) -> int:
    """Write the gateways' history from the Redis stream until `stop`; return the records
    written (pools.history_writer)."""
    from pools import history_writer  # the writer process's own; the web process never needs it

    writer = history_writer.writer(consumer)
    try:
        writer.run(stop)
    finally:
        writer.client.close()
    return writer.written
