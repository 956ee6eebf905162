"""One health-check tick: probe the routes that are due, through their nodes' agents.

A route is probed while PROVISIONING or HEALTHY and its process runs on a node. The probe is
`GET <node address>/agent/v1/processes/<process id>/http<health path>` with the node credential
(runtimes listen on the node's loopback only), bounded by the check's `max_wait_time`; a revision
without a health check gets the port check instead (`/`, any answer from the process passes).
`serving.health` decides what each outcome does; this module claims, probes and stores, and
tells the service's managed pool when a route entered or left traffic or became (or stopped
being) degraded.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from nexus import upstream
from pools.services import PoolConflict
from serving import health, live
from serving.health import HealthCheck, Outcome, RouteHealth
from serving.models import ProbeResult, Route, RouteState, Service
from serving.pool_sync import sync_service_pool
from serving.replicas import MAX_ERRORS

log = logging.getLogger(__name__)

PROBED_STATES = (RouteState.PROVISIONING, RouteState.HEALTHY)
# Probes in flight at once; the rest of a tick's due routes wait for a free one.
MAX_CONCURRENT_PROBES = 64
# A claimed route is not probed by another tick until its probe's time is up and this margin.
CLAIM_MARGIN_S = 5.0
# Only an agent's error is read (to tell it from the process's own answer); it is small.
AGENT_ERROR_STATUSES = frozenset({401, 404, 409, 502, 503, 504})
# The agent's error codes (docs/nodes.md) that fail a probe whatever the check expects.
AGENT_ERROR_CODES = frozenset(
    {
        "invalid_credential",
        "process_not_found",
        "process_not_running",
        "process_has_no_port",
        "runtime_unavailable",
    }
)
MAX_ERROR_BODY_BYTES = 64 * 1024
MAX_REASON_CHARS = 300
STATUS_MESSAGE_CHARS = 500  # Route.status_message's max_length


@dataclass(frozen=True, slots=True)
class _Probe:
    """A claimed route's probe: where it goes, how it is judged, and the route as it was."""

    route: Route
    check: HealthCheck
    due_at: float  # epoch seconds
    claimed_until: datetime
    url: str
    authorization: str


def probe_due_routes(now: datetime | None = None) -> dict[str, int]:
    """Probe every route whose probe is due, store the outcomes; return counts for the log.

    now: the tick's time (tests pass one); by default the clock, read again when the probes end.
    """
    started = now or timezone.now()
    probes = _claim_due(started)
    if not probes:
        return {"probed": 0, "services_synced": 0}
    outcomes = asyncio.run(_probe_all(probes))
    finished = now or timezone.now()
    to_sync: dict[int, Service] = {}
    for probe, outcome in zip(probes, outcomes, strict=True):
        if _store(probe, outcome, finished):
            to_sync[probe.route.service_id] = probe.route.service
    for service in to_sync.values():
        try:
            sync_service_pool(service)
        except PoolConflict as conflict:
            # The reconciler reports it on the service; the other services still get synced.
            log.warning("cannot sync the pool of %s: %s", service, conflict)
        live.after_tick(service.pk)
    return {"probed": len(probes), "services_synced": len(to_sync)}


def health_check_of(route: Route) -> HealthCheck:
    """Return how the route is checked: its revision's health check, or the port check."""
    return HealthCheck.from_spec(
        route.revision.spec.get("health_check"), tick_s=settings.NEXUS_SERVING_TICK_S
    )


def _claim_due(now: datetime) -> list[_Probe]:
    """Schedule the routes seen for the first time; claim those due now for this tick.

    The claim is a conditional UPDATE of `next_probe_at`, so a tick that overlaps this one (a
    slow tick and the next beat) never probes a route twice.
    """
    routes = (
        Route.objects.filter(state__in=PROBED_STATES, node__isnull=False)
        .exclude(process_id="")
        .filter(Q(next_probe_at__isnull=True) | Q(next_probe_at__lte=now))
        .select_related("node", "revision", "service")
    )
    probes = []
    for route in routes:
        check = health_check_of(route)
        due = route.next_probe_at
        if due is None:
            due = _datetime(check.first_probe_at((route.started_at or now).timestamp()))
            scheduled = Route.objects.filter(pk=route.pk, next_probe_at__isnull=True).update(
                next_probe_at=due
            )
            if not scheduled or due > now:
                continue
        claimed_until = now + timedelta(seconds=check.max_wait_time + CLAIM_MARGIN_S)
        claimed = Route.objects.filter(
            pk=route.pk, state=route.state, next_probe_at=due, process_id=route.process_id
        ).update(next_probe_at=claimed_until)
        if not claimed:
            continue
        route.next_probe_at = due
        node = route.node
        assert node is not None  # filtered above
        path = "/" if check.path is None else check.path
        probes.append(
            _Probe(
                route=route,
                check=check,
                due_at=due.timestamp(),
                claimed_until=claimed_until,
                url=f"{node.address.rstrip('/')}/agent/v1/processes/{route.process_id}/http{path}",
                authorization=f"Bearer {node.get_credential()}",
            )
        )
    return probes


