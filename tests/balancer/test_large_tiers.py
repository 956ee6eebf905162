"""A large tier ranks only its best candidates in full: the choice is the one a full ranking
makes, and the decision counts the candidates it left out."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pools.balancer import strategies
from pools.balancer.snapshot import PoolPolicy, RequestFacts, TargetView
from pools.balancer.strategies import RANK_IN_FULL, decide
from tests.balancer import target
from tests.balancer.test_properties import STRATEGIES, build_pool
from tests.support.properties import examples


def both_ways(
    targets: list[TargetView], policy: PoolPolicy, request: RequestFacts, seed: int, turn: int
):
    """Return the decision as made, the one of a full ranking, and each's next random draw."""
    rng = random.Random(seed)
    made = decide(targets, policy, request, rng=rng, turn=turn)
    made_next = rng.random()
    original = strategies.RANK_IN_FULL
    strategies.RANK_IN_FULL = 10**9
    try:
        rng = random.Random(seed)
        full = decide(targets, policy, request, rng=rng, turn=turn)
    finally:
        strategies.RANK_IN_FULL = original
    return made, made_next, full, rng.random()


def assert_same_choice(targets, policy, request, seed, turn):
    made, made_next, full, full_next = both_ways(targets, policy, request, seed, turn)
    assert made.target_id == full.target_id
    assert made.continuity == full.continuity
    assert made_next == full_next  # the same random draws: later decisions agree too
    assert made.skipped == full.skipped
    assert len(made.ranking) + made.unranked == len(full.ranking)
    assert full.unranked == 0
    if made.ranking:
        assert made.ranking[0] == full.ranking[0]
    if len(full.ranking) > RANK_IN_FULL:
        assert made.unranked > 0
        assert made.to_dict()["unranked"] == made.unranked


@settings(max_examples=examples(300), deadline=None)
@given(
    st.integers(0, 2**32),
    st.integers(RANK_IN_FULL, 99),
    st.sampled_from(STRATEGIES),
    st.none() | st.integers(1, 99),
    st.none() | st.integers(1, 99),
    st.integers(0, 2**32),
)
def test_a_large_tier_chooses_what_a_full_ranking_chooses(
    seed, size, strategy, sticky, prefix, turn
):
    targets = build_pool(seed, size)
    request = RequestFacts(kind="chat", sticky_target_id=sticky, prefix_target_id=prefix)

    assert_same_choice(targets, PoolPolicy(strategy=strategy), request, seed, turn)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_many_equal_idle_targets_still_share_the_first_place_by_weight(strategy):
    # Every candidate ties: all of them are kept for the draw, none is explained beyond it.
    targets = [target(i, capacity=1 + i % 3) for i in range(1, 201)]
    request = RequestFacts(kind="chat", sticky_target_id=150)

    for seed in range(20):
        assert_same_choice(targets, PoolPolicy(strategy=strategy), request, seed, seed)
