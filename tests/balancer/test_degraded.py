"""Passive health of a degraded target: its first failed request ejects it."""

from __future__ import annotations

from pools.balancer.health import PassiveHealth

T = 7


def test_one_failed_request_ejects_a_degraded_target() -> None:
    health = PassiveHealth()

    health.record(T, ok=False, now=1.0, degraded=True)

    assert health.state(T, now=1.0) == "open"
    assert health.open_until(T) == 6.0
    assert health.explain(T, now=1.0) == (
        "circuit open: a failed request while its probes fail (degraded); half-open trial in 5.0 s"
    )


def test_a_target_no_longer_degraded_takes_three_failures_again() -> None:
    health = PassiveHealth()
    health.record(T, ok=True, now=1.0, degraded=True)

    health.record(T, ok=False, now=1.0)
    health.record(T, ok=False, now=1.0)

    assert health.state(T, now=1.0) == "closed"


def test_a_degraded_target_that_serves_well_stays_in() -> None:
    health = PassiveHealth()

    for _ in range(5):
        health.record(T, ok=True, now=1.0, degraded=True)

    assert health.state(T, now=1.0) == "closed"
    assert health.allow(T, now=1.0) is True
