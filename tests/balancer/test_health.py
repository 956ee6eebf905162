"""Passive health: the circuit per target, probe verdicts, and latency averages."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pools.balancer.health import CircuitState, HealthPolicy, LatencyStats, PassiveHealth
from tests.support.properties import examples

T = 7  # the target under test


def ejected(health: PassiveHealth, now: float) -> PassiveHealth:
    for _ in range(3):
        health.record(T, ok=False, now=now)
    return health


# Closed -> open


def test_an_unknown_target_is_closed_and_allowed():
    health = PassiveHealth()

    assert health.state(T, now=0.0) == "closed"
    assert health.allow(T, now=0.0) is True
    assert health.circuit_open(T, now=0.0) is False
    assert health.explain(T, now=0.0) is None
    assert health.error_rate(T) == 0.0


def test_it_ejects_a_target_after_3_consecutive_failures():
    health = PassiveHealth()
    health.record(T, ok=False, now=0.0)
    health.record(T, ok=False, now=0.0)
    assert health.state(T, now=0.0) == "closed"

    health.record(T, ok=False, now=1.0)

    assert health.state(T, now=1.0) == "open"
    assert health.allow(T, now=1.0) is False
    assert health.circuit_open(T, now=1.0) is True
    assert health.open_until(T) == 6.0
    assert health.explain(T, now=2.0) == (
        "circuit open: 3 consecutive failures; half-open trial in 4.0 s"
    )


def test_the_cause_names_what_the_failure_that_ejected_it_said():
    health = PassiveHealth()
    for _ in range(3):
        health.record(T, ok=False, now=1.0, why="401: the target rejects its credential")

    assert health.explain(T, now=2.0) == (
        "circuit open: 3 consecutive failures, the last: 401: the target rejects its credential;"
        " half-open trial in 4.0 s"
    )


def test_a_success_resets_the_consecutive_failure_count():
    health = PassiveHealth()
    for ok in (False, False, True, False, False):
        health.record(T, ok=ok, now=0.0)

    assert health.state(T, now=0.0) == "closed"


def test_it_ejects_a_target_whose_error_rate_reaches_the_threshold():
    health = PassiveHealth()
    # Alternating, never 3 failures in a row: 4 of 9 failed, then the 10th makes 5 of 10.
    for i in range(9):
        health.record(T, ok=i % 2 == 0, now=0.0)
    assert health.state(T, now=0.0) == "closed"

    health.record(T, ok=False, now=0.0)

    assert health.state(T, now=0.0) == "open"
    assert health.explain(T, now=0.0) == (
        "circuit open: 50% of the last 10 requests failed; half-open trial in 5.0 s"
    )


def test_the_error_rate_needs_10_samples():
    health = PassiveHealth()
    for ok in (False, True, False, True, False, True, False, True, False):
        health.record(T, ok=ok, now=0.0)

    assert health.error_rate(T) == pytest.approx(5 / 9)
    assert health.state(T, now=0.0) == "closed"


def test_the_error_rate_covers_only_the_last_20_outcomes():
    health = PassiveHealth()
    for ok in [False, True] * 2 + [True] * 20:
        health.record(T, ok=ok, now=0.0)

    assert health.error_rate(T) == 0.0


# Open -> half-open -> closed or open again


def test_it_allows_exactly_one_trial_when_the_cooldown_is_over():
    health = ejected(PassiveHealth(), now=0.0)
    assert health.state(T, now=4.99) == "open"

    assert health.state(T, now=5.0) == "half_open"
    assert health.circuit_open(T, now=5.0) is False
    assert health.allow(T, now=5.0) is True

    assert health.allow(T, now=5.1) is False
    assert health.circuit_open(T, now=5.1) is True
    assert health.explain(T, now=5.1) == (
        "half-open after 3 consecutive failures: a trial request is in flight"
    )


def test_a_successful_trial_closes_the_circuit():
    health = ejected(PassiveHealth(), now=0.0)
    assert health.allow(T, now=5.0) is True

    health.record(T, ok=True, now=6.0)

    assert health.state(T, now=6.0) == "closed"
    assert health.open_until(T) is None
    assert health.error_rate(T) == 0.0  # a fresh window after the recovery
    health.record(T, ok=False, now=6.0)
    assert health.state(T, now=6.0) == "closed"


def test_a_failed_trial_reopens_with_a_longer_cooldown():
    health = ejected(PassiveHealth(), now=0.0)
    assert health.allow(T, now=5.0) is True

    health.record(T, ok=False, now=6.0)

    assert health.state(T, now=6.0) == "open"
    assert health.open_until(T) == 16.0
    assert health.explain(T, now=6.0) == (
        "circuit open: the half-open trial failed; half-open trial in 10.0 s"
    )


def test_the_cooldown_doubles_per_repeated_ejection_and_stops_at_120_s():
    health = ejected(PassiveHealth(), now=0.0)
    now = 0.0
    cooldowns = []
    for _ in range(7):
        until = health.open_until(T)
        assert until is not None
        cooldowns.append(until - now)
        now = until
        assert health.allow(T, now=now) is True
        health.record(T, ok=False, now=now)

    assert cooldowns == [5.0, 10.0, 20.0, 40.0, 80.0, 120.0, 120.0]


def test_a_streak_of_successes_forgives_past_ejections():
    health = ejected(PassiveHealth(), now=0.0)
    health.allow(T, now=5.0)
    health.record(T, ok=False, now=5.0)  # second ejection: 10 s
    health.allow(T, now=15.0)
    health.record(T, ok=True, now=15.0)
    for _ in range(5):
        health.record(T, ok=True, now=16.0)

    ejected(health, now=20.0)

    assert health.open_until(T) == 25.0


def test_too_short_a_streak_keeps_the_cooldown_growing():
    health = ejected(PassiveHealth(), now=0.0)
    health.allow(T, now=5.0)
    health.record(T, ok=True, now=5.0)
    for _ in range(4):
        health.record(T, ok=True, now=6.0)

    ejected(health, now=10.0)

    assert health.open_until(T) == 20.0


def test_outcomes_of_requests_sent_before_the_ejection_do_not_move_the_cooldown():
    health = ejected(PassiveHealth(), now=0.0)

    health.record(T, ok=False, now=1.0)
    health.record(T, ok=True, now=2.0)

    assert health.state(T, now=2.0) == "open"
    assert health.open_until(T) == 5.0


def test_an_abandoned_trial_frees_the_half_open_slot():
    health = ejected(PassiveHealth(), now=0.0)
    assert health.allow(T, now=5.0) is True

    health.abandon(T)

    assert health.state(T, now=5.5) == "half_open"
    assert health.allow(T, now=5.5) is True


def test_a_trial_lost_without_a_verdict_is_replaced_after_the_trial_timeout():
    health = ejected(PassiveHealth(), now=0.0)
    assert health.allow(T, now=5.0) is True

    assert health.allow(T, now=64.9) is False
    assert health.allow(T, now=65.0) is True


def test_each_target_has_its_own_circuit():
    health = ejected(PassiveHealth(), now=0.0)

    assert health.state(T + 1, now=0.0) == "closed"
    health.forget(T)
    assert health.state(T, now=0.0) == "closed"


# Active probe verdicts


def test_an_unhealthy_probe_verdict_holds_the_target_open_until_a_healthy_one():
    health = PassiveHealth()
    health.record_probe(T, healthy=False, now=0.0)
    for _ in range(10):
        health.record(T, ok=True, now=1.0)

    assert health.state(T, now=500.0) == "open"
    assert health.allow(T, now=500.0) is False
    assert health.explain(T, now=500.0) == "the active probe reports it unhealthy"


def test_the_healthy_verdict_after_a_hold_admits_one_trial_first():
    health = PassiveHealth()
    health.record_probe(T, healthy=False, now=0.0)

    health.record_probe(T, healthy=True, now=30.0)

    assert health.state(T, now=30.0) == "half_open"
    assert health.allow(T, now=30.0) is True
    assert health.allow(T, now=30.0) is False
    health.record(T, ok=True, now=31.0)
    assert health.state(T, now=31.0) == "closed"


def test_a_healthy_verdict_keeps_a_passive_ejections_cooldown():
    health = ejected(PassiveHealth(), now=0.0)
    health.record_probe(T, healthy=False, now=1.0)

    health.record_probe(T, healthy=True, now=2.0)

    assert health.state(T, now=2.0) == "open"
    assert health.state(T, now=5.0) == "half_open"


def test_a_healthy_verdict_on_a_healthy_target_changes_nothing():
    health = PassiveHealth()

    health.record_probe(T, healthy=True, now=0.0)

    assert health.state(T, now=0.0) == "closed"


# Properties

# Weighted towards failures and trials, with a wait to the end of the cooldown, so that runs
# reach half-open, repeated ejections and the cap often.
WAITS = st.sampled_from([0.5, 5.0, 60.0]) | st.floats(min_value=0.0, max_value=150.0)
EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("wait"), WAITS),
        st.tuples(
            st.sampled_from(["cooldown", "allow", "allow", "fail", "fail", "ok", "abandon"]),
            st.just(0.0),
        ),
    ),
    min_size=10,
    max_size=100,
)


@settings(max_examples=examples(250), deadline=None)
@given(events=EVENTS)
def test_the_circuit_keeps_its_rules_under_any_sequence_of_events(events):
    # A low cap, so that random runs reach it.
    policy = HealthPolicy(max_cooldown_s=20.0)
    health = PassiveHealth(policy)
    now = 0.0
    trial_claimed_at: float | None = None
    last_cooldown: float | None = None
    for event, seconds in events:
        before = health.state(T, now)
        if before is not CircuitState.HALF_OPEN:
            trial_claimed_at = None
        if event == "wait":
            now += seconds
        elif event == "cooldown":
            now = max(now, health.open_until(T) or now)
        elif event == "allow":
            blocked = health.circuit_open(T, now)
            allowed = health.allow(T, now)
            assert allowed is not blocked
            if before is CircuitState.CLOSED:
                assert allowed
            elif before is CircuitState.OPEN:
                assert not allowed
            else:
                # At most one half-open trial until its verdict or its timeout.
                live = (
                    trial_claimed_at is not None and now - trial_claimed_at < policy.trial_timeout_s
                )
                assert allowed is not live
                if allowed:
                    trial_claimed_at = now
        elif event == "abandon":
            health.abandon(T)
            trial_claimed_at = None
        else:
            health.record(T, ok=event == "ok", now=now)
            after = health.state(T, now)
            trial_claimed_at = None
            if before is CircuitState.HALF_OPEN:
                # A verdict in half-open decides: success closes, failure reopens for longer.
                assert after == ("closed" if event == "ok" else "open")
            if before is CircuitState.OPEN:
                assert after == "open"
            if after is CircuitState.OPEN and before is not CircuitState.OPEN:
                until = health.open_until(T)
                assert until is not None
                cooldown = until - now
                # `until - now` carries float rounding: snap it to the policy's steps.
                cooldown = min((5.0, 10.0, 20.0), key=lambda step: abs(step - cooldown))
                assert until - now == pytest.approx(cooldown)
                if before is CircuitState.HALF_OPEN and last_cooldown is not None:
                    assert cooldown == min(20.0, 2 * last_cooldown)
                last_cooldown = cooldown
        assert 0.0 <= health.error_rate(T) <= 1.0


@pytest.mark.parametrize(
    ("ejections", "cooldown"),
    [(1, 5.0), (2, 10.0), (5, 80.0), (6, 120.0), (10_000, 120.0)],
)
def test_the_policy_cooldown_grows_and_caps(ejections, cooldown):
    assert HealthPolicy().cooldown_s(ejections) == cooldown


# Latency averages


def test_latency_averages_start_at_the_first_sample_and_move_a_fifth_of_the_way():
    stats = LatencyStats()
    stats.record(ttft_s=1.0, tpot_s=0.05)

    stats.record(ttft_s=2.0, tpot_s=0.10)

    assert stats.ttft_s == pytest.approx(1.2)
    assert stats.tpot_s == pytest.approx(0.06)


def test_a_timing_that_was_not_measured_leaves_its_average_alone():
    stats = LatencyStats()
    stats.record(ttft_s=1.0)

    stats.record(tpot_s=0.02)

    assert stats.ttft_s == 1.0
    assert stats.tpot_s == 0.02