async def _probe_all(probes: Iterable[_Probe]) -> list[Outcome]:
    """Send the probes concurrently, each bounded by its own check's max_wait_time."""
    limit = asyncio.Semaphore(MAX_CONCURRENT_PROBES)

    async def bounded(probe: _Probe) -> Outcome:
        async with limit:
            return await _probe(probe)

    try:
        return await asyncio.gather(*(bounded(probe) for probe in probes))
    finally:
        # The client belongs to this tick's event loop, which ends here.
        await upstream.close()


async def _probe(probe: _Probe) -> Outcome:
    """Return what one probe found."""
    check = probe.check
    request = httpx.Request("GET", probe.url, headers={"Authorization": probe.authorization})
    try:
        # The whole probe (connect, answer, the agent's error body) within max_wait_time.
        async with asyncio.timeout(check.max_wait_time):
            response = await upstream.get().send(request)
            try:
                status = response.status_code
                error = await _agent_error(response) if status in AGENT_ERROR_STATUSES else None
            finally:
                await response.aclose()
    except TimeoutError:
        return health.timed_out(check.max_wait_time)
    except httpx.HTTPError as exc:
        return health.failed(f"node unreachable: {_transport_reason(exc)}")
    if error is not None:
        return error
    if check.checks_port or status == check.expected_status_code:
        # The port check passes on any answer of the process: its port accepts connections.
        return health.PASSED
    return health.wrong_status(status, check.expected_status_code)


async def _agent_error(response: httpx.Response) -> Outcome | None:
    """Return the failure an agent's own error stands for; None for the process's answer."""
    body = b""
    async for chunk in response.aiter_raw():
        body += chunk
        if len(body) > MAX_ERROR_BODY_BYTES:
            return None
    try:
        error = json.loads(body)["error"]
        code, message = str(error["code"]), str(error.get("message", ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if code not in AGENT_ERROR_CODES:
        return None
    return health.failed(_clip(f"{code.replace('_', ' ')}: {message}"))


def _store(probe: _Probe, outcome: Outcome, now: datetime) -> bool:
    """Save the route's new health; return whether its traffic or degraded flag changed.

    The update is conditional on the route being as it was claimed: a route the reconciler
    moved meanwhile (stopped, replaced) keeps what the reconciler wrote.
    """
    route = probe.route
    was = RouteHealth(route.state)
    transition = health.apply(
        probe.check,
        was,
        route.consecutive_failures,
        probe.due_at,
        outcome,
        now.timestamp(),
    )
    fields: dict[str, Any] = {
        "state": transition.state.value,
        "probe_result": transition.probe_result.value,
        "consecutive_failures": transition.consecutive_failures,
        "last_probe_at": now,
        "next_probe_at": (
            None if transition.next_probe_at is None else _datetime(transition.next_probe_at)
        ),
        "updated_at": now,
    }
    if transition.state is RouteHealth.HEALTHY and route.ready_at is None:
        fields["ready_at"] = now
    if transition.error is not None:
        # As the reconciler ends a route: the error kept (bounded), the reason on show.
        fields["errors"] = [*route.errors, transition.error][-MAX_ERRORS:]
        fields["status_message"] = transition.error["message"][:STATUS_MESSAGE_CHARS]
        log.warning("route %s of %s: %s", route.pk, route.service, transition.error["message"])
    stored = Route.objects.filter(
        pk=route.pk, state=route.state, next_probe_at=probe.claimed_until
    ).update(**fields)
    if not stored:
        return False
    degraded_before = route.degraded
    routable_before = was is RouteHealth.HEALTHY
    routable = transition.state is RouteHealth.HEALTHY
    degraded = routable and transition.probe_result.value == ProbeResult.FAILED
    return routable != routable_before or degraded != degraded_before


def _transport_reason(error: httpx.HTTPError) -> str:
    """Return why the agent gave no answer, in plain words."""
    cause: BaseException | None = error
    while cause is not None:
        # aiohttp keeps the socket's error as `os_error` on its connector errors.
        if isinstance(cause, ConnectionRefusedError) or isinstance(
            getattr(cause, "os_error", None), ConnectionRefusedError
        ):
            return "connection refused"
        cause = cause.__cause__ or cause.__context__
    return _clip(str(error)) or type(error).__name__


def _clip(text: str) -> str:
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 1] + "…"


def _datetime(epoch_s: float) -> datetime:
    return datetime.fromtimestamp(epoch_s, UTC)
