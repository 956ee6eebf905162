"""Bounded wait for a full sticky target (issue 11, point 3): a request whose conversation's
target is full waits for it, a bounded time, only when the predicted wait there is shorter than
what moving would cost; a woken waiter takes that target; the queue keeps such waiters apart."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pools.balancer.queue import WOKEN_IN_ORDER, Affinity, FairQueue, PoolQueue
from pools.balancer.snapshot import (
    DrainState,
    Health,
    PoolPolicy,
    RequestFacts,
    StickyWait,
    TargetView,
)
from pools.balancer.sticky import (
    BOUND_FACTOR,
    MAX_WAIT_S,
    MIN_BOUND_S,
    after_wait,
    move_loss_s,
    predicted_wait_s,
    sticky_wait,
)
from pools.balancer.strategies import decide
from tests.balancer import target
from tests.support.properties import examples

SMART = PoolPolicy("smart")
HOME, AWAY = 1, 2


def view(
    target_id: int,
    *,
    capacity: int = 4,
    in_flight: int = 0,
    ttft_s: float | None = 0.05,
    tpot_s: float | None = 0.01,
    service_s: float | None = None,
    **fields: object,
) -> TargetView:
    """Return the shared builder's target with the timings a sticky wait predicts from."""
    return target(
        target_id,
        capacity=capacity,
        in_flight=in_flight,
        ttft_s=ttft_s,
        tpot_s=tpot_s,
        service_s=service_s,
        **fields,
    )


def facts(
    *, may_wait_s: float = 2.0, tokens: int | None = 128, sticky: int | None = HOME
) -> RequestFacts:
    return RequestFacts(
        kind="chat", sticky_target_id=sticky, output_tokens=tokens, may_wait_s=may_wait_s
    )


def verdict(
    targets: list[TargetView],
    request: RequestFacts,
    policy: PoolPolicy = SMART,
    ahead: int = 0,
) -> StickyWait | None:
    decision = decide(targets, policy, request, rng=random.Random(0), turn=0)
    return sticky_wait(targets, policy, request, decision, ahead=ahead)


# A fast home with 8 slots, all busy, and a slower target with room: the benchmark's case.
FAST_FULL = view(HOME, capacity=8, in_flight=8, ttft_s=0.06, tpot_s=0.008, service_s=1.1)
MEDIUM = view(AWAY, capacity=8, in_flight=3, ttft_s=0.12, tpot_s=0.016, service_s=2.2)


def test_a_conversation_waits_for_its_full_fast_target_rather_than_move_to_a_slower_one():
    wait = verdict([FAST_FULL, MEDIUM], facts())

    assert wait is not None
    # A slot frees every 1.1 s / 8; moving costs medium's TTFT and 128 tokens at 8 ms more.
    assert wait.predicted_s == pytest.approx(1.1 / 8)
    assert wait.loss_s == pytest.approx(0.12 + 128 * 0.008)
    assert wait.bound_s == pytest.approx(BOUND_FACTOR * 1.1 / 8)
    assert (wait.target_id, wait.alternative_id) == (HOME, AWAY)
    assert wait.reason() == "predicted 138 ms < 1144 ms re-prefill and decode loss on t2"


def test_it_does_not_wait_for_a_slow_target_when_a_faster_one_has_room():
    slow_full = view(HOME, capacity=4, in_flight=4, ttft_s=0.25, tpot_s=0.032, service_s=4.0)
    fast = view(AWAY, capacity=8, in_flight=2, ttft_s=0.06, tpot_s=0.008)

    assert verdict([slow_full, fast], facts()) is None  # moving gains decode time


def test_it_does_not_wait_when_the_predicted_wait_exceeds_the_loss():
    # Equal speeds: moving costs only the prompt's recomputation (50 ms); a slot takes longer.
    home = view(HOME, capacity=2, in_flight=2, service_s=1.0)

    assert verdict([home, view(AWAY)], facts()) is None


