"""The Live pages: traffic now and over the last 15 minutes, overall (/live/) and per pool
(/live/<slug>/), pushed about once a second over /ws/live/ (pools.consumers.LivePageConsumer).

One context function serves the first render and every push (docs/live.md). Its sources: the
gateways' published state (pools.live: in flight, queued, circuits, how many gateways), the
counts they add to Redis (pools.live_figures: rates, TTFT, errors, shares, charts), the
targets' configuration and drain state, and the newest history rows (the decisions stream).
"""

from __future__ import annotations

import time
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from nexus import live
from nexus.ui import badges, charts
from pools import history_pages, live_figures
from pools import live as pools_live
from pools.models import Pool, RoutingRecord
from pools.views import visible_pools
from serving import scaling
from serving.models import Service

LIVE_PAGE = "pools/live.html"
LIVE_NOW = f"{LIVE_PAGE}#live-now"
LIVE_CHARTS = f"{LIVE_PAGE}#live-charts"
# Decisions shown in the stream.
STREAM_LENGTH = 12


def watched_pools(user: Any, slug: str | None) -> list[Pool] | None:
    """Return the pools a Live page shows the user (one for a pool's page); None: not theirs."""
    pools = visible_pools(user).order_by("name")
    if slug is None:
        return list(pools)
    pool = pools.filter(slug=slug).first()
    return [pool] if pool is not None else None


def live_context(
    pools: list[Pool], single: bool, cache: live_figures.BucketCache | None = None
) -> dict[str, Any]:
    """Return what the Live page's partials need: figures, targets, pools, decisions, charts.

    cache: the complete buckets an open page's socket has read already.
    """
    now = time.time()
    targets = [target for pool in pools for target in pool.targets.all()]
    state = pools_live.live_state([target.id for target in targets])
    by_pool = live_figures.read_buckets([pool.id for pool in pools], now, cache)
    merged = live_figures.merge_pools(by_pool.values())
    overall = live_figures.figures(merged, now)
    # Services that scale to zero: Live says when one sleeps or wakes (its requests wait).
    sleep = {
        service.pool_id: scaling.sleep_state(service)
        for service in Service.objects.filter(pool__in=pools, scale_to_zero_after_s__isnull=False)
    }
    rows = []
    for pool in pools:
        pool_targets = list(pool.targets.all())
        buckets = by_pool.get(pool.id, {})
        rows.append(
            {
                "pool": pool,
                "figures": live_figures.figures(buckets, now),
                "in_flight": sum(state.targets[t.id].in_flight for t in pool_targets),
                "capacity": sum(t.capacity_weight for t in pool_targets if t.enabled),
                "queued": state.queued.get(pool.id, 0),
                "sleep": sleep.get(pool.id, ""),
            }
        )
    target_rows = []
    for target in targets:
        reading = state.targets[target.id]
        circuit = reading.circuit
        health_state = (
            "ejected" if circuit is not None and not circuit.probe_failing else target.health
        )
        share = overall.target_requests.get(target.id, 0)
        target_rows.append(
            {
                "target": target,
                "badge": badges.target_row(
                    target.state,
                    enabled=target.enabled,
                    in_flight=reading.in_flight,
                    health_state=health_state,
                    trial_in_s=circuit.trial_in_s if circuit is not None else None,
                    cause=circuit.cause if circuit is not None else "",
                ),
                "in_flight": reading.in_flight,
                "utilization": reading.in_flight / target.capacity_weight,
                "share": share / overall.share_total if overall.share_total else None,
                "ttft_ms": reading.ttft_s * 1000 if reading.ttft_s is not None else None,
            }
        )
    decisions = RoutingRecord.objects.filter(pool__in=[pool.id for pool in pools])
    recent = list(decisions.select_related("pool").order_by("-created_at", "-id")[:STREAM_LENGTH])
    return {
        "single": single,
        "pools": pools,
        "sleep": sleep.get(pools[0].id, "") if single and pools else "",
        "overall": overall,
        "in_flight": sum(row["in_flight"] for row in rows),
        "queued": sum(row["queued"] for row in rows),
        "gateways": state.gateways,
        "pool_rows": rows,
        "target_rows": target_rows,
        "decisions": [{"record": r, "why": history_pages.why(r)} for r in recent],
        "charts": live_charts(merged, now, targets if single else []),
    }


def live_charts(
    merged: live_figures.Buckets, now: float, targets: list[Any]
) -> list[charts.TimeSeries]:
    """Return the page's charts of the last 15 minutes (per target on a pool's page)."""
    columns = live_figures.series(merged, now, [t.id for t in targets])
    found = [
        charts.time_series(
            "live-requests",
            "Requests",
            "req/s",
            columns.times,
            [("requests", columns.requests_per_s)],
        ),
        charts.time_series(
            "live-tokens",
            "Completion tokens",
            "tok/s",
            columns.times,
            [("tokens", columns.tokens_per_s)],
        ),
        charts.time_series(
            "live-ttft",
            "Time to first token",
            "ms",
            columns.times,
            [("p50", columns.ttft_p50_ms), ("p95", columns.ttft_p95_ms)],
        ),
    ]
    if targets:
        found.append(
            charts.time_series(
                "live-share",
                "Requests per target",
                "req/s",
                columns.times,
                [(t.name, columns.target_requests_per_s[t.id]) for t in targets],
            )
        )
    return found


def live_fragments(
    pools: list[Pool], single: bool, cache: live_figures.BucketCache | None = None
) -> str:
    """Return the page's live parts as they are now, rendered for a push (figures and charts)."""
    context = live_context(pools, single, cache)
    return live.fragment(LIVE_NOW, context) + live.fragment(LIVE_CHARTS, context)


def _with_targets(pools: list[Pool]) -> list[Pool]:
    return list(
        Pool.objects.filter(pk__in=[p.pk for p in pools])
        .prefetch_related("targets")
        .order_by("name")
    )


def pools_for_push(user: Any, slug: str | None) -> list[Pool] | None:
    """Return the pools a socket's pushes show, with their targets; None: not the user's."""
    pools = watched_pools(user, slug)
    return None if pools is None else _with_targets(pools)


@require_GET
@login_required
def live_overview(request: HttpRequest) -> HttpResponse:
    """Render the Live page of every pool the user sees."""
    pools = _with_targets(watched_pools(request.user, None) or [])
    return render(request, LIVE_PAGE, {**live_context(pools, False), "slug": None})


@require_GET
@login_required
def live_pool(request: HttpRequest, slug: str) -> HttpResponse:
    """Render one pool's Live page (404 outside the user's projects)."""
    pool = get_object_or_404(visible_pools(request.user), slug=slug)
    return render(
        request,
        LIVE_PAGE,
        {**live_context(_with_targets([pool]), True), "slug": slug, "pool": pool},
    )
