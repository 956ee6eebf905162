"""The active health check's state machine (serving.health): timing, transitions, errors.

Pure: no database, no network. DESIGN.md's numbers are checked exactly: with the defaults a
route that never passes is UNHEALTHY 170 s after it started, and a healthy route that stops
answering is UNHEALTHY 110 s after its last pass.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from serving.health import (
    PASSED,
    HealthCheck,
    Outcome,
    ProbeVerdict,
    RouteHealth,
    Transition,
    apply,
    failed,
    next_due,
    port_check,
    timed_out,
    wrong_status,
)

DEFAULTS = HealthCheck(path="/health")
STARTED = 1_700_000_000.0  # any epoch second
REFUSED = failed("runtime unavailable: connection refused")
# Epoch seconds near STARTED are exact to about 0.2 µs; the database keeps microseconds.
TOLERANCE = 1e-5


def run(
    check: HealthCheck,
    outcome_at: Callable[[float], Outcome],
    *,
    lateness: Callable[[int], float] = lambda _: 0.0,
    until: Callable[[Transition], bool],
    max_probes: int = 10_000,
) -> tuple[float, Transition, int]:
    """Probe a route started at STARTED on schedule until `until` holds.

    Returns the due time of the probe that made `until` true, its transition and how many
    probes were sent. `lateness(k)` is how late the k-th probe's outcome is known.
    """
    state, failures = RouteHealth.PROVISIONING, 0
    due = check.first_probe_at(STARTED)
    for probe in range(1, max_probes + 1):
        done = due + lateness(probe)
        transition = apply(check, state, failures, due, outcome_at(due), done)
        if until(transition):
            return due, transition, probe
        assert transition.next_probe_at is not None
        state, failures, due = (
            transition.state,
            transition.consecutive_failures,
            transition.next_probe_at,
        )
    raise AssertionError(f"not reached in {max_probes} probes")


def unhealthy(transition: Transition) -> bool:
    return transition.state is RouteHealth.UNHEALTHY


# --- DESIGN.md's timing --------------------------------------------------------------------------


def test_with_the_defaults_a_route_that_never_passes_is_unhealthy_170_s_after_it_started() -> None:
    at, transition, probes = run(DEFAULTS, lambda _: REFUSED, until=unhealthy)

    assert at - STARTED == 170.0
    assert probes == 11
    assert transition.consecutive_failures == 11
    assert transition.next_probe_at is None


def test_with_the_defaults_a_healthy_route_that_stops_answering_is_unhealthy_110_s_later() -> None:
    last_pass = STARTED + 500.0

    at, _, _ = run(DEFAULTS, lambda t: PASSED if t <= last_pass else REFUSED, until=unhealthy)

    assert at - last_pass == 110.0


def test_the_first_probe_goes_one_interval_after_the_initial_delay() -> None:
    assert DEFAULTS.first_probe_at(STARTED) == STARTED + 70.0
    assert HealthCheck(path="/", interval=0.2, initial_delay=0.0).first_probe_at(10.0) == 10.2


@pytest.mark.parametrize(
    ("interval", "max_retries", "initial_delay", "at_start", "after_healthy"),
    [
        (10.0, 10, 60.0, 170.0, 110.0),  # the defaults
        (0.25, 1, 0.0, 0.5, 0.5),
        (5.0, 0, 30.0, 35.0, 5.0),  # max_retries 0: the first failure ends it
        (30.0, 3, 300.0, 420.0, 120.0),
        (10.0, 500, 0.0, 5010.0, 5010.0),  # a long grace for a first download
    ],
)
def test_time_to_unhealthy_follows_design_for_custom_values(
    interval: float, max_retries: int, initial_delay: float, at_start: float, after_healthy: float
) -> None:
    check = HealthCheck(
        path="/health", interval=interval, max_retries=max_retries, initial_delay=initial_delay
    )
    last_pass = STARTED + initial_delay + 4 * interval

    start_at, _, _ = run(check, lambda _: REFUSED, until=unhealthy)
    later_at, _, _ = run(check, lambda t: PASSED if t <= last_pass else REFUSED, until=unhealthy)

    assert start_at - STARTED == pytest.approx(at_start, abs=TOLERANCE)
    assert later_at - last_pass == pytest.approx(after_healthy, abs=TOLERANCE)


@given(
    interval=st.floats(0.05, 120.0),
    max_retries=st.integers(0, 40),
    initial_delay=st.floats(0.0, 600.0),
    late=st.floats(0.0, 0.99),
)
def test_time_to_unhealthy_at_start_is_initial_delay_plus_interval_times_max_retries_plus_one(
    interval: float, max_retries: int, initial_delay: float, late: float
) -> None:
    check = HealthCheck(
        path="/health", interval=interval, max_retries=max_retries, initial_delay=initial_delay
    )

    # Outcomes known up to (almost) an interval late do not shift the schedule.
    at, transition, probes = run(
        check, lambda _: REFUSED, lateness=lambda _: late * interval, until=unhealthy
    )

    assert at - STARTED == pytest.approx(
        initial_delay + interval * (max_retries + 1), abs=TOLERANCE
    )
    assert probes == transition.consecutive_failures == max_retries + 1


@given(
    interval=st.floats(0.05, 120.0),
    max_retries=st.integers(0, 40),
    passes=st.integers(1, 20),
    late=st.floats(0.0, 0.99),
)
def test_time_to_unhealthy_after_healthy_is_interval_times_max_retries_plus_one(
    interval: float, max_retries: int, passes: int, late: float
) -> None:
    check = HealthCheck(path="/health", interval=interval, max_retries=max_retries)
    last_pass = check.first_probe_at(STARTED) + (passes - 1) * interval

    at, _, _ = run(
        check,
        lambda t: PASSED if t <= last_pass + interval / 2 else REFUSED,
        lateness=lambda _: late * interval,
        until=unhealthy,
    )

    assert at - last_pass == pytest.approx(interval * (max_retries + 1), abs=TOLERANCE)


@given(
    interval=st.floats(0.05, 120.0),
    max_retries=st.integers(0, 40),
    failing=st.lists(st.booleans(), min_size=1, max_size=200),
)
def test_a_route_is_unhealthy_exactly_when_its_failures_in_a_row_exceed_max_retries(
    interval: float, max_retries: int, failing: list[bool]
) -> None:
    check = HealthCheck(path="/health", interval=interval, max_retries=max_retries)
    state, failures, due = RouteHealth.PROVISIONING, 0, check.first_probe_at(STARTED)
    in_a_row = 0
    for fails in failing:
        transition = apply(check, state, failures, due, REFUSED if fails else PASSED, due)
        in_a_row = in_a_row + 1 if fails else 0
        assert transition.consecutive_failures == in_a_row
        assert unhealthy(transition) == (in_a_row == max_retries + 1)
        if unhealthy(transition):
            return
        assert transition.next_probe_at == pytest.approx(due + interval, abs=TOLERANCE)
        state, failures, due = transition.state, in_a_row, transition.next_probe_at


# --- Transitions -------------------------------------------------------------------------------


def test_a_pass_makes_a_provisioning_route_healthy() -> None:
    transition = apply(DEFAULTS, RouteHealth.PROVISIONING, 3, 100.0, PASSED, 100.5)

    assert transition == Transition(RouteHealth.HEALTHY, ProbeVerdict.PASSED, 0, 110.0, None)


def test_a_failure_leaves_a_provisioning_route_provisioning_and_counts() -> None:
    transition = apply(DEFAULTS, RouteHealth.PROVISIONING, 3, 100.0, REFUSED, 100.5)

    assert transition == Transition(RouteHealth.PROVISIONING, ProbeVerdict.FAILED, 4, 110.0, None)


def test_a_failure_leaves_a_healthy_route_healthy_but_degraded() -> None:
    transition = apply(DEFAULTS, RouteHealth.HEALTHY, 0, 100.0, wrong_status(503, 200), 100.5)

    assert transition == Transition(RouteHealth.HEALTHY, ProbeVerdict.FAILED, 1, 110.0, None)


def test_a_pass_after_failures_forgets_them() -> None:
    transition = apply(DEFAULTS, RouteHealth.HEALTHY, 10, 100.0, PASSED, 100.0)

    assert (transition.state, transition.consecutive_failures) == (RouteHealth.HEALTHY, 0)
    assert transition.probe_result is ProbeVerdict.PASSED


def test_the_failure_that_makes_a_route_unhealthy_keeps_an_error_with_the_last_reason() -> None:
    transition = apply(DEFAULTS, RouteHealth.HEALTHY, 10, 100.0, timed_out(15.0), 115.0)

    assert transition.state is RouteHealth.UNHEALTHY
    assert transition.next_probe_at is None
    assert transition.error == {
        "at": "1970-01-01T00:01:55+00:00",
        "message": "unhealthy after 11 failed probes of /health in a row (max_retries 10); "
        "the last: no answer within 15 s",
        "exit_code": None,
        "log_tail": "",
    }


def test_failure_reasons_say_what_went_wrong() -> None:
    assert wrong_status(503, 200) == Outcome(False, "status 503 != expected 200")
    assert timed_out(0.5) == Outcome(False, "no answer within 0.5 s")
    assert Outcome(True, "") == PASSED


# --- Schedule ----------------------------------------------------------------------------------


def test_a_probe_slower_than_the_interval_keeps_the_cadence() -> None:
    # Due at 100, timed out at 115 with a 10 s interval: the next one is due at 120, not 125.
    assert next_due(DEFAULTS, 100.0, 115.0) == 120.0


def test_slots_missed_while_the_controller_was_down_are_skipped_not_made_up() -> None:
    assert next_due(DEFAULTS, 100.0, 1000.0) == 1010.0
    assert next_due(DEFAULTS, 100.0, 1005.0) == 1010.0


@given(
    interval=st.floats(0.05, 120.0),
    due=st.floats(0.0, 1e9),
    elapsed=st.floats(0.0, 1e6),
)
def test_the_next_probe_is_due_after_now_and_at_most_an_interval_later(
    interval: float, due: float, elapsed: float
) -> None:
    check = HealthCheck(path="/health", interval=interval)
    now = due + elapsed

    following = next_due(check, due, now)

    assert now < following <= now + interval * 1.000001 + 1e-6


# --- Without a health check: the port ----------------------------------------------------------


def test_a_revision_without_a_health_check_gets_the_port_check_every_tick() -> None:
    check = HealthCheck.from_spec(None, tick_s=1.0)

    assert check == port_check(1.0)
    assert check.checks_port
    assert (check.interval, check.initial_delay, check.max_wait_time) == (1.0, 0.0, 5.0)
    assert check.first_probe_at(STARTED) == STARTED + 1.0


def test_a_revision_health_check_comes_from_its_spec_with_defaults() -> None:
    check = HealthCheck.from_spec({"path": "/ready", "interval": 2, "max_retries": 3}, tick_s=1.0)

    assert check == HealthCheck(path="/ready", interval=2, max_retries=3)
    assert not check.checks_port
    assert (check.max_wait_time, check.expected_status_code, check.initial_delay) == (
        15.0, 200, 60.0,
    )  # fmt: skip


def test_a_closed_port_never_makes_a_provisioning_route_unhealthy() -> None:
    # A server binds its port once loaded, which may take many minutes.
    check = port_check(1.0)

    transition = apply(check, RouteHealth.PROVISIONING, 0, 100.0, REFUSED, 100.0)

    assert transition == Transition(RouteHealth.PROVISIONING, ProbeVerdict.FAILED, 0, 101.0, None)


def test_an_open_port_makes_the_route_healthy_and_a_closed_one_later_degrades_it() -> None:
    check = port_check(1.0)

    ready = apply(check, RouteHealth.PROVISIONING, 0, 100.0, PASSED, 100.0)
    degraded = apply(check, ready.state, 0, 101.0, REFUSED, 101.0)

    assert (ready.state, ready.probe_result) == (RouteHealth.HEALTHY, ProbeVerdict.PASSED)
    assert (degraded.state, degraded.probe_result) == (RouteHealth.HEALTHY, ProbeVerdict.FAILED)


def test_a_healthy_route_whose_port_stays_closed_is_unhealthy_after_eleven_ticks() -> None:
    check = port_check(1.0)
    state, failures, due = RouteHealth.HEALTHY, 0, 100.0
    for _ in range(10):
        transition = apply(check, state, failures, due, REFUSED, due)
        assert transition.state is RouteHealth.HEALTHY
        state, failures = transition.state, transition.consecutive_failures
        assert transition.next_probe_at is not None
        due = transition.next_probe_at

    last = apply(check, state, failures, due, REFUSED, due)

    assert due == 110.0
    assert last.state is RouteHealth.UNHEALTHY
    assert last.error is not None
    assert last.error["message"] == (
        "unhealthy after 11 failed port checks in a row (max_retries 10); "
        "the last: runtime unavailable: connection refused"
    )