def test_requests_already_waiting_for_the_target_lengthen_the_prediction():
    assert predicted_wait_s(FAST_FULL, 3, 128) == pytest.approx(4 * 1.1 / 8)
    # Three ahead: 550 ms predicted, still below the 1,144 ms loss.
    wait = verdict([FAST_FULL, MEDIUM], facts(), ahead=3)
    assert wait is not None and wait.predicted_s == pytest.approx(0.55)
    assert verdict([FAST_FULL, MEDIUM], facts(), ahead=8) is None  # 1,238 ms: not worth it


def test_without_an_observed_service_time_the_prediction_uses_ttft_and_tokens():
    home = view(HOME, capacity=8, in_flight=8, ttft_s=0.06, tpot_s=0.008)

    assert predicted_wait_s(home, 0, 128) == pytest.approx((0.06 + 128 * 0.008) / 8)


def test_it_never_waits_without_knowing_both_speeds():
    unknown = view(HOME, capacity=8, in_flight=8, ttft_s=None, tpot_s=None)
    assert verdict([unknown, MEDIUM], facts()) is None
    assert verdict([FAST_FULL, view(AWAY, ttft_s=None, tpot_s=None)], facts()) is None
    assert move_loss_s(FAST_FULL, view(AWAY, tpot_s=None), 128) is None


def test_the_bound_has_a_floor_and_never_exceeds_the_cap_or_the_requests_allowance():
    quick = view(HOME, capacity=8, in_flight=8, ttft_s=0.001, tpot_s=0.0001, service_s=0.008)
    slow = view(AWAY, ttft_s=0.5, tpot_s=0.05)
    floor = verdict([quick, slow], facts())
    assert floor is not None and floor.bound_s == MIN_BOUND_S

    long_service = view(HOME, capacity=1, in_flight=1, ttft_s=0.06, tpot_s=0.008, service_s=1.9)
    very_slow = view(AWAY, ttft_s=1.0, tpot_s=0.1)
    capped = verdict([long_service, very_slow], facts(tokens=1024))
    assert capped is not None and capped.bound_s == MAX_WAIT_S
    # The allowance left (the pool's queue timeout) is below the prediction: no wait at all.
    assert verdict([long_service, very_slow], facts(tokens=1024, may_wait_s=1.0)) is None


@pytest.mark.parametrize(
    "home",
    [
        view(HOME, capacity=8, in_flight=8, ttft_s=0.06, tpot_s=0.008, health=Health.UNHEALTHY),
        view(HOME, capacity=8, in_flight=8, ttft_s=0.06, tpot_s=0.008, health=Health.DEGRADED),
        view(HOME, capacity=8, in_flight=8, ttft_s=0.06, tpot_s=0.008, drain=DrainState.DRAINING),
        view(HOME, capacity=8, in_flight=8, ttft_s=0.06, tpot_s=0.008, enabled=False),
        view(HOME, capacity=8, in_flight=8, ttft_s=0.06, tpot_s=0.008, circuit_open=True),
        view(HOME, capacity=8, in_flight=7, ttft_s=0.06, tpot_s=0.008),  # has room: kept
    ],
    ids=["unhealthy", "degraded", "draining", "disabled", "circuit open", "not full"],
)
def test_it_never_waits_for_a_target_that_is_out_of_service_or_has_room(home: TargetView):
    assert verdict([home, MEDIUM], facts()) is None


def test_it_never_waits_without_a_sticky_target_or_an_allowance_or_outside_smart():
    assert verdict([FAST_FULL, MEDIUM], facts(sticky=None)) is None
    assert verdict([FAST_FULL, MEDIUM], facts(may_wait_s=0.0)) is None
    assert verdict([FAST_FULL, MEDIUM], facts(), PoolPolicy("least_busy")) is None
    assert verdict([FAST_FULL, MEDIUM], facts(), PoolPolicy("smart", False)) is None
    # Every target full: the request queues anyway (affinity wake-up), no verdict needed.
    medium_full = view(AWAY, capacity=8, in_flight=8, ttft_s=0.12, tpot_s=0.016)
    assert verdict([FAST_FULL, medium_full], facts()) is None


def test_a_prompt_prefix_target_counts_when_there_is_no_conversation_target():
    request = RequestFacts(kind="chat", prefix_target_id=HOME, output_tokens=128, may_wait_s=2.0)

    wait = verdict([FAST_FULL, MEDIUM], request)
    assert wait is not None and wait.target_id == HOME


