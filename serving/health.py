"""Active health checks of a route (a replica): when to probe it, and what each outcome does.

Pure: no Django, no I/O; times are epoch seconds. `serving.probes` sends the probes and stores
what `apply` returns. The timing is DESIGN.md's ("Model serving semantics"):

- checks start `initial_delay` after the process started, and each one runs an `interval` after
  the previous one, so the k-th probe (k = 1, 2, ...) is due at
  `started_at + initial_delay + k × interval`;
- a pass makes the route HEALTHY (from PROVISIONING too) and forgets earlier failures;
- a failure counts: a HEALTHY route stays HEALTHY with its probe result failed (degraded), and
  `max_retries + 1` failures in a row make any route UNHEALTHY.

So a route that never passes is UNHEALTHY `initial_delay + interval × (max_retries + 1)` after it
started (60 + 10 × 11 = 170 s with the defaults), and a healthy one that stops answering is
UNHEALTHY `interval × (max_retries + 1)` after its last pass (110 s).

A revision without a health check is ready "once its process is running and its port accepts
connections": its port is checked every serving tick instead (`port_check`). While the route is
provisioning, a closed port only means the server is still loading, so it is never counted
against the route there; the reconciler notices a process that exits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

# How long a port check waits for an answer; a server that accepted the connection answers
# far sooner, whatever it answers.
PORT_CHECK_WAIT_S = 5.0
PORT_CHECK_MAX_RETRIES = 10


class RouteHealth(StrEnum):
    """The route states health checks move between (the values of serving.models.RouteState)."""

    PROVISIONING = "provisioning"
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


class ProbeVerdict(StrEnum):
    """The latest probe's result (the values of serving.models.ProbeResult)."""

    UNKNOWN = "unknown"
    PASSED = "passed"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class HealthCheck:
    """How a route is probed; times in seconds. `path` None: the port check, no HTTP path."""

    path: str | None
    interval: float = 10.0
    max_retries: int = 10
    max_wait_time: float = 15.0
    expected_status_code: int = 200
    initial_delay: float = 60.0

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | None, tick_s: float) -> HealthCheck:
        """Return a revision's health check (its spec["health_check"]), or the port check."""
        if not spec:
            return port_check(tick_s)
        known = {key: spec[key] for key in cls.__dataclass_fields__ if key in spec}
        return cls(**known)

    @property
    def checks_port(self) -> bool:
        """Say whether this is the port check of a revision without a health check."""
        return self.path is None

    def first_probe_at(self, started_at: float) -> float:
        """Return when a route whose process started then gets its first probe."""
        return started_at + self.initial_delay + self.interval


def port_check(tick_s: float) -> HealthCheck:
    """Return the check of a revision without one: its port, every serving tick."""
    return HealthCheck(
        path=None,
        interval=tick_s,
        max_retries=PORT_CHECK_MAX_RETRIES,
        max_wait_time=PORT_CHECK_WAIT_S,
        initial_delay=0.0,
    )


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one probe found: passed, or failed with the reason shown to operators."""

    passed: bool
    reason: str = ""


PASSED = Outcome(passed=True)


def failed(reason: str) -> Outcome:
    """Return a failed probe's outcome, e.g. failed("status 503 != expected 200")."""
    return Outcome(passed=False, reason=reason)


def wrong_status(status: int, expected: int) -> Outcome:
    return failed(f"status {status} != expected {expected}")


def timed_out(max_wait_time: float) -> Outcome:
    return failed(f"no answer within {max_wait_time:g} s")


@dataclass(frozen=True, slots=True)
class Transition:
    """A route's health after a probe: what to store, and the error to keep, if any."""

    state: RouteHealth
    probe_result: ProbeVerdict
    consecutive_failures: int
    next_probe_at: float | None  # None once UNHEALTHY: an ended route is not probed again
    error: dict[str, Any] | None  # a route.errors record when the route became UNHEALTHY


def apply(
    check: HealthCheck,
    state: RouteHealth,
    consecutive_failures: int,
    due_at: float,
    outcome: Outcome,
    now: float,
) -> Transition:
    """Return the route's health after the probe that was due at `due_at` and ended at `now`."""
    next_probe_at = next_due(check, due_at, now)
    if outcome.passed:
        return Transition(RouteHealth.HEALTHY, ProbeVerdict.PASSED, 0, next_probe_at, None)
    if check.checks_port and state is RouteHealth.PROVISIONING:
        # Still loading: a server binds its port only when it is ready to serve.
        return Transition(state, ProbeVerdict.FAILED, 0, next_probe_at, None)
    failures = consecutive_failures + 1
    if failures <= check.max_retries:
        return Transition(state, ProbeVerdict.FAILED, failures, next_probe_at, None)
    what = "port checks" if check.checks_port else f"probes of {check.path}"
    error = {
        "at": datetime.fromtimestamp(now, UTC).isoformat(),
        "message": f"unhealthy after {failures} failed {what} in a row "
        f"(max_retries {check.max_retries}); the last: {outcome.reason}",
        "exit_code": None,
        "log_tail": "",
    }
    return Transition(RouteHealth.UNHEALTHY, ProbeVerdict.FAILED, failures, None, error)


def next_due(check: HealthCheck, due_at: float, now: float) -> float:
    """Return the next probe's time: an interval after the last one's, past `now`.

    Keeping the schedule (rather than counting from when the probe ended) keeps the time to
    UNHEALTHY exact; slots missed while the controller was down are skipped, not made up in a
    burst that would count failures faster than one per interval.
    """
    missed = max(0, math.floor((now - due_at) / check.interval))
    later = due_at + (missed + 1) * check.interval
    # Float rounding may leave it a hair before `now`; one more interval settles it.
    return later if later > now else later + check.interval
