"""What serving pushes to the open services list and service pages (nexus.live has the
pattern), and what those pages show.

A list row is rendered once, as staff see it (with its owner and controls), and pushed to staff's
list pages only: everyone else's list holds only their projects' services, so their pages open no
socket, as the pools page does. A service page's cards are rendered once per audience and pushed
to the service's topic, which only those who see the service's project may join. The reconciler
and the health checks call `service_changed` after each tick; a fragment is pushed only when it
reads differently from the one this process pushed last, so an idle service costs a render per
tick and no frame.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.db.models import Count, Max, Q, QuerySet
from django.utils import timezone

from nexus import live
from nexus.models import ApiToken
from serving import services, tokens
from serving.forms import ServiceTokenForm
from serving.models import Revision, Route, RouteState, Service, ServiceLifecycle

logger = logging.getLogger(__name__)

SERVICE_LIST = "serving/service_list.html"
SERVICE_ROW = f"{SERVICE_LIST}#service-row"
SERVICE_DETAIL = "serving/service_detail.html"
SERVICE_LIVE = f"{SERVICE_DETAIL}#service-live"
SERVICES_TOPIC = "services"
# The only audience the services list is pushed to (see the module's docstring).
STAFF: live.Audience = "manage"
# A page that reconnects catches up on the services that can still change, and on those
# destroyed lately, whose row may still read "destroying" there.
CATCH_UP_DESTROYED = timedelta(hours=1)
# Pushes remembered per process to skip unchanged ones; past this, the memory starts over.
REMEMBERED_PUSHES = 2000
# A service page's cards are rendered again at least this often, facts moved or not.
CARDS_AT_LEAST_EVERY_S = 10.0

_last_pushed: dict[tuple[str, int], str] = {}
# By service: the facts its cards were last rendered from, and when (time.monotonic()).
_cards_seen: dict[int, tuple[Any, float]] = {}


def listed_services(found: QuerySet[Service]) -> QuerySet[Service]:
    """Return the services as the list shows them: with their revision, owner and counts."""
    shown = found.select_related("latest_revision", "owner")
    return services.with_route_counts(services.with_ready_counts(shown)).order_by("name", "id")


def service_rows(found: QuerySet[Service]) -> list[dict[str, Any]]:
    """Return the list's rows: each service with its readiness in words and what deleting it
    stops (found: as `listed_services` returns them)."""
    return [
        {
            "service": service,
            "status": services.status_text(service),
            # Annotated by services.with_route_counts.
            "route_counts": {
                "live": getattr(service, "live_routes", 0),
                "finished": getattr(service, "finished_routes", 0),
            },
            "dialog": f"delete-service-{service.pk}",
        }
        for service in found
    ]


def route_rows(routes: Iterable[Route]) -> list[dict[str, Any]]:
    """Return the routes card's rows: each route with its traffic and its errors as raw JSON."""
    rows = []
    for route in routes:
        traffic = services.route_traffic(route)
        rows.append(
            {
                "route": route,
                "traffic": traffic,
                "traffic_text": services.ROUTE_TRAFFIC[traffic],
                "last_error": route.errors[-1]["message"] if route.errors else "",
                "errors_json": json.dumps(route.errors, indent=2),
            }
        )
    return rows


def service_context(
    service: Service, audience: live.Audience, *, finished_routes: bool = False
) -> dict[str, Any]:
    """Return what the service page and its live cards show, as one audience sees them; the
    routes card shows the running routes, or the finished ones when `finished_routes`."""
    issued_tokens = [
        {"token": token, "state": tokens.token_status(token)}
        for token in tokens.service_tokens(service)
    ]
    latest, running = service.latest_revision, service.running_revision
    updating = service.latest_revision_id != service.running_revision_id
    live_routes = Q(state__in=services.LIVE_ROUTE_STATES)
    running_routes = route_rows(services.shown_routes(service))
    finished_route_rows = route_rows(services.shown_routes(service, finished=True))
    env = latest.spec.get("env", {}) if latest is not None else {}
    return {
        "section": "services",
        "service": service,
        "can_manage": audience == "manage",
        "status": services.status_text(service),
        "ready": services.ready_replicas(service),
        # What deleting it stops, and what its history keeps.
        "route_counts": service.routes.aggregate(
            live=Count("id", filter=live_routes), finished=Count("id", filter=~live_routes)
        ),
        "latest": latest,
        "running": running,
        "updating": updating,
        # Side by side while they differ (the running one is None before the first rollout).
        "compared_revisions": [latest, running] if updating and running else [latest],
        "current_revision": [running],
        "env_text": "\n".join(f"{name}={value}" for name, value in env.items()),
        "routes": finished_route_rows if finished_routes else running_routes,
        "running_routes": running_routes,
        "finished_route_rows": finished_route_rows,
        "finished_routes": finished_routes,
        "running_count": len(running_routes),
        "finished_count": service.routes.filter(state=RouteState.TERMINATED).count(),
        "finished_shown": services.FINISHED_ROUTES_SHOWN,
        "health_choices": RouteState.choices,
        "traffic_choices": list(services.ROUTE_TRAFFIC.items()),
        "revisions": service.revisions.select_related("created_by").order_by("-number"),
        "tokens": issued_tokens,
        "token_form": ServiceTokenForm(),
        "alive": service.lifecycle == ServiceLifecycle.ACTIVE,
    }