# --- properties of the rule ---------------------------------------------------------------------

seconds = st.floats(min_value=0.0005, max_value=5.0, allow_nan=False)
maybe_seconds = st.one_of(st.none(), seconds)


@st.composite
def situations(draw: st.DrawFn) -> tuple[list[TargetView], RequestFacts, int]:
    targets = []
    for target_id in (HOME, AWAY, 3):
        capacity = draw(st.integers(1, 8))
        targets.append(
            view(
                target_id,
                capacity=capacity,
                in_flight=draw(st.integers(0, capacity)),
                ttft_s=draw(maybe_seconds),
                tpot_s=draw(st.one_of(st.none(), st.floats(0.0001, 0.1))),
                service_s=draw(maybe_seconds),
                health=draw(st.sampled_from(list(Health))),
                drain=draw(st.sampled_from(list(DrainState))),
                enabled=draw(st.booleans()),
                circuit_open=draw(st.booleans()),
            )
        )
    request = RequestFacts(
        kind="chat",
        sticky_target_id=draw(st.one_of(st.none(), st.sampled_from([HOME, AWAY, 3, 99]))),
        prefix_target_id=draw(st.one_of(st.none(), st.sampled_from([HOME, AWAY]))),
        output_tokens=draw(st.one_of(st.none(), st.integers(1, 5000))),
        may_wait_s=draw(st.floats(0.0, 10.0)),
    )
    return targets, request, draw(st.integers(0, 10))


@given(situations())
@settings(max_examples=examples(400), deadline=None)
def test_property_a_wait_is_bounded_worth_it_and_only_for_a_full_healthy_sticky_target(
    situation: tuple[list[TargetView], RequestFacts, int],
):
    targets, request, ahead = situation
    wait = verdict(targets, request, ahead=ahead)
    if wait is None:
        return
    home_id = request.sticky_target_id
    if home_id is None:
        home_id = request.prefix_target_id
    home = next(t for t in targets if t.id == home_id)
    # Only for the request's own sticky target, in service, healthy and full.
    assert wait.target_id == home_id
    assert home.enabled and home.drain is DrainState.ACTIVE and not home.circuit_open
    assert home.health is Health.HEALTHY
    assert home.in_flight >= home.capacity
    # Only when the predicted wait is shorter than the loss of moving.
    assert wait.predicted_s < wait.loss_s
    # Never longer than the bound, which is within the cap, the allowance and the loss, and
    # leaves the prediction time to come true.
    assert wait.predicted_s <= wait.bound_s <= min(MAX_WAIT_S, request.may_wait_s, wait.loss_s)
    assert wait.bound_s <= max(BOUND_FACTOR * wait.predicted_s, MIN_BOUND_S)


@given(situations())
@settings(max_examples=examples(200), deadline=None)
def test_property_no_wait_without_a_sticky_target_or_without_an_allowance(
    situation: tuple[list[TargetView], RequestFacts, int],
):
    targets, request, ahead = situation
    from dataclasses import replace

    alone = replace(request, sticky_target_id=None, prefix_target_id=None)
    assert verdict(targets, alone, ahead=ahead) is None
    assert verdict(targets, replace(request, may_wait_s=0.0), ahead=ahead) is None


# --- after the wait ---------------------------------------------------------------------------


def test_after_the_wait_the_sticky_target_takes_the_request_whatever_the_scores():
    wait = verdict([FAST_FULL, MEDIUM], facts())
    assert wait is not None
    # A slot freed on home; medium is now idle and would outscore it.
    home_now = view(HOME, capacity=8, in_flight=7, ttft_s=0.06, tpot_s=0.008)
    idle = view(AWAY, capacity=8, in_flight=0, ttft_s=0.06, tpot_s=0.008)
    request = facts(may_wait_s=0.0)
    decision = decide([home_now, idle], SMART, request, rng=random.Random(0), turn=0)
    assert decision.target_id == AWAY

    placed = after_wait(decision, wait, 0.18)

    assert placed.target_id == HOME
    assert [ranked.target_id for ranked in placed.ranking] == [HOME, AWAY]
    continuity = {f.name: f.note for f in placed.ranking[0].factors}["continuity"]
    assert continuity == "kept: same conversation"
    assert placed.continuity == (
        "waited 180 ms for sticky target t1 "
        "(predicted 138 ms < 1144 ms re-prefill and decode loss on t2)"
    )
    assert placed.to_dict()["sticky_wait"] == {
        "target_id": HOME,
        "name": "t1",
        "alternative": "t2",
        "predicted_ms": 137.5,
        "loss_ms": 1144.0,
        "bound_ms": 206.3,
    }


