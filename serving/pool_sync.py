"""Keep a service's managed pool in step with its routes: one target per routable replica.

A HEALTHY route has an active target (degraded while its latest probe failed); a route being
drained keeps its target, draining, until the reconciler stops it; every other route has none.
The pool side is reached through `pools.services` only (DESIGN.md, "Rooms").
"""

from __future__ import annotations

from pools import services as pool_services
from pools.models import TargetHealth
from serving.models import ProbeResult, Route, RouteState, Service, ServiceLifecycle

# Concurrent requests one replica takes unless its revision's spec says "capacity".
DEFAULT_CAPACITY = 8


def target_name(route: Route) -> str:
    return f"route-{route.pk}"


def replica_base_url(route: Route) -> str:
    """Return the URL the gateway reaches the route's process at: through its node's agent."""
    assert route.node is not None
    return f"{route.node.address.rstrip('/')}/agent/v1/processes/{route.process_id}/http"


def sync_service_pool(service: Service) -> bool:
    """Make the service's managed pool's targets match its routes; say whether it has a pool.

    Creates the pool for an active service. The configuration version is bumped only when a
    target changed. Raises pools.services.PoolConflict when an operator's pool has the name.
    """
    # Read again: a caller's copy may predate a delete, and a dropped pool must stay dropped.
    stored = Service.objects.filter(pk=service.pk).values_list("lifecycle", "pool_id").first()
    if stored is None or stored[0] == ServiceLifecycle.DESTROYED:
        return False
    lifecycle, pool_id = stored
    if lifecycle == ServiceLifecycle.ACTIVE:
        pool = pool_services.ensure_managed_pool(service.name, service.name, service.project)
        if pool_id != pool.pk:
            Service.objects.filter(pk=service.pk).update(pool=pool)
            service.pool = pool
    elif pool_id is None or service.pool is None:
        return False  # being destroyed and its pool is gone: nothing to recreate
    else:
        pool = service.pool
    routes = list(
        service.routes.filter(state__in=[RouteState.HEALTHY, RouteState.TERMINATING])
        .exclude(process_id="")
        .select_related("node", "revision")
        .order_by("pk")
    )
    wanted: dict[str, pool_services.ManagedTarget] = {}
    for position, route in enumerate(routes):
        draining = route.state == RouteState.TERMINATING
        if route.node is None or (draining and route.target_id is None):
            continue  # never served, so nothing to drain
        degraded = route.probe_result == ProbeResult.FAILED
        wanted[target_name(route)] = pool_services.ManagedTarget(
            node=route.node,
            base_url=replica_base_url(route),
            model_id=route.revision.spec.get("model_name") or service.name,
            capacity=int(route.revision.spec.get("capacity") or DEFAULT_CAPACITY),
            health=TargetHealth.DEGRADED if degraded else TargetHealth.HEALTHY,
            position=position,
            draining=draining,
        )
    targets = pool_services.set_managed_targets(pool, wanted)
    for route in routes:
        target = targets.get(target_name(route))
        target_id = target.pk if target is not None else None
        if route.target_id != target_id:
            Route.objects.filter(pk=route.pk).update(target_id=target_id)
    return True


def drop_service_pool(service: Service) -> None:
    """Delete the service's managed pool and its targets."""
    if service.pool_id is not None:
        pool_services.drop_managed_pool(service.pool_id)
        service.pool = None
