"""The pool queue: bounded, fair per client token, and its asyncio shell."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pools.balancer.queue import (
    OVER_FAIR_SHARE,
    QUEUE_FULL,
    WAIT_TOO_LONG,
    FairQueue,
    PoolQueue,
    QueueFull,
    QueueTimeout,
    estimated_wait_s,
    retry_after_s,
)
from tests.support.properties import examples

ALICE, BOB, CAROL = 1, 2, 3


def filled(max_size: int, *arrivals: tuple[int, str]) -> FairQueue[str]:
    queue: FairQueue[str] = FairQueue(max_size)
    for token_id, ticket in arrivals:
        assert queue.admit(token_id, ticket) is None
    return queue


def drain(queue: FairQueue[str]) -> list[str]:
    popped = []
    while (ticket := queue.pop()) is not None:
        popped.append(ticket)
    return popped


# FairQueue: order


def test_it_serves_one_token_first_in_first_out():
    queue = filled(10, (ALICE, "a1"), (ALICE, "a2"), (ALICE, "a3"))

    assert drain(queue) == ["a1", "a2", "a3"]


def test_it_serves_tokens_in_turn_in_the_order_they_started_waiting():
    queue = filled(10, (ALICE, "a1"), (ALICE, "a2"), (ALICE, "a3"), (BOB, "b1"), (CAROL, "c1"))

    assert drain(queue) == ["a1", "b1", "c1", "a2", "a3"]


def test_a_token_that_ran_dry_rejoins_at_the_end_of_the_turn_order():
    queue = filled(10, (ALICE, "a1"), (BOB, "b1"), (BOB, "b2"))
    assert queue.pop() == "a1"

    queue.admit(ALICE, "a2")

    assert drain(queue) == ["b1", "a2", "b2"]


def test_pop_on_an_empty_queue_returns_none():
    assert FairQueue(3).pop() is None


# FairQueue: admission


def test_a_lone_token_may_fill_the_whole_queue():
    queue = filled(4, *[(ALICE, f"a{i}") for i in range(4)])

    assert queue.admit(ALICE, "a4") == QUEUE_FULL
    assert len(queue) == 4


def test_a_token_under_its_share_takes_the_place_of_the_newest_waiter_most_over_its_own():
    # Alice filled the queue alone; Bob's first two requests each push out Alice's newest.
    queue = filled(4, *[(ALICE, f"a{i}") for i in range(4)])

    assert queue.victim(BOB) == "a3"
    assert queue.admit(BOB, "b1") is None
    assert queue.victim(BOB) == "a2"
    assert queue.admit(BOB, "b2") is None
    # Now each holds its share (2 of 4): the queue is full for both.
    assert queue.victim(BOB) is None
    assert queue.admit(BOB, "b3") == QUEUE_FULL
    assert queue.admit(ALICE, "a4") == QUEUE_FULL
    assert drain(queue) == ["a0", "b1", "a1", "b2"]


def test_the_token_most_over_its_share_gives_up_a_place_first():
    # 6 places: Alice waited alone with 5, then Bob came; Carol makes the share 2 each.
    queue = filled(6, *[(ALICE, f"a{i}") for i in range(5)], (BOB, "b0"))

    assert queue.victim(CAROL) == "a4"


def test_no_place_is_taken_from_a_token_that_would_then_hold_no_more_than_the_newcomer():
    # 3 places, Alice 2 and Bob 1: Bob's second would only trade places with Alice's second.
    queue = filled(3, (ALICE, "a0"), (ALICE, "a1"), (BOB, "b0"))

    assert queue.victim(BOB) is None
    assert queue.admit(BOB, "b1") == QUEUE_FULL


def test_it_refuses_a_token_over_its_fair_share_while_others_wait():
    # 10 places, two tokens waiting: each may hold 5.
    queue = filled(10, *[(ALICE, f"a{i}") for i in range(5)], (BOB, "b1"))

    assert queue.admit(ALICE, "a5") == OVER_FAIR_SHARE
    assert queue.admit(BOB, "b2") is None
    assert queue.waiting_for(ALICE) == 5


def test_a_newcomer_counts_itself_when_its_share_is_computed():
    # Alice holds 5 of 9 places; Bob would make two tokens (share 4): Bob's first gets in.
    queue = filled(9, *[(ALICE, f"a{i}") for i in range(5)])

    assert queue.admit(BOB, "b1") is None
    assert queue.admit(ALICE, "a5") == OVER_FAIR_SHARE


def test_the_fair_share_is_at_least_one_place():
    queue = filled(2, (ALICE, "a1"), (BOB, "b1"))

    assert queue.admit(CAROL, "c1") == QUEUE_FULL
    assert queue.admit(ALICE, "a2") == QUEUE_FULL


def test_it_refuses_the_same_ticket_twice():
    queue = filled(5, (ALICE, "a1"))

    with pytest.raises(ValueError, match="already queued"):
        queue.admit(BOB, "a1")


def test_it_rejects_a_queue_without_room():
    with pytest.raises(ValueError, match="at least 1"):
        FairQueue(0)


# FairQueue: abandoned waiters and the live view


def test_an_abandoned_waiter_leaves_at_once():
    queue = filled(10, (ALICE, "a1"), (ALICE, "a2"), (BOB, "b1"))

    assert queue.remove("a1") is True
    assert queue.remove("a1") is False
    assert len(queue) == 2
    assert "a1" not in queue
    assert drain(queue) == ["a2", "b1"]


def test_a_token_whose_last_waiter_left_gives_up_its_turn():
    queue = filled(10, (ALICE, "a1"), (BOB, "b1"), (BOB, "b2"))

    queue.remove("a1")

    assert queue.waiting_by_token() == {BOB: 2}
    assert drain(queue) == ["b1", "b2"]


def test_the_live_view_shows_places_in_line_and_counts_per_token():
    queue = filled(10, (ALICE, "a1"), (ALICE, "a2"), (BOB, "b1"), (CAROL, "c1"), (CAROL, "c2"))

    assert queue.positions() == {"a1": 1, "b1": 2, "c1": 3, "a2": 4, "c2": 5}
    assert queue.waiting_by_token() == {ALICE: 2, BOB: 1, CAROL: 2}
    assert queue.waiting_for(ALICE) == 2
    assert queue.waiting_for(99) == 0


@pytest.mark.parametrize(
    ("token_id", "ahead"),
    [
        (ALICE, 5),  # a3: after a1 b1 c1 a2 c2
        (BOB, 4),  # b2: after a1 b1 c1 a2
        (CAROL, 5),  # c3: after a1 b1 c1 a2 c2
        (99, 3),  # a newcomer: after one of each waiting token
    ],
)
def test_it_counts_who_would_be_served_before_a_new_ticket(token_id, ahead):
    queue = filled(20, (ALICE, "a1"), (ALICE, "a2"), (BOB, "b1"), (CAROL, "c1"), (CAROL, "c2"))

    assert queue.ahead_of_new(token_id) == ahead
    queue.admit(token_id, "new")
    assert queue.positions()["new"] == ahead + 1


# FairQueue: properties

TOKENS = st.integers(min_value=1, max_value=4)
# Long runs, so the queue fills, tokens come and go, and pops follow each other.
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), TOKENS),
        st.tuples(st.just("pop"), st.just(0)),
        st.tuples(st.just("remove"), st.integers(min_value=0, max_value=200)),
    ),
    min_size=20,
    max_size=120,
)


@settings(max_examples=examples(150), deadline=None)
@given(max_size=st.integers(min_value=1, max_value=12), operations=OPERATIONS)
def test_it_keeps_its_invariants_under_any_sequence_of_operations(max_size, operations):
    queue: FairQueue[int] = FairQueue(max_size)
    # Model: per token, the tickets still queued in arrival order.
    model: dict[int, list[int]] = {}
    admitted_at: dict[int, tuple[int, int]] = {}  # ticket -> (pops so far, place bound)
    pops = 0
    issued = 0
    # The serving order foretold after the last arrival or departure; pops must follow it.
    foretold: list[int] = []
    for operation, argument in operations:
        if operation == "admit":
            token_id, ticket = argument, issued
            issued += 1
            held = len(model.get(token_id, []))
            waiting = sum(1 for tickets in model.values() if tickets)
            tokens = waiting + (0 if held else 1)
            share = max_size / tokens
            victim = None
            if len(queue) >= max_size:
                # The newest ticket of the token most over its share (first in turn order on a
                # tie) makes room for a token under its own.
                over = [
                    (len(model[other]) - share, other)
                    for other in queue.waiting_by_token()
                    if other != token_id
                    and len(model[other]) > share
                    and len(model[other]) >= held + 2
                ]
                if held < share and over:
                    excess = max(e for e, _ in over)
                    victim = model[next(o for e, o in over if e == excess)][-1]
                expected = None if victim is not None else QUEUE_FULL
            elif held >= share:
                expected = OVER_FAIR_SHARE
            else:
                expected = None
            # The promise: a token with 2 requests is never refused while another token
            # holds more than half the queue (of 4 places or more: in 3, a second request of a
            # token holding 1 would only trade places with the other's second).
            if (
                max_size >= 4
                and held < 2
                and any(
                    len(tickets) > max_size / 2
                    for other, tickets in model.items()
                    if other != token_id
                )
            ):
                assert expected is None
            assert queue.victim(token_id) == victim
            predicted = queue.ahead_of_new(token_id)
            if victim is not None:
                predicted -= 1 if queue.positions()[victim] <= predicted else 0
            assert queue.admit(token_id, ticket) == expected
            if victim is not None:
                for tickets in model.values():
                    if victim in tickets:
                        tickets.remove(victim)
                admitted_at.pop(victim)
            if expected is None:
                model.setdefault(token_id, []).append(ticket)
                assert queue.positions()[ticket] == predicted + 1
                foretold = list(queue.positions())
                # Served within one turn per queued ticket of its own, each turn at most one
                # ticket of every token (4 at most): no token starves.
                admitted_at[ticket] = (pops, (held + 1) * 4)
        elif operation == "pop":
            ticket = queue.pop()
            if ticket is None:
                assert not any(model.values())
                continue
            pops += 1
            assert ticket == foretold.pop(0)
            owner = next(token for token, tickets in model.items() if ticket in tickets)
            # FIFO within a token.
            assert model[owner][0] == ticket
            model[owner].pop(0)
            popped_after, bound = admitted_at.pop(ticket)
            assert pops - popped_after <= bound
        else:
            queued = [ticket for tickets in model.values() for ticket in tickets]
            ticket = queued[argument % len(queued)] if queued else argument + 10_000
            assert queue.remove(ticket) is bool(queued)
            for tickets in model.values():
                if ticket in tickets:
                    tickets.remove(ticket)
            admitted_at.pop(ticket, None)
            foretold = list(queue.positions())
        assert len(queue) <= max_size
        assert len(queue) == sum(len(tickets) for tickets in model.values())
        assert queue.waiting_by_token() == {
            token: len(tickets) for token, tickets in model.items() if tickets
        }


@settings(max_examples=examples(100), deadline=None)
@given(schedule=st.lists(st.sampled_from(["big", "small", "pop", "pop"]), max_size=300))
def test_a_token_with_10_queued_waits_a_bounded_time_while_another_has_1000(schedule):
    # Given a heavy token with 1,000 requests waiting,
    queue: FairQueue[str] = FairQueue(2000)
    for i in range(1000):
        queue.admit(ALICE, f"big{i}")
    # when requests of both tokens keep arriving between pops, the light token sending 10,
    arrived_at: dict[str, int] = {}
    pops = 0
    small_sent = 0
    for step, event in enumerate(schedule):
        if event == "big":
            queue.admit(ALICE, f"big-later{step}")
        elif event == "small" and small_sent < 10:
            ticket = f"small{small_sent}"
            assert queue.admit(BOB, ticket) is None
            arrived_at[ticket] = pops
            small_sent += 1
        elif event == "pop":
            ticket = queue.pop()
            pops += 1 if ticket is not None else 0
            if ticket in arrived_at:
                # then each of its requests is served within 2 x 10 pops of arriving.
                assert pops - arrived_at.pop(ticket) <= 2 * 10
    # and so are those still waiting when the arrivals stop.
    while arrived_at:
        ticket = queue.pop()
        pops += 1
        assert pops - min(arrived_at.values()) <= 2 * 10
        arrived_at.pop(ticket, None)


# Wait estimates


@pytest.mark.parametrize(
    ("times", "queued", "capacity", "wait", "retry_after"),
    [
        ([], 50, 4, 0.0, 1),  # no sample: unknown
        ([2.0, 4.0], 0, 4, 3.0, 3),  # one wave: mean 3 s
        ([2.0, 4.0], 3, 4, 3.0, 3),  # 4 incl. this one fit one wave
        ([2.0, 4.0], 4, 4, 6.0, 6),  # fifth request: second wave
        ([0.25], 0, 1, 0.25, 1),  # never below 1 s
        ([1.5], 2, 1, 4.5, 5),  # rounded up
    ],
)
def test_it_estimates_the_wait_from_recent_service_times(
    times, queued, capacity, wait, retry_after
):
    assert estimated_wait_s(times, queued, capacity) == wait
    assert retry_after_s(times, queued, capacity) == retry_after


def test_an_estimate_needs_some_capacity():
    with pytest.raises(ValueError, match="capacity"):
        estimated_wait_s([1.0], 0, 0)


# PoolQueue: the asyncio shell


async def test_a_waiter_returns_when_a_slot_is_handed_to_it():
    queue = PoolQueue(5)
    waiter = asyncio.create_task(queue.wait(ALICE, 5.0, capacity=2))
    await asyncio.sleep(0)
    assert len(queue) == 1

    assert queue.wake_next() is True
    await asyncio.wait_for(waiter, 1.0)

    assert len(queue) == 0
    assert queue.wake_next() is False


async def test_joined_is_told_once_the_request_is_in_the_queue_and_not_when_it_is_refused():
    queue = PoolQueue(1)
    lengths: list[int] = []
    waiter = asyncio.create_task(
        queue.wait(ALICE, 5.0, capacity=1, joined=lambda: lengths.append(len(queue)))
    )
    await asyncio.sleep(0)

    with pytest.raises(QueueFull):
        await queue.wait(BOB, 5.0, capacity=1, joined=lambda: lengths.append(-1))

    assert lengths == [1]  # told with the request already counted; the refused one never
    queue.wake_next()
    await asyncio.wait_for(waiter, 1.0)


async def test_waiters_are_woken_in_fair_order():
    queue = PoolQueue(10)
    woken: list[str] = []

    async def wait(token_id: int, name: str) -> None:
        await queue.wait(token_id, 5.0, capacity=1)
        woken.append(name)

    tasks = [
        asyncio.create_task(wait(token_id, name))
        for token_id, name in [(ALICE, "a1"), (ALICE, "a2"), (ALICE, "a3"), (BOB, "b1")]
    ]
    await asyncio.sleep(0)
    for _ in tasks:
        queue.wake_next()
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)

    assert woken == ["a1", "b1", "a2", "a3"]


async def test_a_full_queue_refuses_with_a_reason_and_retry_after():
    queue = PoolQueue(1)
    queue.record_service_time(2.0)
    queue.record_service_time(4.0)
    first = asyncio.create_task(queue.wait(ALICE, 60.0, capacity=1))
    await asyncio.sleep(0)

    with pytest.raises(QueueFull) as refused:
        await queue.wait(BOB, 60.0, capacity=1)

    assert refused.value.reason == QUEUE_FULL
    assert refused.value.retry_after_s == 6  # one waiter ahead, one slot, mean 3 s
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)


async def test_a_token_over_its_fair_share_is_refused():
    queue = PoolQueue(4)
    tasks = [asyncio.create_task(queue.wait(t, 60.0, capacity=1)) for t in (ALICE, ALICE, BOB)]
    await asyncio.sleep(0)

    with pytest.raises(QueueFull) as refused:
        await queue.wait(ALICE, 60.0, capacity=1)

    assert refused.value.reason == OVER_FAIR_SHARE
    assert refused.value.retry_after_s == 1  # no service time measured yet
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_it_refuses_early_when_the_estimated_wait_exceeds_the_deadline():
    queue = PoolQueue(100)
    queue.record_service_time(10.0)

    with pytest.raises(QueueFull) as refused:
        await queue.wait(ALICE, 5.0, capacity=4)

    assert refused.value.reason == WAIT_TOO_LONG
    assert refused.value.retry_after_s == 10
    assert len(queue) == 0


async def test_a_light_token_is_not_refused_for_a_heavy_tokens_backlog():
    # Alice's 8 waiters would take 3 waves of 3 s; Bob's first request is second in line.
    queue = PoolQueue(100)
    queue.record_service_time(3.0)
    tasks = [asyncio.create_task(queue.wait(ALICE, 60.0, capacity=4)) for _ in range(8)]
    await asyncio.sleep(0)

    assert queue.estimated_wait_s(ALICE, 4) == 9.0
    assert queue.estimated_wait_s(BOB, 4) == 3.0
    bob = asyncio.create_task(queue.wait(BOB, 5.0, capacity=4))
    await asyncio.sleep(0)

    assert queue.fair.waiting_by_token() == {ALICE: 8, BOB: 1}
    assert not bob.done()
    for task in [*tasks, bob]:
        task.cancel()
    await asyncio.gather(*tasks, bob, return_exceptions=True)


async def test_a_waiter_times_out_and_leaves_the_queue():
    queue = PoolQueue(5)

    with pytest.raises(QueueTimeout, match="no slot within 0.01 s"):
        await queue.wait(ALICE, 0.01, capacity=1)

    assert len(queue) == 0
    assert queue.wake_next() is False


async def test_a_cancelled_waiter_leaves_the_queue_at_once():
    queue = PoolQueue(5)
    waiter = asyncio.create_task(queue.wait(ALICE, 60.0, capacity=1))
    behind = asyncio.create_task(queue.wait(BOB, 60.0, capacity=1))
    await asyncio.sleep(0)

    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter

    assert len(queue) == 1
    assert queue.wake_next() is True
    await asyncio.wait_for(behind, 1.0)


async def test_wake_next_skips_a_waiter_cancelled_in_the_same_loop_turn():
    queue = PoolQueue(5)
    gone = asyncio.create_task(queue.wait(ALICE, 60.0, capacity=1))
    next_one = asyncio.create_task(queue.wait(BOB, 60.0, capacity=1))
    await asyncio.sleep(0)

    gone.cancel()  # its cleanup has not run yet
    assert queue.wake_next() is True

    await asyncio.wait_for(next_one, 1.0)
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert len(queue) == 0


async def test_a_wake_up_is_passed_on_when_its_waiter_leaves_before_running():
    queue = PoolQueue(5)
    first = asyncio.create_task(queue.wait(ALICE, 60.0, capacity=1))
    second = asyncio.create_task(queue.wait(BOB, 60.0, capacity=1))
    await asyncio.sleep(0)

    assert queue.wake_next() is True  # hands the slot to the first
    first.cancel()  # the client leaves before the first ran

    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 1.0)
    assert len(queue) == 0


def test_a_ticket_put_back_is_served_first_and_never_refused() -> None:
    queue: FairQueue[str] = FairQueue(max_size=2)
    queue.admit(1, "a1")
    queue.admit(2, "b1")
    served = queue.pop()

    queue.readmit(1, served)

    assert served == "a1"
    assert len(queue) == 2
    assert [queue.pop(), queue.pop()] == ["a1", "b1"]