def rendered_rows(found: Q) -> str:
    """Return the rows of the services matching `found`, as staff see them, for a push."""
    return "".join(
        live.fragment(SERVICE_ROW, {"row": row, "can_manage": True})
        for row in service_rows(listed_services(Service.objects.filter(found)))
    )


def current_rows() -> str:
    """Return the rows a reconnecting list page catches up on."""
    recently = timezone.now() - CATCH_UP_DESTROYED
    return rendered_rows(~Q(lifecycle=ServiceLifecycle.DESTROYED) | Q(destroyed_at__gte=recently))


def service_topic(service_id: int) -> str:
    """Return the live topic of one service's open pages."""
    return f"service-{service_id}"


def service_cards(service_id: int, audience: live.Audience) -> str:
    """Return the service page's live cards as the audience sees them now, for a push."""
    service = services.find_by_pk(service_id)
    if service is None or service.latest_revision is None:
        return ""  # gone, or not yet made (a service is created with its first revision)
    return live.fragment(SERVICE_LIVE, service_context(service, audience))


def after_tick(service_id: int) -> None:
    """Push what a reconciler or health tick changed; a failed push never fails the tick."""
    try:
        service_changed(service_id)
    except Exception:
        logger.exception("could not push service %s to its pages", service_id)


def service_changed(service_id: int) -> None:
    """Push the service's row to staff's open list pages and its cards to its open pages,
    each only if it reads differently from the one this process pushed last.

    The cards take a dozen queries per audience, so they are rendered only when the facts they
    show moved (`_facts`) or CARDS_AT_LEAST_EVERY_S passed (relative times, token expiry).
    """
    row = rendered_rows(Q(pk=service_id))
    if row and _changed(("row", service_id), row):
        live.push(SERVICES_TOPIC, f"service-{service_id}", row, audience=STAFF)
    facts = _facts(service_id)
    now = time.monotonic()
    seen, at = _cards_seen.get(service_id, (None, float("-inf")))
    if facts == seen and now - at < CARDS_AT_LEAST_EVERY_S:
        return
    _cards_seen[service_id] = (facts, now)
    for audience in live.AUDIENCES:
        cards = service_cards(service_id, audience)
        if cards and _changed((audience, service_id), cards):
            live.push(service_topic(service_id), "cards", cards, audience=audience)


def _facts(service_id: int) -> tuple[Any, ...]:
    """Return, in three small queries, what moves when the service page's cards would read
    differently: the service, its revisions' states, its routes' latest change, and the
    tokens' latest issue or revocation (any token's: cheap, and rare)."""
    found = (
        Service.objects.filter(pk=service_id)
        .annotate(routes_changed=Max("routes__updated_at"), route_count=Count("routes"))
        .values_list(
            "updated_at",
            "lifecycle",
            "status_message",
            "latest_revision_id",
            "running_revision_id",
            "routes_changed",
            "route_count",
        )
        .first()
    )
    states = tuple(Revision.objects.filter(service_id=service_id).values_list("id", "state"))
    issued = ApiToken.objects.aggregate(Max("created_at"), Max("revoked_at"))
    return (found, states, tuple(issued.values()))


def _changed(key: tuple[str, int], html: str) -> bool:
    """Remember what is pushed under the key; say whether it differs from the last push."""
    if _last_pushed.get(key) == html:
        return False
    if len(_last_pushed) >= REMEMBERED_PUSHES:
        _last_pushed.clear()
    _last_pushed[key] = html
    return True
