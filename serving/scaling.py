"""One autoscaling cycle (`serving.tasks.autoscale`, every NEXUS_AUTOSCALING_INTERVAL_S).

Per active service with rules: collect the samples its rules need (each ready replica's
/metrics, the agents' process usage), read every rule's metric, let the pure evaluator
(serving.autoscaling.decide) decide, record scale events, and scale through
`services.scale_service`: the reconciler's normal path (new replicas take traffic once healthy,
retired ones drain before they stop). A per-service Redis claim keeps two cycles off one service.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from redis.exceptions import RedisError

from nexus.services import redis_client
from pools import services as pool_services
from serving import metrics, services
from serving.autoscaling import (
    DECLINED,
    Decision,
    MetricSource,
    Outcome,
    Reading,
    decide,
    render_query,
)
from serving.models import (
    AutoScalingRule,
    Route,
    RouteState,
    ScaleEvent,
    Service,
    ServiceLifecycle,
)

log = logging.getLogger(__name__)

# A woken service is not woken again this soon (its replica is starting meanwhile).
WAKE_CLAIM_S = 30
# Outcomes recorded once per run of them: a rule stuck in one leaves one row, not one per cycle.
RECORDED_ONCE = DECLINED | {Outcome.NO_DATA}


def autoscale_all(now: datetime | None = None) -> dict[str, int]:
    """Run one cycle over every active service with rules or scale to zero; return how many
    did what."""
    summary: Counter[str] = Counter()
    scaled = Service.objects.filter(
        Q(autoscaling_rules__isnull=False) | Q(scale_to_zero_after_s__isnull=False),
        lifecycle=ServiceLifecycle.ACTIVE,
    ).distinct()
    for service in scaled.order_by("pk"):
        try:
            summary[autoscale(service, now)] += 1
        except Exception:
            # One broken service must not keep the others from being scaled.
            log.exception("autoscaling service %s failed", service.name)
            summary["failed"] += 1
    return dict(summary)


def autoscale(service: Service, now: datetime | None = None) -> str:
    """Run one cycle for the service; return "scaled", "kept" or "busy"."""
    key = f"{settings.NEXUS_REDIS_PREFIX}:autoscaling:claim:{service.pk}"
    interval = settings.NEXUS_AUTOSCALING_INTERVAL_S
    try:
        # SET NX EX: a cycle still running (a slow scrape) keeps the next one off this service.
        if not redis_client().set(key, "1", nx=True, ex=max(int(interval * 3), 5)):
            return "busy"
    except RedisError as error:
        log.warning("not autoscaling %s: no claim without Redis: %s", service.name, error)
        return "busy"
    now = now or timezone.now()
    try:
        if service.scale_to_zero_after_s is not None:
            if service.desired_replicas == 0:
                return "sleeping"  # the wake task wakes it; no rule has a replica to measure
            if sleep_if_idle(service, now):
                return "slept"
        decision = evaluate(service, now)
    finally:
        with suppress(RedisError):  # the claim expires by itself
            redis_client().delete(key)
    return "scaled" if decision is not None and decision.changes else "kept"


def sleep_if_idle(service: Service, now: datetime) -> bool:
    """Scale the service to zero when no request reached it for its idle period; say whether.

    Idle counts from its latest request, or from its latest change (a wake, a scale, an edit)
    when that is later; a request queued or in flight anywhere keeps it awake.
    """
    idle_s = service.scale_to_zero_after_s
    if idle_s is None or service.pool_id is None:
        return False
    busy, last_request = pool_services.pool_activity(service.pool_id)
    since = max(filter(None, (last_request, service.updated_at)))
    idle_for = (now - since).total_seconds()
    if busy or idle_for < idle_s:
        return False
    before = service.desired_replicas
    services.scale_service(service, 0)
    reason = f"no request for {idle_for:.0f} s (at least {idle_s} s): scaled to zero"
    _record_sleep_or_wake(service, before, 0, Outcome.SCALED_IN, reason, None)
    log.info("%s: %s", service.name, reason)
    return True


def wake_sleeping() -> int:
    """Wake every service scaled to zero that a request waits for; return how many woke.

    Runs every serving tick: the waiting request is held in its pool queue (for at most the
    pool's max queue wait) while the woken service's replica starts.
    """
    sleeping = list(
        Service.objects.filter(
            lifecycle=ServiceLifecycle.ACTIVE,
            desired_replicas=0,
            scale_to_zero_after_s__isnull=False,
            pool__isnull=False,
        )
    )
    if not sleeping:
        return 0
    queued = pool_services.queued_requests()
    woken = 0
    for service in sleeping:
        waiting = queued.get(service.pool_id or 0, 0)
        if not waiting:
            continue
        key = f"{settings.NEXUS_REDIS_PREFIX}:autoscaling:wake:{service.pk}"
        try:
            # One waker per sleep: a tick that overlaps this one leaves it alone.
            if not redis_client().set(key, "1", nx=True, ex=WAKE_CLAIM_S):
                continue
        except RedisError as error:
            log.warning("not waking %s: no claim without Redis: %s", service.name, error)
            continue
        services.scale_service(service, 1)
        reason = f"{waiting} request{'' if waiting == 1 else 's'} waiting: woken"
        _record_sleep_or_wake(service, 0, 1, Outcome.SCALED_OUT, reason, float(waiting))
        log.info("%s: %s", service.name, reason)
        woken += 1
    return woken


def _record_sleep_or_wake(
    service: Service, before: int, after: int, outcome: Outcome, reason: str, value: float | None
) -> ScaleEvent:
    return ScaleEvent.objects.create(
        service=service,
        rule=None,
        rule_text=f"scale to zero after {service.scale_to_zero_after_s} s idle",
        metric_source="",
        value=value,
        window_s=0,
        aggregation="",
        replicas_before=before,
        replicas_after=after,
        outcome=outcome,
        reason=reason,
    )


def ready_routes(service: Service) -> list[Route]:
    """Return the service's replicas that serve: healthy, with a process on a node."""
    return list(
        Route.objects.filter(service=service, state=RouteState.HEALTHY, node__isnull=False)
        .exclude(process_id="")
        .select_related("node")
        .order_by("pk")
    )


def evaluate(service: Service, now: datetime) -> Decision | None:
    """Collect, read, decide, record and scale the service once; return the decision."""
    rules = list(service.autoscaling_rules.order_by("pk"))
    if not rules:
        return None
    routes = ready_routes(service)
    sources = {rule.metric_source for rule in rules}
    if MetricSource.INFERENCE_FRAMEWORK in sources:
        metrics.scrape_replicas(routes, now.timestamp())
    if MetricSource.KERNEL in sources:
        metrics.store_kernel_samples(routes)
    readings = {rule.pk: read(rule, routes, now) for rule in rules}
    latest_scaling = (
        service.scale_events.filter(cooldown_until__isnull=False).order_by("-created_at").first()
    )
    cooldown_until = latest_scaling.cooldown_until if latest_scaling else None
    decision = decide(
        service.desired_replicas,
        [rule.as_rule() for rule in rules],
        readings,
        now=now.timestamp(),
        service_cooldown_until=cooldown_until.timestamp() if cooldown_until else None,
    )
    record(service, rules, decision, now)
    if decision.changes:
        services.scale_service(service, decision.desired)
        log.info(
            "autoscaled %s from %d to %d replicas: %s",
            service.name,
            decision.current,
            decision.desired,
            decision.verdict(decision.rule_id or 0).reason if decision.rule_id else "",
        )
    return decision


def read(rule: AutoScalingRule, routes: list[Route], now: datetime) -> Reading:
    """Return the rule's metric over the service's ready replicas and the rule's window."""
    if rule.metric_source == MetricSource.PROMETHEUS:
        query = render_query(
            rule.prometheus_query,
            service=rule.service.name,
            pool=rule.service.name,
            window=f"{rule.window_s}s",
        )
        return metrics.query_prometheus(query).reading(rule.aggregation)
    return metrics.replica_reading(
        rule.metric_source,
        [route.pk for route in routes],
        rule.metric_name,
        window_s=rule.window_s,
        aggregation=rule.aggregation,
        now=now.timestamp(),
    )


def record(
    service: Service, rules: list[AutoScalingRule], decision: Decision, now: datetime
) -> list[ScaleEvent]:
    """Write the cycle's scale events; mark the winning rule triggered when the count changed."""
    by_id = {rule.pk: rule for rule in rules}
    previous = _latest_outcomes(rules)
    events = []
    for verdict in decision.verdicts:
        rule = by_id[verdict.rule_id]
        won = decision.changes and verdict.rule_id == decision.rule_id
        if not won and (
            verdict.outcome not in RECORDED_ONCE or previous.get(rule.pk) == verdict.outcome
        ):
            continue
        events.append(
            ScaleEvent(
                service=service,
                rule=rule,
                rule_text=rule.describe(),
                metric_source=rule.metric_source,
                value=verdict.value,
                series=verdict.series,
                window_s=rule.window_s,
                aggregation=rule.aggregation,
                replicas_before=decision.current,
                replicas_after=decision.desired if won else decision.current,
                outcome=verdict.outcome,
                reason=verdict.reason,
                overruled=list(decision.overruled) if won else [],
                cooldown_until=now + timedelta(seconds=rule.cooldown_s) if won else None,
            )
        )
    with transaction.atomic():
        created = ScaleEvent.objects.bulk_create(events)
        if decision.changes and decision.rule_id is not None:
            AutoScalingRule.objects.filter(pk=decision.rule_id).update(last_triggered_at=now)
    return created


def _latest_outcomes(rules: list[AutoScalingRule]) -> dict[int, str]:
    """Return each rule's latest scale event's outcome."""
    latest: dict[int, str] = {}
    for rule in rules:
        found = rule.events.order_by("-created_at", "-id").values_list("outcome", flat=True)
        outcome = found.first()
        if outcome is not None:
            latest[rule.pk] = outcome
    return latest


class BadRange(ValueError):
    """A rule-list filter's date-time that cannot be read."""

    def __init__(self, name: str, raw: str) -> None:
        super().__init__(f"{raw!r} is not an ISO date-time.")
        self.name = name


# The rule list's filters (the document's property filter): parameter -> lookup.
RANGE_LOOKUPS = {
    "created_after": "created_at__gte",
    "created_before": "created_at__lt",
    "triggered_after": "last_triggered_at__gte",
    "triggered_before": "last_triggered_at__lt",
}


def in_ranges(
    rules: QuerySet[AutoScalingRule], params: Mapping[str, Any]
) -> QuerySet[AutoScalingRule]:
    """Keep the rules within the created-at and last-triggered ranges the parameters give.

    A date-time without a zone is UTC (the pages' datetime-local inputs send such)."""
    for name, lookup in RANGE_LOOKUPS.items():
        raw = params.get(name)
        if not raw:
            continue
        try:
            when = parse_datetime(str(raw))
        except ValueError:
            when = None
        if when is None:
            raise BadRange(name, str(raw))
        if timezone.is_naive(when):
            when = timezone.make_aware(when, UTC)
        rules = rules.filter(**{lookup: when})
    return rules


def preview(service: Service, template: str, window_s: int) -> dict[str, Any]:
    """Run the query for the service now; say what the current-value preview shows."""
    query = render_query(template, service=service.name, pool=service.name, window=f"{window_s}s")
    result = metrics.query_prometheus(query)
    latest = result.latest
    if result.problem or latest is None:
        text = "No data available" + (f" ({result.problem})" if result.problem else "")
        return {"query": query, "series": result.series, "value": None, "at": None, "text": text}
    at, value = latest
    text = f"{value:g}"
    if result.series > 1:
        text = f"{result.series} series, latest {value:g}"
    return {"query": query, "series": result.series, "value": value, "at": at, "text": text}


def sleep_state(service: Service) -> str:
    """Say how a service that scales to zero stands: "asleep", "waking", "awake"; "" if it
    does not scale to zero."""
    if service.scale_to_zero_after_s is None:
        return ""
    if service.desired_replicas == 0:
        return "asleep"
    latest = service.scale_events.order_by("-created_at", "-id").first()
    woke = latest is not None and latest.rule_id is None and latest.replicas_before == 0
    return "waking" if woke and services.ready_replicas(service) == 0 else "awake"
