"""Smart Balancer pages (the pools list, live over /ws/pools/, and a pool's detail) and /metrics."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from nexus import live, scopes
from nexus.auth import TokenRefused, acting_user, bearer_token
from nexus.models import ApiToken
from nexus.pages import HtmxHttpRequest, render_page_or_fragment
from pools.gateway import metrics
from pools.models import Pool

POOL_LIST = "pools/pool_list.html"
POOLS_TABLE = f"{POOL_LIST}#pools-table"


def with_targets() -> QuerySet[Pool]:
    """Return pools with their targets and the targets' nodes, whose state the rows show."""
    return Pool.objects.prefetch_related("targets__node")


def pools_table_context(audience: live.Audience) -> dict[str, Any]:
    """Return what the pools-table partial needs, for the page and for live pushes alike."""
    return {"pools": with_targets(), "can_manage": audience == "manage"}


@require_GET
@login_required
def pool_list(request: HtmxHttpRequest) -> HttpResponse:
    """Render the pools page, or only its table for an htmx request."""
    context = pools_table_context(live.audience_of(request.user))
    return render_page_or_fragment(request, POOL_LIST, POOLS_TABLE, context)


@require_GET
@login_required
def pool_detail(request: HttpRequest, slug: str) -> HttpResponse:
    """Render one pool's settings and targets, and how to call it."""
    pool = get_object_or_404(with_targets(), slug=slug)
    # Only a prefix to recognise each by: a token's secret is never stored.
    tokens = [
        token
        for token in ApiToken.objects.usable().filter(created_by=acting_user(request))
        if token.may_call(scopes.pool(pool.slug))
    ]
    return render(request, "pools/pool_detail.html", {"pool": pool, "tokens": tokens})


def may_read_metrics(request: HttpRequest) -> bool:
    """Return whether the caller may read /metrics: anyone, or only staff and their tokens."""
    if settings.NEXUS_METRICS_PUBLIC:
        return True
    user = request.user
    if user.is_authenticated and user.is_staff:
        return True
    try:
        token = bearer_token(request.headers.get("Authorization", ""))
    except TokenRefused:
        return False
    return bool(
        token is not None
        and token.may_call(scopes.METRICS)
        and token.created_by is not None
        and token.created_by.is_staff
    )


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Serve the gateway's metrics in Prometheus's text format."""
    if not may_read_metrics(request):
        response = HttpResponse("Authentication required.\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = "Bearer"
        return response
    return HttpResponse(generate_latest(metrics.registry()), content_type=CONTENT_TYPE_LATEST)
