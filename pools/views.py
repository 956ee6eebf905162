"""Smart Balancer pages (the pools list, live over /ws/pools/) and /metrics; a pool's page is in
pools.pool_views."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector
from redis.exceptions import RedisError

from nexus import access, live, scopes
from nexus.auth import TokenRefused, bearer_token
from nexus.pages import HtmxHttpRequest, render_page_or_fragment
from nexus.services import redis_client, redis_text
from pools.gateway import metrics
from pools.gateway.history import writer_drops_key
from pools.models import Pool

POOL_LIST = "pools/pool_list.html"
POOLS_TABLE = f"{POOL_LIST}#pools-table"


def with_targets() -> QuerySet[Pool]:
    """Return pools with their targets and the targets' nodes, whose state the rows show."""
    return Pool.objects.prefetch_related("targets__node")


def visible_pools(user: Any) -> QuerySet[Pool]:
    """Return the pools of the user's projects (staff: all), as `with_targets` does."""
    if access.is_staff(user):
        return with_targets()
    return with_targets().filter(project__in=access.visible_projects(user))


def pools_table_context(pools: QuerySet[Pool], audience: live.Audience) -> dict[str, Any]:
    """Return what the pools-table partial needs, for the page and for live pushes alike."""
    return {"pools": pools, "can_manage": audience == "manage"}


@require_GET
@login_required
def pool_list(request: HtmxHttpRequest) -> HttpResponse:
    """Render the pools page, or only its table for an htmx request."""
    user = request.user
    context = pools_table_context(visible_pools(user), live.audience_of(user))
    # Who may create a pool (the wizard's rule): anyone who may change some project.
    context["can_create"] = access.changeable_projects(user).exists()
    return render_page_or_fragment(request, POOL_LIST, POOLS_TABLE, context)


def metrics_refusal(request: HttpRequest) -> HttpResponse | None:
    """Return why the caller may not read /metrics, or None when they may.

    Public metrics answer anyone; private ones staff sessions and admin tokens issued by staff.
    No credential or a bad token: 401; a token or user that may not: 403.
    """
    if settings.NEXUS_METRICS_PUBLIC:
        return None
    user = request.user
    if user.is_authenticated and user.is_staff:
        return None
    try:
        token = bearer_token(request.headers.get("Authorization", ""))
    except TokenRefused as refused:
        return metrics_answer(401, str(refused))
    if token is None:
        if user.is_authenticated:
            return metrics_answer(403, "Only staff may read the metrics.")
        return metrics_answer(401, "Authentication required: an admin token or a staff session.")
    if not token.may_call(scopes.METRICS):
        return metrics_answer(403, scopes.refusal(token.scope, scopes.METRICS))
    if token.created_by is None or not token.created_by.is_staff:
        return metrics_answer(403, "Only admin tokens issued by staff may read the metrics.")
    return None


def metrics_answer(status: int, message: str) -> HttpResponse:
    """Return a plain-text refusal of /metrics (Prometheus shows the body of a failed scrape)."""
    response = HttpResponse(f"{message}\n", status=status, content_type="text/plain")
    if status == 401:
        response["WWW-Authenticate"] = "Bearer"
    return response


class WriterDrops(Collector):
    """The rows the history writers dropped, by cause, as they counted them in Redis: they are
    processes of their own that serve no /metrics. When Redis does not answer, the series is
    left out of that scrape rather than reported as zero."""

    def collect(self) -> Any:
        try:
            counts = redis_client().hgetall(writer_drops_key(settings.NEXUS_REDIS_PREFIX))
        except RedisError:
            return
        family = CounterMetricFamily(
            "nexus_history_writer_dropped_rows",
            "Routing records the history writers dropped, by cause: rejected (the database "
            "refused their batch for good); malformed (an entry that could not be decoded) and "
            "trimmed (the stream lost it before it was read) count stream entries, whose rows "
            "are unknown.",
            labels=["cause"],
        )
        for cause, count in sorted(counts.items()):
            family.add_metric([redis_text(cause)], int(count))
        yield family


WRITER_DROPS = CollectorRegistry()
WRITER_DROPS.register(WriterDrops())


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Serve the gateway's metrics in Prometheus's text format, and the history writers'."""
    if (refusal := metrics_refusal(request)) is not None:
        return refusal
    body = generate_latest(metrics.registry()) + generate_latest(WRITER_DROPS)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
