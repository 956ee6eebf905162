"""The autoscaling evaluator (serving.autoscaling): thresholds, clamping, cooldowns, conflicts and
missing or stale data. Pure: no database, no network."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from serving.autoscaling import (
    PRESETS,
    Aggregation,
    Condition,
    Outcome,
    Reading,
    Rule,
    aggregate,
    decide,
    percentile,
    render_query,
    step_sign,
)

NOW = 1_700_000_000.0


def rule(rule_id: int = 1, **changes: object) -> Rule:
    values: dict[str, object] = {
        "id": rule_id,
        "condition": Condition.SCALE_IN_OUT,
        "min_threshold": 1.0,
        "max_threshold": 5.0,
        "step": 1,
        "cooldown_s": 60.0,
        "min_replicas": 1,
        "max_replicas": 4,
        "window_s": 30.0,
    }
    values.update(changes)
    return Rule(**values)  # type: ignore[arg-type]


def fresh(value: float | None, series: int = 1) -> Reading:
    return Reading(value=value, at=NOW - 5, series=series)


def test_a_value_above_the_max_threshold_scales_out_by_the_step() -> None:
    decision = decide(2, [rule(step=1)], {1: fresh(7.0)}, now=NOW)

    assert decision.desired == 3
    assert decision.rule_id == 1
    verdict = decision.verdict(1)
    assert verdict.outcome == Outcome.SCALED_OUT
    assert verdict.value == 7.0
    assert verdict.reason == "7 > 5: 2 → 3"


def test_a_value_below_the_min_threshold_scales_in_by_the_step() -> None:
    decision = decide(3, [rule()], {1: fresh(0.5)}, now=NOW)

    assert decision.desired == 2
    assert decision.verdict(1).outcome == Outcome.SCALED_IN
    assert decision.verdict(1).reason == "0.5 < 1: 3 → 2"


@pytest.mark.parametrize("value", [1.0, 3.0, 5.0])
def test_a_value_inside_the_range_or_on_a_threshold_changes_nothing(value: float) -> None:
    decision = decide(2, [rule()], {1: fresh(value)}, now=NOW)

    assert not decision.changes
    assert decision.verdict(1).outcome == Outcome.WITHIN


def test_a_scale_out_rule_ignores_low_values_and_a_scale_in_rule_high_ones() -> None:
    out_only = rule(condition=Condition.SCALE_OUT)
    in_only = rule(condition=Condition.SCALE_IN)

    assert decide(3, [out_only], {1: fresh(0.0)}, now=NOW).desired == 3
    assert decide(3, [in_only], {1: fresh(100.0)}, now=NOW).desired == 3
    assert decide(3, [out_only], {1: fresh(100.0)}, now=NOW).desired == 4
    assert decide(3, [in_only], {1: fresh(0.0)}, now=NOW).desired == 2


def test_a_step_past_the_max_goes_to_the_max() -> None:
    decision = decide(3, [rule(step=5, max_replicas=4)], {1: fresh(9.0)}, now=NOW)

    assert decision.desired == 4
    assert decision.verdict(1).reason == "9 > 5: 3 → 4 (step 5 clamped to the max of 4)"


def test_a_step_past_the_min_goes_to_the_min() -> None:
    decision = decide(3, [rule(step=5, min_replicas=1)], {1: fresh(0.0)}, now=NOW)

    assert decision.desired == 1


def test_at_the_bound_the_rule_declines_and_says_so() -> None:
    decision = decide(4, [rule(max_replicas=4)], {1: fresh(9.0)}, now=NOW)

    assert not decision.changes
    verdict = decision.verdict(1)
    assert verdict.outcome == Outcome.AT_BOUND
    assert verdict.fired
    assert verdict.reason == "9 > 5, but 4 is the rule's max replicas (4)"


def test_a_scale_out_below_the_rules_min_never_lowers_the_count() -> None:
    # Someone set 1 replica by hand while the rule says at least 2: scale-out goes up, not down.
    decision = decide(1, [rule(min_replicas=2, max_replicas=4)], {1: fresh(9.0)}, now=NOW)

    assert decision.desired == 2


def test_a_scale_in_above_the_rules_max_goes_to_the_max_not_beyond() -> None:
    decision = decide(8, [rule(step=1, max_replicas=4)], {1: fresh(0.0)}, now=NOW)

    assert decision.desired == 7


def test_a_rule_in_its_own_cooldown_is_held_back() -> None:
    cooling = rule(cooldown_s=60.0, last_triggered_at=NOW - 20)

    decision = decide(2, [cooling], {1: fresh(9.0)}, now=NOW)

    assert not decision.changes
    assert decision.verdict(1).outcome == Outcome.COOLDOWN
    assert decision.verdict(1).reason == "9 > 5, but the rule is cooling down for 40 s more"


def test_a_rule_acts_again_once_its_cooldown_is_over() -> None:
    cooled = rule(cooldown_s=60.0, last_triggered_at=NOW - 61)

    assert decide(2, [cooled], {1: fresh(9.0)}, now=NOW).desired == 3


def test_the_service_cooldown_holds_back_every_other_rule() -> None:
    # Rule 1 scaled the service 10 s ago with a 30 s cooldown; rule 2 never triggered itself.
    other = rule(2, cooldown_s=5.0)

    decision = decide(2, [other], {2: fresh(9.0)}, now=NOW, service_cooldown_until=NOW + 20)

    assert not decision.changes
    verdict = decision.verdict(2)
    assert verdict.outcome == Outcome.COOLDOWN
    assert verdict.reason == (
        "9 > 5, but the service is cooling down for 20 s more after its last scaling"
    )
    assert decide(2, [other], {2: fresh(9.0)}, now=NOW, service_cooldown_until=NOW).desired == 3


def test_when_rules_disagree_scale_out_wins_and_the_others_are_overruled() -> None:
    scale_in = rule(1, condition=Condition.SCALE_IN, min_threshold=50.0)  # cpu 30 < 50
    scale_out = rule(2, condition=Condition.SCALE_OUT, max_threshold=5.0)  # queue 8 > 5
    quiet = rule(3, condition=Condition.SCALE_OUT, max_threshold=100.0)

    decision = decide(
        2, [scale_in, scale_out, quiet], {1: fresh(30.0), 2: fresh(8.0), 3: fresh(1.0)}, now=NOW
    )

    assert decision.desired == 3
    assert decision.rule_id == 2
    assert decision.overruled == (1,)
    assert decision.verdict(1).outcome == Outcome.OVERRULED
    assert decision.verdict(1).reason == "30 < 50: 2 → 1; overruled by rule 2 (3)"
    assert decision.verdict(3).outcome == Outcome.WITHIN


def test_the_largest_scale_out_wins_and_among_scale_ins_the_smallest() -> None:
    small, large = rule(1, step=1), rule(2, step=2)
    readings = {1: fresh(9.0), 2: fresh(9.0)}

    outs = decide(1, [small, large], readings, now=NOW)
    assert (outs.desired, outs.rule_id, outs.overruled) == (3, 2, (1,))

    readings = {1: fresh(0.0), 2: fresh(0.0)}
    ins = decide(4, [small, large], readings, now=NOW)
    assert (ins.desired, ins.rule_id, ins.overruled) == (3, 1, (2,))


def test_missing_data_is_no_data_never_zero() -> None:
    # A scale-in rule on "< 1" would fire on a zero; no data must not scale anything in.
    decision = decide(3, [rule()], {}, now=NOW)

    assert not decision.changes
    verdict = decision.verdict(1)
    assert verdict.outcome == Outcome.NO_DATA
    assert verdict.value is None
    assert verdict.reason == "no data: no samples in the window"


def test_a_failed_query_is_no_data_with_its_reason() -> None:
    failed = Reading(value=None, problem="Prometheus answered 400: parse error")

    decision = decide(3, [rule()], {1: failed}, now=NOW)

    assert decision.verdict(1).reason == "no data: Prometheus answered 400: parse error"


def test_a_stale_reading_is_no_data() -> None:
    stale = Reading(value=0.0, at=NOW - 300, series=1)

    decision = decide(3, [rule(window_s=30.0)], {1: stale}, now=NOW)

    assert not decision.changes
    assert decision.verdict(1).outcome == Outcome.NO_DATA
    assert decision.verdict(1).reason == "no data: the newest sample (0) is 300 s old"


def test_a_nan_reading_is_no_data() -> None:
    decision = decide(3, [rule()], {1: fresh(float("nan"))}, now=NOW)

    assert decision.verdict(1).outcome == Outcome.NO_DATA


def test_no_data_on_one_rule_does_not_stop_another() -> None:
    decision = decide(2, [rule(1), rule(2)], {2: fresh(9.0)}, now=NOW)

    assert decision.desired == 3
    assert decision.verdict(1).outcome == Outcome.NO_DATA


rules_st = st.builds(
    rule,
    rule_id=st.integers(1, 5),
    condition=st.sampled_from(list(Condition)),
    min_threshold=st.floats(0, 10),
    max_threshold=st.floats(10, 20),
    step=st.integers(1, 5),
    cooldown_s=st.floats(0, 120),
    min_replicas=st.integers(0, 3),
    max_replicas=st.integers(3, 8),
    last_triggered_at=st.one_of(st.none(), st.floats(NOW - 200, NOW)),
)
readings_st = st.one_of(
    st.none(),
    st.builds(
        Reading,
        value=st.one_of(st.none(), st.floats(-5, 30)),
        at=st.floats(NOW - 120, NOW),
        series=st.integers(0, 4),
    ),
)


@given(
    current=st.integers(0, 10),
    rules=st.lists(rules_st, min_size=1, max_size=4, unique_by=lambda r: r.id),
    readings=st.lists(readings_st, min_size=4, max_size=4),
)
def test_a_decision_moves_toward_the_winning_rules_bounds_and_never_past_them(
    current: int, rules: list[Rule], readings: list[Reading | None]
) -> None:
    by_id = {
        r.id: reading for r, reading in zip(rules, readings, strict=False) if reading is not None
    }

    decision = decide(current, rules, by_id, now=NOW)

    if decision.rule_id is None:
        assert decision.desired == current
        return
    winner = next(r for r in rules if r.id == decision.rule_id)
    if decision.desired > current:
        assert decision.desired <= max(current, winner.max_replicas)
        assert decision.desired - current <= winner.step or decision.desired == winner.min_replicas
    else:
        assert decision.desired >= min(current, winner.min_replicas)
    # Every rule that wanted a change and lost is listed as overruled.
    wanted = {
        v.rule_id
        for v in decision.verdicts
        if v.outcome in (Outcome.SCALED_OUT, Outcome.SCALED_IN, Outcome.OVERRULED)
    }
    assert wanted - {decision.rule_id} == set(decision.overruled)
    # A rule without a usable reading never decides anything.
    for verdict in decision.verdicts:
        if verdict.outcome == Outcome.NO_DATA:
            assert verdict.rule_id != decision.rule_id


@given(
    current=st.integers(0, 10),
    rules=st.lists(rules_st, min_size=1, max_size=4, unique_by=lambda r: r.id),
)
def test_without_any_data_nothing_ever_scales(current: int, rules: list[Rule]) -> None:
    assert decide(current, rules, {}, now=NOW).desired == current


def test_aggregations_over_replicas_and_the_window() -> None:
    # Replica a sampled 2, 4 (mean 3); replica b sampled 10 (mean 10).
    samples = [[2.0, 4.0], [10.0]]

    assert aggregate(samples, Aggregation.AVG) == 6.5
    assert aggregate(samples, Aggregation.SUM) == 13.0
    assert aggregate(samples, Aggregation.MAX) == 10.0
    assert aggregate(samples, Aggregation.P95) == pytest.approx(9.4)
    assert aggregate([[], []], Aggregation.AVG) is None
    assert aggregate([], Aggregation.SUM) is None


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([1.0], 95) == 1.0
    assert percentile([0.0, 10.0], 50) == 5.0
    with pytest.raises(ValueError):
        percentile([], 95)


def test_the_step_sign_follows_the_condition() -> None:
    assert [step_sign(c) for c in Condition] == ["−", "+", "±"]


def test_rules_describe_when_they_fire() -> None:
    assert rule(condition=Condition.SCALE_OUT).describe("q") == "q > 5"
    assert rule(condition=Condition.SCALE_IN).describe("q") == "q < 1"
    assert rule().describe("q") == "q < 1 or > 5"


def test_preset_queries_get_the_services_labels() -> None:
    preset = PRESETS[0]

    query = preset.render(service="chat", pool="chat", window="30s")

    assert query == 'avg_over_time(vllm:num_requests_waiting{nexus_service="chat"}[30s])'
    assert render_query('up{job="$pool"}', service="s", pool="p", window="1m") == 'up{job="p"}'
