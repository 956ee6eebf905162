"""Affinity-aware wake-up: a slot freed on a target goes first to a waiter whose conversation
(or prompt prefix) lives there, within bounds, keeping each token's turns."""

from __future__ import annotations

import asyncio
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from pools.balancer.queue import (
    MAX_LEAD_S,
    MAX_PASSED,
    NO_AFFINITY,
    WOKEN_IN_ORDER,
    Affinity,
    FairQueue,
    PoolQueue,
)
from tests.support.properties import examples

ALICE, BOB = 1, 2
T1, T2, T3 = 11, 12, 13


def on(target_id: int) -> Affinity:
    return Affinity(session_target_id=target_id)


def test_a_slot_goes_to_the_waiter_whose_conversation_lives_on_its_target():
    queue: FairQueue[str] = FairQueue(10)
    queue.admit(ALICE, "a1", at=0.0, affinity=on(T1))
    queue.admit(BOB, "b1", at=0.1, affinity=on(T2))

    assert queue.pop_for(T2, "t2") == ("b1", "conversation on t2, ahead of 1 earlier waiter")
    assert queue.pop_for(T2, "t2") == ("a1", WOKEN_IN_ORDER)


def test_a_conversation_beats_a_prompt_prefix_and_a_prefix_beats_fair_order():
    queue: FairQueue[str] = FairQueue(10)
    queue.admit(ALICE, "a1", at=0.0)
    queue.admit(BOB, "b1", at=0.0, affinity=Affinity(prefix_target_id=T1))
    queue.admit(ALICE, "a2", at=0.0, affinity=on(T1))

    assert queue.pop_for(T1, "t1") == ("a2", "conversation on t1, ahead of 2 earlier waiters")
    # Alice's turn is spent: Bob's b1 is next in fair order now.
    assert queue.pop_for(T1, "t1") == ("b1", WOKEN_IN_ORDER)

    queue.admit(ALICE, "a3", at=0.0)
    queue.admit(BOB, "b2", at=0.0, affinity=Affinity(prefix_target_id=T1))
    assert list(queue.positions()) == ["a1", "b2", "a3"]
    assert queue.pop_for(T1, "t1") == ("b2", "prompt prefix on t1, ahead of 1 earlier waiter")


def test_no_waiter_is_passed_over_more_than_the_bound():
    queue: FairQueue[str] = FairQueue(100)
    queue.admit(ALICE, "head", at=0.0, affinity=on(T2))
    for number in range(MAX_PASSED + 3):
        queue.admit(BOB, f"b{number}", at=0.0, affinity=on(T1))

    taken = [queue.pop_for(T1, "t1") for _ in range(MAX_PASSED + 1)]

    assert [ticket for ticket, _ in taken if ticket] == [f"b{n}" for n in range(MAX_PASSED)] + [
        "head"
    ]


def test_a_waiter_that_came_much_later_than_the_head_does_not_pass_it():
    queue: FairQueue[str] = FairQueue(10)
    queue.admit(ALICE, "a1", at=0.0)
    queue.admit(BOB, "b1", at=MAX_LEAD_S + 0.01, affinity=on(T1))

    assert queue.pop_for(T1, "t1") == ("a1", WOKEN_IN_ORDER)


def test_a_token_that_took_a_slot_early_goes_to_the_end_of_the_turn_order():
    queue: FairQueue[str] = FairQueue(10)
    for token_id, ticket in [(ALICE, "a1"), (BOB, "b1"), (ALICE, "a2"), (BOB, "b2")]:
        queue.admit(token_id, ticket, at=0.0, affinity=on(T1) if ticket == "b1" else NO_AFFINITY)

    assert queue.pop_for(T1, "t1") == ("b1", "conversation on t1, ahead of 1 earlier waiter")
    # Bob's early slot was his turn: Alice's comes next, then they alternate again.
    assert [queue.pop() for _ in range(3)] == ["a1", "b2", "a2"]


arrivals = st.lists(
    st.tuples(
        st.sampled_from([ALICE, BOB, 3]),
        st.sampled_from([None, T1, T2, T3]),
        st.sampled_from([None, T1, T2, T3]),
        st.floats(0.0, 3.0),
    ),
    max_size=30,
)
frees = st.lists(st.sampled_from([T1, T2, T3]), max_size=40)


@settings(max_examples=examples(300), deadline=None)
@given(arrivals, frees)
def test_every_wake_up_keeps_the_bounds(arrived, freed):
    queue: FairQueue[int] = FairQueue(100)
    info = {}
    for ticket, (token_id, session, prefix, at) in enumerate(arrived):
        queue.admit(token_id, ticket, at=at, affinity=Affinity(session, prefix))
        info[ticket] = (session, prefix, at)
    passed: Counter[int] = Counter()

    for target_id in freed:
        order = list(queue.positions())
        taken = queue.pop_for(target_id, "t")
        if not order:
            assert taken is None
            continue
        assert taken is not None
        ticket, rule = taken
        place = order.index(ticket)
        assert place <= MAX_PASSED
        for earlier in order[:place]:
            passed[earlier] += 1
            assert passed[earlier] <= MAX_PASSED
        if place:
            head_at = info[order[0]][2]
            session, prefix, at = info[ticket]
            assert target_id in (session, prefix)
            assert at - head_at <= MAX_LEAD_S
            # No earlier waiter that could take it had its conversation there.
            assert all(
                info[earlier][0] != target_id or info[earlier][2] - head_at > MAX_LEAD_S
                for earlier in order[:place]
            )
        else:
            assert rule == WOKEN_IN_ORDER


@settings(max_examples=examples(200), deadline=None)
@given(arrivals, frees)
def test_without_affinities_a_freed_slot_goes_in_fair_order(arrived, freed):
    plain: FairQueue[int] = FairQueue(100)
    aware: FairQueue[int] = FairQueue(100)
    for ticket, (token_id, _, _, at) in enumerate(arrived):
        plain.admit(token_id, ticket)
        aware.admit(token_id, ticket, at=at)

    for target_id in freed:
        taken = aware.pop_for(target_id, "t")
        assert (taken[0] if taken else None) == plain.pop()


async def test_a_waiter_learns_the_rule_that_woke_it():
    queue = PoolQueue(10)
    first = asyncio.create_task(queue.wait(ALICE, 5.0, capacity=1, affinity=on(T2)))
    await asyncio.sleep(0)
    second = asyncio.create_task(queue.wait(BOB, 5.0, capacity=1, affinity=on(T1)))
    await asyncio.sleep(0)

    assert queue.wake_for(T1, "t1")
    assert await asyncio.wait_for(second, 1.0) == "conversation on t1, ahead of 1 earlier waiter"
    assert queue.wake_next()
    assert await asyncio.wait_for(first, 1.0) == WOKEN_IN_ORDER
