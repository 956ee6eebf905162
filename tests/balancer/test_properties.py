"""Invariants of every balancing decision, checked over thousands of random pool snapshots."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pools.balancer.snapshot import (
    Decision,
    DrainState,
    Health,
    PoolPolicy,
    RequestFacts,
    SkipReason,
    TargetView,
)
from pools.balancer.strategies import decide
from tests.support.properties import examples

KINDS = ("chat", "completions", "embeddings")
STRATEGIES = ("smart", "priority", "capacity", "least_busy", "round_robin")


def build_pool(seed: int, size: int) -> list[TargetView]:
    """Return a random pool snapshot: targets with unique ids in any order, every state mixed.

    Built from a seed rather than drawn field by field: hypothesis takes about 20 ms to draw a
    ten-target pool, a seed makes thousands of examples affordable.
    """
    rng = random.Random(seed)
    targets = []
    for target_id in rng.sample(range(1, 100), size):
        targets.append(
            TargetView(
                id=target_id,
                name=f"t{target_id}",
                priority=rng.randint(1, 3),
                capacity=rng.randint(1, 8),
                position=rng.randint(0, 4),
                kinds=frozenset(rng.sample(KINDS, rng.randint(1, 3))),
                model_id="demo-8b",
                # Mostly routable, so that rankings are rich; every state still shows up often.
                enabled=rng.random() > 0.1,
                drain=rng.choice([DrainState.ACTIVE] * 6 + list(DrainState)),
                health=rng.choice([Health.HEALTHY] * 4 + list(Health)),
                circuit_open=rng.random() < 0.3,
                in_flight=rng.randint(0, 9),
                engine_running=rng.choice([None, rng.randint(0, 12)]),
                engine_waiting=rng.choice([None, rng.randint(0, 6)]),
                ttft_s=rng.choice([None, None, 0.0, rng.uniform(0.0, 5.0)]),
                tpot_s=rng.choice([None, None, 0.0, rng.uniform(0.0, 0.2)]),
                error_rate=rng.choice([0.0, 0.0, 1.0, rng.random()]),
                warm=rng.random() < 0.5,
            )
        )
    return targets


pools = st.builds(build_pool, st.integers(0, 2**32), st.integers(0, 10))
# Picks of a target by index into the pool's ids plus 999, a target that left the pool.
picks = st.integers(0, 11)


def make_situation(
    targets: list[TargetView],
    continuity_enabled: bool,
    continuity_threshold: float,
    max_ejected_share: float,
    kind: str,
    sticky: int | None,
    prefix: int | None,
    tried: list[int],
) -> tuple[list[TargetView], PoolPolicy, RequestFacts, frozenset[int]]:
    """Return a pool, its policy (any strategy), a request and the targets already tried."""
    ids = [target.id for target in targets] + [999]
    policy = PoolPolicy("smart", continuity_enabled, continuity_threshold, max_ejected_share)
    request = RequestFacts(
        kind=kind,
        sticky_target_id=None if sticky is None else ids[sticky % len(ids)],
        prefix_target_id=None if prefix is None else ids[prefix % len(ids)],
    )
    return targets, policy, request, frozenset(ids[pick % len(ids)] for pick in tried)


# Strategies built once: building them inside a composite costs more than the test itself.
situations = st.builds(
    make_situation,
    pools,
    st.booleans(),
    st.sampled_from([0.0, 0.25]) | st.floats(0.0, 1.0),
    st.sampled_from([0.0, 0.5, 1.0]) | st.floats(0.0, 1.0),
    st.sampled_from(KINDS),
    st.none() | picks,
    st.none() | picks,
    st.lists(picks, max_size=2),
)


def past_ejection_cap(targets: Sequence[TargetView], kind: str, share: float) -> bool:
    """Say whether open circuits hold more than `share` of the capacity that could serve kind."""
    could_serve = [
        t
        for t in targets
        if t.enabled and t.drain == DrainState.ACTIVE and t.health != Health.UNHEALTHY
        and kind in t.kinds
    ]  # fmt: skip
    ejected = sum(t.capacity for t in could_serve if t.circuit_open)
    return ejected > share * sum(t.capacity for t in could_serve)


def expected_reason(
    target: TargetView, kind: str, exclude: frozenset[int], readmitted: bool = False
) -> str | None:
    """Return the documented first failing reason, written independently of the code.

    readmitted: ejection is past the pool's cap, so an open circuit alone does not skip.
    """
    checks = [
        (not target.enabled, "disabled"),
        (target.drain == DrainState.DRAINING, "draining"),
        (target.drain == DrainState.DRAINED, "drained"),
        (target.health == Health.UNHEALTHY, "unhealthy"),
        (target.circuit_open and not (readmitted and kind in target.kinds), "circuit open"),
        (kind not in target.kinds, "incompatible"),
        (target.id in exclude, "already tried"),
        (target.in_flight >= target.capacity, "full"),
    ]
    return next((reason for failed, reason in checks if failed), None)


def last_layer(target: TargetView) -> bool:
    """Say whether a candidate ranks after the healthy ones: degraded, or ejected past the cap."""
    return target.health == Health.DEGRADED or target.circuit_open


def assert_invariants(
    decision: Decision,
    targets: Sequence[TargetView],
    policy: PoolPolicy,
    request: RequestFacts,
    exclude: frozenset[int],
) -> None:
    """Check everything a decision promises, whatever the strategy."""
    by_id = {target.id: target for target in targets}
    readmitted = past_ejection_cap(targets, request.kind, policy.max_ejected_share)
    reasons = {
        target.id: expected_reason(target, request.kind, exclude, readmitted) for target in targets
    }
    candidates = [target for target in targets if reasons[target.id] is None]

    # The lowest tier with an eligible, non-full target takes the request.
    tier = min((target.priority for target in candidates), default=None)
    assert decision.tier == tier
    if tier is None:
        assert decision.target_id is None
        assert decision.ranking == ()
    else:
        chosen = by_id[decision.target_id]
        assert reasons[chosen.id] is None
        assert chosen.priority == tier
        assert decision.ranking[0].target_id == chosen.id

    # all_full: eligible targets exist and all are full.
    assert decision.all_full == (not candidates and "full" in reasons.values())

    # Every target is ranked, skipped or in a higher tier left out, exactly once.
    ranked = [r.target_id for r in decision.ranking]
    skipped = [s.target_id for s in decision.skipped]
    left_out = [t.id for t in targets if tier is not None and t.priority > tier]
    assert sorted(ranked + skipped + left_out) == sorted(by_id)
    assert set(ranked) == {t.id for t in candidates if t.priority == tier}
    assert {s.target_id: s.reason.value for s in decision.skipped} == {
        i: reasons[i] for i in skipped
    }
    assert all(isinstance(s.reason, SkipReason) for s in decision.skipped)

    # Degraded targets, and ejected ones readmitted past the cap, come after every healthy one
    # and are chosen only without a healthy one.
    layers = [last_layer(by_id[i]) for i in ranked]
    assert layers == sorted(layers)
    for target_id, flag, entry in zip(ranked, layers, decision.ranking, strict=True):
        last = "ejected" if by_id[target_id].circuit_open else "degraded"
        assert (entry.factors[-1].name == last) == flag

    scores = [r.score for r in decision.ranking]
    healthy_scores = [s for s, flag in zip(scores, layers, strict=True) if not flag]
    degraded_scores = [s for s, flag in zip(scores, layers, strict=True) if flag]
    if policy.strategy in ("smart", "priority", "least_busy"):
        assert healthy_scores == sorted(healthy_scores)
        assert degraded_scores == sorted(degraded_scores)
    elif policy.strategy == "round_robin":
        assert scores == [float(place) for place in range(len(scores))]
    else:  # capacity: the drawn target first, the others by falling chance
        first_layer = healthy_scores or degraded_scores
        assert first_layer[1:] == sorted(first_layer[1:])
        shares = [r.factors[2].value for r in decision.ranking[: len(first_layer)]]
        assert math.fsum(shares) == pytest.approx(1.0 if shares else 0.0)

    if policy.strategy == "smart":
        for entry in decision.ranking:
            total = math.fsum(factor.value for factor in entry.factors)
            assert math.isclose(total, entry.score, rel_tol=1e-9, abs_tol=1e-9)
    assert_continuity(decision, by_id, policy, request)
    json.dumps(decision.to_dict())


def assert_continuity(
    decision: Decision,
    by_id: dict[int, TargetView],
    policy: PoolPolicy,
    request: RequestFacts,
) -> None:
    """Check that continuity keeps a conversation only within the threshold, and says why."""
    sticky = request.sticky_target_id
    if policy.strategy != "smart" or not policy.continuity_enabled or sticky is None:
        assert decision.continuity == "none"
        return
    if decision.target_id == sticky:
        assert decision.continuity == "kept"
        # The bonus is the threshold, no more: the sticky target's score without it is within
        # the threshold of every alternative's, so a clearly shorter wait always wins.
        threshold = policy.continuity_threshold
        kept = decision.ranking[0]
        assert kept.factors[4].value == -threshold
        for other in decision.ranking[1:]:
            if last_layer(by_id[other.target_id]) == last_layer(by_id[sticky]):
                assert kept.score + threshold <= other.score + threshold
        return
    assert decision.continuity.startswith("yielded: ")
    sticky_entry = next((r for r in decision.ranking if r.target_id == sticky), None)
    if sticky_entry is not None and decision.continuity.startswith("yielded: score"):
        assert sticky_entry.score > decision.ranking[0].score


@settings(max_examples=examples(1500), deadline=None)
@given(situations, st.integers(0, 10**6), st.integers(0, 2**32))
def test_every_decision_keeps_the_invariants_and_is_deterministic(situation, turn, seed):
    targets, policy, request, exclude = situation
    for strategy in STRATEGIES:
        policy = dataclasses.replace(policy, strategy=strategy)
        rng, twin = random.Random(seed), random.Random(seed)

        decision = decide(targets, policy, request, rng=rng, turn=turn, exclude=exclude)
        again = decide(list(targets), policy, request, rng=twin, turn=turn, exclude=exclude)

        assert_invariants(decision, targets, policy, request, exclude)
        assert again == decision
        assert rng.random() == twin.random()  # the same random state consumed


@settings(max_examples=examples(300), deadline=None)
@given(pools, st.integers(0, 10**6), st.sampled_from(KINDS))
def test_round_robin_visits_every_candidate_once_per_round(targets, start, kind):
    policy, request = PoolPolicy(strategy="round_robin"), RequestFacts(kind=kind)
    first = decide(targets, policy, request, rng=random.Random(0), turn=start)
    last_layer = ("degraded", "ejected")
    healthy = [r.target_id for r in first.ranking if r.factors[-1].name not in last_layer]
    rotation = healthy or [r.target_id for r in first.ranking]

    chosen = [
        decide(targets, policy, request, rng=random.Random(0), turn=turn).target_id
        for turn in range(start, start + len(rotation))
    ]

    assert sorted(chosen) == sorted(rotation)


# --- shares of traffic -------------------------------------------------------------------------

PICKS = 10_000
weights_lists = st.lists(st.integers(1, 8), min_size=2, max_size=5)


def assert_shares(picks: Counter[int], weights: Sequence[int]) -> None:
    """Check each target's share of picks is within 5 % of its weight's share.

    Where 5 % of a small share is finer than the noise of 10,000 random draws, four standard
    errors are allowed instead (a false failure about once in 15,000 targets).
    """
    total = sum(weights)
    for index, weight in enumerate(weights):
        expected = weight / total
        noise = 4 * math.sqrt(expected * (1 - expected) / PICKS)
        assert abs(picks[index + 1] / PICKS - expected) <= max(0.05 * expected, noise), (
            index,
            picks,
            weights,
        )


def pool_of(weights: Sequence[int], in_flight: Sequence[int] | None = None) -> list[TargetView]:
    loads = in_flight or [0] * len(weights)
    return [
        TargetView(
            id=index + 1,
            name=f"t{index + 1}",
            priority=1,
            capacity=weight,
            position=index,
            kinds=frozenset({"chat"}),
            model_id="demo-8b",
            in_flight=load,
        )
        for index, (weight, load) in enumerate(zip(weights, loads, strict=True))
    ]


# Statistical properties: derandomized so that a run never fails by bad luck in the examples.
@settings(max_examples=8, deadline=None, derandomize=True)
@given(weights_lists, st.integers(0, 2**32))
def test_capacity_shares_follow_the_weights_at_zero_load(weights, seed):
    targets, rng = pool_of(weights), random.Random(seed)
    policy, request = PoolPolicy(strategy="capacity"), RequestFacts(kind="chat")

    picks = Counter(
        decide(targets, policy, request, rng=rng, turn=0).target_id for _ in range(PICKS)
    )

    assert_shares(picks, weights)


@settings(max_examples=8, deadline=None, derandomize=True)
@given(weights_lists, st.integers(0, 3), st.integers(0, 2**32))
def test_smart_shares_follow_the_weights_when_loads_are_proportional(weights, level, seed):
    # Proportional loads: every target is equally utilized as Smart counts it, (load + 1) /
    # capacity = (level + 1) / 4, so nothing but the weights tells them apart.
    in_flight = [weight * (level + 1) - 1 for weight in weights]
    weights = [weight * 4 for weight in weights]
    targets, rng = pool_of(weights, in_flight), random.Random(seed)
    policy, request = PoolPolicy(strategy="smart"), RequestFacts(kind="chat")

    picks = Counter(
        decide(targets, policy, request, rng=rng, turn=0).target_id for _ in range(PICKS)
    )

    assert_shares(picks, weights)


@settings(max_examples=3, deadline=None, derandomize=True)
@given(weights_lists, st.integers(0, 2**32))
def test_smart_keeps_a_busy_pools_traffic_in_proportion_to_the_weights(weights, seed):
    # A closed loop: the pool is kept 90 % busy; each finished request is drawn in proportion
    # to the requests on each target (equal speeds), and each new one goes where Smart says.
    # Loads stay proportional to the weights, so the picks do too, within 5 points.
    weights = [weight * 2 for weight in weights]
    sim = random.Random(seed)
    rng = random.Random(seed + 1)
    targets = pool_of(weights)
    policy, request = PoolPolicy(strategy="smart"), RequestFacts(kind="chat")
    busy = round(sum(weights) * 0.9)
    loads = [0] * len(weights)
    picks: Counter[int] = Counter()
    for step in range(busy + PICKS):
        if sum(loads) >= busy:
            loads[sim.choices(range(len(loads)), weights=loads)[0]] -= 1
        view = [
            dataclasses.replace(t, in_flight=load) for t, load in zip(targets, loads, strict=True)
        ]
        chosen = decide(view, policy, request, rng=rng, turn=step).target_id
        assert chosen is not None
        loads[chosen - 1] += 1
        if step >= busy:
            picks[chosen] += 1

    total = sum(weights)
    for index, weight in enumerate(weights):
        assert abs(picks[index + 1] / PICKS - weight / total) <= 0.05
