"""Ejection that cannot empty a pool, and server errors that are the request's fault."""

from __future__ import annotations

import random

import pytest

from pools.balancer.health import PassiveHealth, ServerErrorMemory
from pools.balancer.snapshot import Health, PoolPolicy, RequestFacts, TargetView
from pools.balancer.strategies import decide
from tests.balancer import ranked_ids, skipped_reasons, target

STRATEGIES = ["smart", "priority", "capacity", "least_busy", "round_robin"]


def route(targets: list[TargetView], share: float = 0.5, strategy: str = "smart"):
    return decide(
        targets,
        PoolPolicy(strategy=strategy, max_ejected_share=share),
        RequestFacts(kind="chat"),
        rng=random.Random(0),
        turn=0,
    )


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_ejection_up_to_the_cap_keeps_the_ejected_target_out(strategy: str) -> None:
    decision = route([target(1, circuit_open=True), target(2)], strategy=strategy)

    assert ranked_ids(decision) == [2]
    assert skipped_reasons(decision) == {1: "circuit open"}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_past_the_cap_ejected_targets_stay_eligible_ranked_last(strategy: str) -> None:
    targets = [target(1, circuit_open=True), target(2, circuit_open=True), target(3)]

    decision = route(targets, strategy=strategy)

    assert ranked_ids(decision)[0] == 3
    assert sorted(ranked_ids(decision)[1:]) == [1, 2]
    assert [r.factors[-1].name for r in decision.ranking[1:]] == ["ejected", "ejected"]
    assert decision.skipped == ()


def test_a_pool_whose_every_target_is_ejected_still_routes() -> None:
    decision = route([target(1, circuit_open=True), target(2, circuit_open=True)])

    assert decision.target_id in (1, 2)


def test_the_cap_counts_capacity_not_targets() -> None:
    # The ejected target holds 8 of 12 slots: past half, though it is one target of two.
    decision = route([target(1, capacity=8, circuit_open=True), target(2, capacity=4)])

    assert ranked_ids(decision) == [2, 1]


def test_targets_that_could_not_serve_anyway_do_not_count_in_the_cap() -> None:
    targets = [
        target(1, circuit_open=True),
        target(2),
        target(3, health=Health.UNHEALTHY),
        target(4, enabled=False),
    ]

    assert skipped_reasons(route(targets))[1] == "circuit open"


def test_a_share_of_one_lets_passive_ejection_empty_the_pool() -> None:
    decision = route([target(1, circuit_open=True)], share=1.0)

    assert decision.target_id is None
    assert skipped_reasons(decision) == {1: "circuit open"}


def test_a_full_ejected_target_past_the_cap_is_skipped_as_full() -> None:
    targets = [target(1, circuit_open=True, in_flight=4), target(2, circuit_open=True)]

    decision = route(targets)

    assert ranked_ids(decision) == [2]
    assert skipped_reasons(decision) == {1: "full"}


def test_a_server_error_another_target_returned_for_the_same_request_names_that_target() -> None:
    memory = ServerErrorMemory()

    assert memory.note("req", 1, now=0.0) == frozenset()
    assert memory.note("req", 1, now=1.0) == frozenset()  # the same target again
    assert memory.note("req", 2, now=2.0) == frozenset({1})
    assert memory.note("other", 3, now=3.0) == frozenset()


def test_server_errors_are_forgotten_after_their_ttl_and_beyond_the_bound() -> None:
    memory = ServerErrorMemory(max_entries=2, ttl_s=10.0)
    memory.note("old", 1, now=0.0)
    assert memory.note("old", 2, now=11.0) == frozenset()

    memory.note("a", 1, now=20.0)
    memory.note("b", 1, now=20.0)
    memory.note("c", 1, now=20.0)  # pushes "a" out
    assert memory.note("a", 2, now=21.0) == frozenset()


def test_forgiving_a_failure_takes_it_back_from_the_count_that_ejects() -> None:
    health = PassiveHealth()
    health.record(1, ok=False, now=0.0)
    health.record(1, ok=False, now=0.0)
    health.forgive(1)

    health.record(1, ok=False, now=0.0)

    assert not health.circuit_open(1, now=0.1)  # two failures in a row, not three
    assert health.error_rate(1) == pytest.approx(2 / 3)
