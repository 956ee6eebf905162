"""Engine readings and Nexus's own count agree: the engine adds only what Nexus did not send.

A reading keeps Nexus's in-flight count at the time it was taken (`engine_counted`); the engine's
count beyond it is other clients' load. A reading taken before Nexus's last change to the
target's load therefore never counts Nexus's own, since finished, requests again.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from pools.balancer.snapshot import Factor, TargetView
from pools.balancer.strategies import engine_load, load_of
from tests.balancer import route, target
from tests.support.properties import examples

counts = st.integers(0, 64)


@settings(max_examples=examples(500), deadline=None)
@given(in_flight=counts, counted=counts, other_clients=counts, lag=st.integers(0, 64))
def test_the_engine_adds_exactly_the_other_clients_load(in_flight, counted, other_clients, lag):
    # The engine saw what Nexus had sent it then (some requests not there yet: `lag`) plus
    # other clients'; since then Nexus's own count moved to in_flight.
    seen_of_ours = max(0, counted - lag)

    load = engine_load(in_flight, seen_of_ours + other_clients, counted)

    assert in_flight <= load <= in_flight + other_clients
    if lag == 0:
        assert load == in_flight + other_clients


@settings(max_examples=examples(500), deadline=None)
@given(
    capacity=st.integers(1, 16),
    in_flight=counts,
    running=counts,
    waiting=counts,
    counted=counts,
)
def test_a_target_nexus_alone_uses_is_exactly_as_busy_as_nexus_keeps_it(
    capacity, in_flight, running, waiting, counted
):
    # Whatever the reading's age: an engine that counts no more than Nexus had sent it adds
    # nothing, so a target that Nexus emptied since the reading looks idle, not full.
    running, waiting = min(running, counted), min(waiting, counted - min(running, counted))
    view = target(
        1,
        capacity=capacity,
        in_flight=min(in_flight, capacity - 1),
        engine_running=running,
        engine_waiting=waiting,
        engine_counted=counted,
    )

    assert load_of(view) == view.in_flight
    decision = route([view])
    assert decision.ranking[0].factors[0] == Factor("utilization", (view.in_flight + 1) / capacity)


def test_without_the_count_at_reading_the_engine_count_stands_for_the_load_when_larger():
    # The dry run has no count at reading (not published): the former rule, max of the two.
    assert load_of(target(1, in_flight=1, engine_running=3, engine_counted=None)) == 3
    assert load_of(target(1, in_flight=3, engine_running=1, engine_counted=None)) == 3


def idle_pair(reading_of_first: dict[str, int | None]) -> list[TargetView]:
    """Two identical capacity-2 targets, both idle now, both warm and equally fast."""
    base = target(1, capacity=2, warm=True, ttft_s=0.05, tpot_s=0.02)
    return [
        dataclasses.replace(base, **reading_of_first),
        dataclasses.replace(base, id=2, name="t2", position=2),
    ]


def test_a_conversation_stays_on_its_idle_target_read_while_its_last_turn_ran():
    # The engine was read while the conversation's previous turn ran there (2 running, both
    # Nexus's); that turn has finished since. Before, the reading made the target look full
    # ("yielded: score 0.90 vs 0.40").
    targets = idle_pair({"engine_running": 2, "engine_waiting": 0, "engine_counted": 2})

    decision = route(targets, sticky=1)

    assert decision.target_id == 1
    assert decision.continuity == "kept"
    assert decision.ranking[0].factors[0] == Factor("utilization", 0.5)


def test_a_conversation_still_yields_when_other_clients_fill_its_engine():
    targets = idle_pair({"engine_running": 3, "engine_waiting": 0, "engine_counted": 1})

    decision = route(targets, sticky=1)

    assert decision.target_id == 2
    assert decision.continuity.startswith("yielded: score")
