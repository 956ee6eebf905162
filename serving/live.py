"""What serving pushes to the open services list (nexus.live has the pattern).

A row is rendered once, as staff see it (with its owner and controls), and pushed to staff's
list pages only: everyone else's list holds only their projects' services, so their pages open no
socket, as the pools page does. The reconciler and the health checks call `service_changed` after
each tick; a row is pushed only when it reads differently from the one this process pushed last,
so an idle service costs one render per tick and no frame.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from nexus import live
from serving import services
from serving.models import Service, ServiceLifecycle

SERVICE_LIST = "serving/service_list.html"
SERVICE_ROW = f"{SERVICE_LIST}#service-row"
SERVICES_TOPIC = "services"
# The only audience the services list is pushed to (see the module's docstring).
STAFF: live.Audience = "manage"
# A page that reconnects catches up on the services that can still change, and on those
# destroyed lately, whose row may still read "destroying" there.
CATCH_UP_DESTROYED = timedelta(hours=1)
# Rows remembered per process to skip unchanged pushes; past this, the memory starts over.
REMEMBERED_ROWS = 2000

_last_pushed: dict[int, str] = {}


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
            "route_counts": {"live": service.live_routes, "finished": service.finished_routes},
            "dialog": f"delete-service-{service.pk}",
        }
        for service in found
    ]


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


def service_changed(service_id: int) -> None:
    """Push the service's row to staff's open list pages, if it reads differently now."""
    html = rendered_rows(Q(pk=service_id))
    if not html or _last_pushed.get(service_id) == html:
        return
    if len(_last_pushed) >= REMEMBERED_ROWS:
        _last_pushed.clear()
    _last_pushed[service_id] = html
    live.push(SERVICES_TOPIC, f"service-{service_id}", html, audience=STAFF)
