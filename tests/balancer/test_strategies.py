"""The balancer's decision: eligibility, tiers, each strategy, continuity and the explanation."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import subprocess
import sys
from collections import Counter

import pytest

from pools.balancer.snapshot import (
    Decision,
    DrainState,
    Factor,
    Health,
    PoolPolicy,
    Ranked,
    RequestFacts,
    Skipped,
    SkipReason,
)
from pools.balancer.strategies import (
    NOMINAL_OUTPUT_TOKENS,
    WARM_BONUS,
    decide,
    relative_times,
)
from tests.balancer import ranked_ids, route, skipped_reasons, target

STRATEGIES = ["smart", "priority", "capacity", "least_busy", "round_robin"]


# --- eligibility -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "reason", "detail"),
    [
        ({"enabled": False}, "disabled", ""),
        ({"drain": DrainState.DRAINING}, "draining", ""),
        ({"drain": DrainState.DRAINED}, "drained", ""),
        ({"health": Health.UNHEALTHY}, "unhealthy", ""),
        ({"circuit_open": True}, "circuit open", ""),
        ({"kinds": frozenset({"embeddings"})}, "incompatible", "does not serve chat"),
        ({"in_flight": 4}, "full", "4 of 4 in flight"),
        ({"in_flight": 5}, "full", "5 of 4 in flight"),
    ],
)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_it_skips_an_ineligible_target_with_its_reason(fields, reason, detail, strategy):
    decision = route([target(1, **fields), target(2)], strategy)

    assert decision.target_id == 2
    assert decision.skipped == (Skipped(1, "t1", SkipReason(reason), detail),)
    assert ranked_ids(decision) == [2]


def test_it_skips_a_target_already_tried_for_this_request():
    decision = route([target(1), target(2)], exclude=frozenset({1}))

    assert decision.target_id == 2
    assert skipped_reasons(decision) == {1: "already tried"}


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"enabled": False, "drain": DrainState.DRAINING, "health": Health.UNHEALTHY}, "disabled"),
        ({"drain": DrainState.DRAINED, "health": Health.UNHEALTHY}, "drained"),
        ({"health": Health.UNHEALTHY, "circuit_open": True}, "unhealthy"),
        ({"circuit_open": True, "kinds": frozenset({"embeddings"})}, "circuit open"),
        ({"kinds": frozenset({"embeddings"}), "in_flight": 4}, "incompatible"),
        ({"in_flight": 4, "id": 9}, "already tried"),
    ],
)
def test_it_records_the_first_failing_reason_in_the_documented_order(fields, reason):
    decision = route([target(fields.pop("id", 1), **fields), target(2)], exclude=frozenset({9}))

    assert [skip.reason.value for skip in decision.skipped] == [reason]


def test_plain_string_states_are_understood_like_the_enums():
    targets = [
        target(1, drain="draining"),
        target(2, health="unhealthy"),
        target(3, health="degraded"),
        target(4, drain="active", health="healthy", in_flight=1),
    ]

    decision = route(targets)

    assert skipped_reasons(decision) == {1: "draining", 2: "unhealthy"}
    assert ranked_ids(decision) == [4, 3]


def test_it_serves_only_the_request_kind_a_target_declares():
    chat_only = target(1, kinds=frozenset({"chat"}))
    embedder = target(2, kinds=frozenset({"embeddings"}))

    assert route([chat_only, embedder], kind="embeddings").target_id == 2
    assert route([chat_only, embedder], kind="chat").target_id == 1


def test_it_raises_on_an_unknown_strategy():
    with pytest.raises(ValueError, match="unknown balancing strategy 'fastest'"):
        route([target(1)], "fastest")


# --- tiers, fullness and the queue signal ------------------------------------------------------


def test_the_primary_tier_takes_the_request_and_backups_are_left_out():
    targets = [target(1, in_flight=3), target(2, priority=2), target(3, priority=3)]

    decision = route(targets)

    assert (decision.target_id, decision.tier) == (1, 1)
    assert decision.skipped == ()  # tiers 2 and 3 were not needed: in neither list
    assert ranked_ids(decision) == [1]


def test_a_backup_tier_takes_over_when_the_primary_is_full_or_ineligible():
    targets = [
        target(1, in_flight=4),
        target(2, drain=DrainState.DRAINING),
        target(3, priority=2, in_flight=4),
        target(4, priority=3),
        target(5, priority=3),
        target(6, priority=4),
    ]

    decision = route(targets, "round_robin")

    assert decision.tier == 3
    assert ranked_ids(decision) == [4, 5]
    assert skipped_reasons(decision) == {1: "full", 2: "draining", 3: "full"}
    assert decision.all_full is False


def test_tiers_are_found_whatever_order_the_targets_come_in():
    targets = [target(1, priority=3), target(2, priority=2), target(3, priority=2, in_flight=4)]

    decision = route(targets)

    assert (decision.target_id, decision.tier) == (2, 2)
    assert skipped_reasons(decision) == {3: "full"}


def test_when_every_eligible_target_is_full_the_caller_queues():
    targets = [
        target(1, in_flight=4),
        target(2, enabled=False),
        target(3, priority=2, in_flight=2, capacity=2),
    ]

    decision = route(targets)

    assert decision == Decision(
        target_id=None,
        tier=None,
        ranking=(),
        skipped=(
            Skipped(1, "t1", SkipReason.FULL, "4 of 4 in flight"),
            Skipped(2, "t2", SkipReason.DISABLED),
            Skipped(3, "t3", SkipReason.FULL, "2 of 2 in flight"),
        ),
        all_full=True,
        continuity="none",
    )


@pytest.mark.parametrize(
    "targets",
    [
        [],
        [target(1, enabled=False)],
        [target(1, health=Health.UNHEALTHY), target(2, kinds=frozenset({"embeddings"}))],
    ],
)
def test_nothing_eligible_is_not_a_reason_to_queue(targets):
    decision = route(targets)

    assert decision.target_id is None
    assert decision.all_full is False


def test_a_full_target_counts_for_queueing_but_an_already_tried_one_does_not():
    full, tried = target(1, in_flight=4), target(2)

    assert route([full, tried], exclude=frozenset({2})).all_full is True
    assert route([tried], exclude=frozenset({2})).all_full is False


def test_fullness_counts_only_nexus_requests_not_the_engines_own():
    busy_engine = target(1, in_flight=1, engine_running=4, engine_waiting=3)

    decision = route([busy_engine])

    assert decision.target_id == 1


# --- degraded targets --------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_degraded_target_ranks_after_every_healthy_one(strategy):
    targets = [
        target(1, health=Health.DEGRADED, capacity=16),
        target(2, in_flight=3),
        target(3, in_flight=2),
    ]

    for turn in range(6):
        decision = route(targets, strategy, turn=turn, seed=turn)
        assert decision.target_id in {2, 3}
        assert ranked_ids(decision)[-1] == 1
        assert decision.ranking[-1].factors[-1].name == "degraded"


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_degraded_target_is_used_when_no_healthy_one_has_room(strategy):
    targets = [target(1, health=Health.DEGRADED), target(2, in_flight=4)]

    assert route(targets, strategy).target_id == 1


def test_a_degraded_primary_still_beats_a_healthy_backup_tier():
    targets = [target(1, health=Health.DEGRADED), target(2, priority=2)]

    assert route(targets).target_id == 1


# --- smart -------------------------------------------------------------------------------------


def test_smart_counts_capacity_not_requests():
    # 3 of 8 slots after this request beats 2 of 4: a count-based policy would pick the small one.
    big, small = target(1, capacity=8, in_flight=2), target(2, capacity=4, in_flight=1)

    decision = route([small, big])

    assert decision.target_id == 1
    assert [ranked.score for ranked in decision.ranking] == [3 / 8, 2 / 4]


def test_smart_takes_the_engine_count_when_other_clients_load_it():
    shared = target(1, in_flight=0, engine_running=3, engine_waiting=1)
    ours = target(2, in_flight=2, engine_running=2, engine_waiting=0)

    decision = route([shared, ours])

    assert decision.target_id == 2
    assert decision.ranking[1].factors[0] == Factor("utilization", 5 / 4)


def test_smart_prefers_the_faster_engine_at_equal_utilization():
    fast = target(1, ttft_s=0.04, tpot_s=0.008)
    slow = target(2, ttft_s=0.15, tpot_s=0.03)

    assert route([slow, fast]).target_id == 1


def test_smart_moves_to_the_slow_engine_when_the_fast_one_is_clearly_busier():
    # Request times 0.2 s and 0.4 s; the fast one at 4/4 after this request, the slow at 1/4.
    fast = target(1, ttft_s=0.2, tpot_s=0.0, in_flight=3)
    slow = target(2, ttft_s=0.4, tpot_s=0.0)

    decision = route([fast, slow])

    assert decision.target_id == 2
    fast_ranked = decision.ranking[1]
    # Median of 0.2 and 0.4 is 0.3: relative times 2/3 and 4/3.
    assert fast_ranked.score == pytest.approx(1.0 * 2 / 3)
    assert decision.ranking[0].score == pytest.approx(0.25 * 4 / 3)


def test_smart_gives_a_target_without_samples_the_tier_median_speed():
    targets = [
        target(1, ttft_s=0.1, tpot_s=0.01),
        target(2, ttft_s=0.3, tpot_s=0.03),
        target(3, ttft_s=0.2, tpot_s=0.02),
        target(4),
    ]

    relative = relative_times(targets)

    assert relative is not None
    assert relative[3] == 1.0
    assert relative[2] == pytest.approx(1.0)
    assert relative[0] == pytest.approx((0.1 + NOMINAL_OUTPUT_TOKENS * 0.01) / (0.2 + 5.12))
    unknown = next(r for r in route(targets).ranking if r.target_id == 4)
    assert unknown.factors[1] == Factor("latency", 0.0, "no latency samples: tier median")


def test_smart_fills_a_missing_half_of_the_samples_with_the_tier_median():
    targets = [target(1, ttft_s=0.1, tpot_s=0.01), target(2, ttft_s=0.3, tpot_s=0.03)]
    only_ttft = target(3, ttft_s=0.2)

    relative = relative_times([*targets, only_ttft])

    assert relative is not None
    assert relative[2] == pytest.approx(1.0)  # 0.2 + 256 × 0.02, the median request time


def test_smart_is_neutral_about_speed_when_no_target_has_samples():
    assert relative_times([target(1), target(2)]) is None


def test_smart_clamps_a_wild_latency_reading():
    targets = [target(1, ttft_s=1.0, tpot_s=0.0), target(2, ttft_s=1.0, tpot_s=0.0)]
    wild = target(3, ttft_s=1000.0, tpot_s=0.0)

    assert relative_times([*targets, wild]) == [1.0, 1.0, 10.0]


def test_smart_penalises_recent_errors_and_rewards_a_warm_model():
    flaky = target(1, error_rate=0.5)
    cold = target(2)
    warm = target(3, warm=True, in_flight=1)  # 0.5 - 0.1: still behind the idle cold one

    decision = route([flaky, cold, warm])

    assert ranked_ids(decision) == [2, 3, 1]
    scores = {ranked.target_id: ranked.score for ranked in decision.ranking}
    assert scores == {1: 0.75, 2: 0.25, 3: pytest.approx(0.5 - WARM_BONUS)}


def test_smart_explains_every_factor_and_the_factors_add_up_to_the_score():
    targets = [
        target(1, ttft_s=0.05, tpot_s=0.01, error_rate=0.2, warm=True, in_flight=1),
        target(2, ttft_s=0.1, tpot_s=0.02),
        target(3, health=Health.DEGRADED),
    ]

    decision = route(targets, sticky=2, prefix=1)

    for ranked in decision.ranking:
        names = [factor.name for factor in ranked.factors]
        assert names[:5] == ["utilization", "latency", "stability", "warm", "continuity"]
        assert math.fsum(factor.value for factor in ranked.factors) == pytest.approx(ranked.score)
    assert decision.ranking[-1].factors[5] == Factor(
        "degraded", 0.0, "latest probe failed: ranked after healthy targets"
    )


def test_smart_breaks_exact_ties_by_capacity_weight():
    # (0+1)/2 == (1+1)/4 == (2+1)/6: equally utilized, so the weights 2:4:6 decide.
    targets = [target(1, capacity=2), target(2, capacity=4, in_flight=1), target(3, capacity=6)]
    targets[2] = dataclasses.replace(targets[2], in_flight=2)

    picks = Counter(route(targets, seed=seed).target_id for seed in range(3000))

    assert picks[1] / 3000 == pytest.approx(2 / 12, abs=0.03)
    assert picks[2] / 3000 == pytest.approx(4 / 12, abs=0.03)
    assert picks[3] / 3000 == pytest.approx(6 / 12, abs=0.03)


def test_smart_lists_tied_targets_after_the_first_in_configured_order():
    targets = [target(3, position=0), target(1, position=2), target(2, position=2)]

    decision = route(targets, seed=5)

    rest = [ranked.target_id for ranked in decision.ranking[1:]]
    assert rest == [t for t in (3, 1, 2) if t != decision.target_id]


# --- continuity --------------------------------------------------------------------------------


def test_continuity_keeps_the_conversation_on_a_target_not_noticeably_busier():
    sticky, idle = target(1, in_flight=1), target(2)  # 0.5 vs 0.25: within the 0.25 threshold

    decision = route([sticky, idle], sticky=1)

    assert decision.target_id == 1
    assert decision.continuity == "kept"
    assert decision.ranking[0].factors[4] == Factor("continuity", -0.25, "kept: same conversation")
    assert decision.ranking[0].score == pytest.approx(0.25)


def test_continuity_yields_to_a_clearly_shorter_wait_and_says_so():
    sticky, idle = target(1, in_flight=2), target(2)  # 0.75 vs 0.25: over the threshold

    decision = route([sticky, idle], sticky=1)

    assert decision.target_id == 2
    assert decision.continuity == "yielded: score 0.75 vs 0.25 on t2, threshold 0.25"
    assert decision.ranking[1].factors[4] == Factor(
        "continuity", -0.25, "same conversation, yielded"
    )


def test_continuity_keeps_an_equally_loaded_target_even_with_no_threshold():
    decision = route([target(1), target(2), target(3)], sticky=3, threshold=0.0)

    assert (decision.target_id, decision.continuity) == (3, "kept")


@pytest.mark.parametrize(
    ("sticky_fields", "exclude", "continuity"),
    [
        ({"drain": DrainState.DRAINING}, frozenset(), "yielded: sticky target draining"),
        ({"in_flight": 4}, frozenset(), "yielded: sticky target full"),
        ({"circuit_open": True}, frozenset(), "yielded: sticky target circuit open"),
        ({}, frozenset({1}), "yielded: sticky target already tried"),
        ({"health": Health.DEGRADED}, frozenset(), "yielded: sticky target degraded"),
        ({"priority": 2}, frozenset(), "yielded: sticky target in tier 2, tier 1 has room"),
    ],
)
def test_continuity_yields_when_the_sticky_target_cannot_take_the_request(
    sticky_fields, exclude, continuity
):
    decision = route([target(1, **sticky_fields), target(2)], sticky=1, exclude=exclude)

    assert decision.target_id == 2
    assert decision.continuity == continuity


def test_continuity_yields_when_the_sticky_target_left_the_pool():
    assert route([target(2)], sticky=99).continuity == "yielded: sticky target gone"


def test_continuity_is_none_without_a_conversation_when_disabled_and_outside_smart():
    assert route([target(1), target(2)]).continuity == "none"
    disabled = route([target(1, in_flight=1), target(2)], sticky=1, continuity=False)
    assert (disabled.target_id, disabled.continuity) == (2, "none")
    for strategy in STRATEGIES[1:]:
        assert route([target(1), target(2)], strategy, sticky=1).continuity == "none"


def test_a_recent_prompt_prefix_earns_half_the_conversation_bonus():
    near, idle = target(1, capacity=8, in_flight=2), target(2, capacity=8, in_flight=1)
    far = target(3, capacity=8, in_flight=3)  # 0.5 - 0.125 > 0.25

    assert route([near, idle], prefix=1).target_id == 1  # 0.375 - 0.125 <= 0.25
    decision = route([far, idle], prefix=3)
    assert decision.target_id == 2
    assert decision.ranking[1].factors[4] == Factor(
        "continuity", -0.125, "same prompt prefix served recently"
    )
    assert decision.continuity == "none"


def test_the_sticky_target_gets_one_bonus_when_it_also_holds_the_prefix():
    decision = route([target(1, in_flight=1), target(2)], sticky=1, prefix=1)

    assert decision.ranking[0].score == pytest.approx(0.25)


# --- priority, least busy, capacity, round robin -----------------------------------------------


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        # loads (in flight or engine total): 1/4, 4/8 (engine), 3/8; engine waiting: 0, 1, 0
        ("priority", [1, 3, 2]),
        ("least_busy", [2, 1, 3]),
    ],
)
def test_priority_and_least_busy_rank_by_their_own_measure(strategy, expected):
    targets = [
        target(1, in_flight=1),
        target(2, capacity=8, in_flight=0, engine_running=3, engine_waiting=1),
        target(3, capacity=8, in_flight=3),
    ]

    assert ranked_ids(route(targets, strategy)) == expected


@pytest.mark.parametrize("strategy", ["priority", "least_busy"])
def test_priority_and_least_busy_break_ties_by_position_then_id(strategy):
    targets = [target(5, position=1), target(4, position=1), target(6, position=0)]

    assert ranked_ids(route(targets, strategy)) == [6, 4, 5]


def test_capacity_shares_follow_the_weights_at_zero_load():
    targets = [target(1, capacity=4), target(2, capacity=6), target(3, capacity=8)]
    rng = random.Random(0)
    policy, request = PoolPolicy(strategy="capacity"), RequestFacts(kind="chat")

    picks = Counter(
        decide(targets, policy, request, rng=rng, turn=0).target_id for _ in range(10_000)
    )

    for weight, chosen in zip((4, 6, 8), (1, 2, 3), strict=True):
        assert picks[chosen] / 10_000 == pytest.approx(weight / 18, rel=0.05)


def test_capacity_corrects_the_weights_by_utilization():
    busy, idle = target(1, capacity=8, in_flight=6), target(2, capacity=4)

    decision = route([busy, idle], "capacity", seed=1)

    shares = {r.target_id: r.factors[2].value for r in decision.ranking}
    assert shares == {1: pytest.approx(2 / 6), 2: pytest.approx(4 / 6)}
    assert decision.ranking[0].factors[0].name == "weight"


def test_capacity_falls_back_to_the_weights_when_every_engine_reports_itself_busy():
    targets = [target(1, engine_running=9), target(2, capacity=12, engine_running=12)]

    decision = route(targets, "capacity")

    shares = {r.target_id: r.factors[2].value for r in decision.ranking}
    assert shares == {1: pytest.approx(0.25), 2: pytest.approx(0.75)}


def test_capacity_is_deterministic_for_a_given_random_state():
    targets = [target(i, capacity=i) for i in range(1, 6)]

    first = [route(targets, "capacity", seed=seed).target_id for seed in range(50)]
    again = [route(targets, "capacity", seed=seed).target_id for seed in range(50)]

    assert first == again
    assert len(set(first)) > 1


def test_round_robin_walks_the_configured_order_from_the_pools_turn():
    targets = [target(1, position=2), target(2, position=0), target(3, position=1)]

    firsts = [route(targets, "round_robin", turn=turn).target_id for turn in range(6)]

    assert firsts == [2, 3, 1, 2, 3, 1]
    assert ranked_ids(route(targets, "round_robin", turn=4)) == [3, 1, 2]


def test_round_robin_skips_ineligible_targets():
    targets = [target(1), target(2, in_flight=4), target(3, enabled=False), target(4)]

    firsts = [route(targets, "round_robin", turn=turn).target_id for turn in range(4)]

    assert firsts == [1, 4, 1, 4]


# --- the decision as data ----------------------------------------------------------------------


def test_the_decision_is_json_ready():
    targets = [
        target(1, in_flight=4),
        target(2, ttft_s=0.1, tpot_s=0.01, warm=True),
        target(3, ttft_s=0.2, tpot_s=0.02, health=Health.DEGRADED),
    ]

    document = route(targets, sticky=1).to_dict()

    assert json.loads(json.dumps(document)) == document
    assert document["target_id"] == 2
    assert document["tier"] == 1
    assert document["all_full"] is False
    assert document["continuity"] == "yielded: sticky target full"
    assert document["skipped"] == [
        {"target_id": 1, "name": "t1", "reason": "full", "detail": "4 of 4 in flight"}
    ]
    first = document["ranking"][0]
    assert first["target_id"] == 2
    assert first["factors"][3] == {"name": "warm", "value": -0.1, "note": "model loaded"}


def test_the_cheaply_built_values_equal_normally_built_ones():
    decision = route([target(1, error_rate=0.1, ttft_s=0.1, tpot_s=0.01), target(2)], sticky=2)
    rebuilt = Decision(
        target_id=decision.target_id,
        tier=decision.tier,
        ranking=tuple(
            Ranked(
                r.target_id,
                r.name,
                r.score,
                tuple(Factor(*dataclasses.astuple(f)) for f in r.factors),
            )
            for r in decision.ranking
        ),
        skipped=decision.skipped,
        all_full=decision.all_full,
        continuity=decision.continuity,
    )

    assert rebuilt == decision
    assert hash(rebuilt.ranking) == hash(decision.ranking)
    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.ranking[0].factors[0].value = 1.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.target_id = 3  # type: ignore[misc]


def test_the_core_imports_no_framework():
    code = (
        "import sys; import pools.balancer.strategies, pools.balancer.explain; "
        "bad = {'django', 'redis', 'httpx', 'asyncio', 'aiohttp'} & "
        "{name.split('.')[0] for name in sys.modules}; print(sorted(bad))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="."
    )

    assert result.stdout.strip() == "[]"