def test_when_the_bound_passes_the_request_is_placed_as_usual_and_the_history_says_so():
    wait = verdict([FAST_FULL, MEDIUM], facts())
    assert wait is not None
    decision = decide(
        [FAST_FULL, MEDIUM], SMART, facts(may_wait_s=0.0), rng=random.Random(0), turn=0
    )

    placed = after_wait(decision, wait, 0.21)

    assert placed.target_id == AWAY
    assert (
        placed.continuity
        == "yielded: sticky target full after waiting 210 ms for it (bound 206 ms)"
    )


# --- the queue's side: a waiter for one target only -------------------------------------------


def test_a_waiter_for_one_target_gets_only_that_targets_slots():
    queue: FairQueue[str] = FairQueue(10)
    queue.admit(1, "pinned", at=0.0, affinity=Affinity(HOME), only=HOME)
    queue.admit(2, "any", at=0.1)

    assert (queue.unpinned(), queue.pinned_to(HOME), len(queue)) == (1, 1, 2)
    assert queue.pop_for(AWAY, "t2") == ("any", WOKEN_IN_ORDER)
    assert queue.pop_for(AWAY, "t2") is None
    assert queue.pop() is None  # fair order passes it by: the slot may be another target's
    assert queue.pop_for(HOME, "t1") == ("pinned", "sticky target t1 freed a slot")
    assert (len(queue), queue.pinned_to(HOME)) == (0, 0)


def test_a_waiter_for_its_target_goes_ahead_of_earlier_waiters_within_the_bounds():
    queue: FairQueue[str] = FairQueue(10)
    queue.admit(2, "earlier", at=0.0)
    queue.admit(1, "pinned", at=0.1, only=HOME)

    assert queue.pop_for(HOME, "t1") == (
        "pinned",
        "sticky target t1 freed a slot, ahead of 1 earlier waiter",
    )


def test_a_waiter_that_leaves_is_no_longer_counted_for_its_target():
    queue: FairQueue[str] = FairQueue(10)
    queue.admit(1, "pinned", only=HOME)

    assert queue.remove("pinned")
    assert (queue.pinned_to(HOME), queue.unpinned(), len(queue)) == (0, 0, 0)


def test_a_sticky_wait_ends_at_its_bound_and_is_not_refused_by_the_queues_estimate():
    async def scenario() -> None:
        queue = PoolQueue(4)
        for _ in range(5):
            queue.record_service_time(10.0)  # an estimate far beyond the bound
        with pytest.raises(Exception) as ended:
            await queue.wait(1, 0.05, capacity=1, only=HOME)
        assert type(ended.value).__name__ == "QueueTimeout"
        assert len(queue) == 0

        waiter = asyncio.ensure_future(queue.wait(1, 1.0, capacity=1, only=HOME))
        await asyncio.sleep(0)
        assert queue.unpinned() == 0 and len(queue) == 1
        assert not queue.wake_next()  # a slot of any target is not its
        assert queue.wake_for(HOME, "t1")
        assert await waiter == "sticky target t1 freed a slot"

    asyncio.run(scenario())


def test_the_waiters_a_targets_slots_go_to_first_are_counted_for_the_prediction():
    queue: FairQueue[str] = FairQueue(10)
    queue.admit(1, "pinned", only=HOME)
    queue.admit(2, "lives there", affinity=Affinity(session_target_id=HOME))
    queue.admit(3, "prefix only", affinity=Affinity(prefix_target_id=HOME))
    queue.admit(4, "elsewhere", affinity=Affinity(session_target_id=AWAY))

    assert (queue.bound_for(HOME), queue.bound_for(AWAY), queue.pinned_to(HOME)) == (2, 1, 1)
