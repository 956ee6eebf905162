"""Autoscaling decisions: given a service's rules and their metric readings, how many replicas.

Pure: no Django, no I/O; times are epoch seconds. `serving.scaling` collects the readings, calls
`decide` every cycle and records what it returns (docs/autoscaling.md).

- Each rule is judged on its own: its condition (scale in: metric < min threshold; scale out:
  metric > max threshold; both: outside the range) against its reading. A reading with no value,
  or one older than the staleness bound, is "no data" and never counts as zero.
- A rule that fires proposes `current ± step`, clamped to its min/max replicas: a step past a
  bound goes to the bound; a scale-out never lowers the count and a scale-in never raises it.
- Cooldown per rule (since that rule last scaled the service) and per service (since any rule
  last scaled it, for the cooldown that scaling rule set) hold a firing rule back.
- When rules disagree, scale-out wins (the largest count proposed); every other firing rule is
  listed as overruled. Among scale-ins only, the smallest reduction wins.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from string import Template
from typing import Any

# A reading whose newest sample is older than this many evaluation windows is stale.
STALE_AFTER_WINDOWS = 1.0


class MetricSource(StrEnum):
    """Where a rule's metric comes from."""

    KERNEL = "kernel"
    INFERENCE_FRAMEWORK = "inference_framework"
    PROMETHEUS = "prometheus"


class Condition(StrEnum):
    """Which way a rule scales: below the min threshold, above the max threshold, or both."""

    SCALE_IN = "scale_in"
    SCALE_OUT = "scale_out"
    SCALE_IN_OUT = "scale_in_out"


class Aggregation(StrEnum):
    """How samples of several replicas and a window become one value."""

    AVG = "avg"
    MAX = "max"
    SUM = "sum"
    P95 = "p95"


class Outcome(StrEnum):
    """What one rule's evaluation came to (a scale event's outcome)."""

    SCALED_OUT = "scaled_out"
    SCALED_IN = "scaled_in"
    WITHIN = "within"  # the metric is inside the thresholds: nothing to do
    AT_BOUND = "at_bound"  # fired, but the count is already at min or max replicas
    COOLDOWN = "cooldown"  # fired, held back by a rule's or the service's cooldown
    OVERRULED = "overruled"  # fired, another rule's decision won
    NO_DATA = "no_data"


# Outcomes where a rule fired (its condition held) but the count did not follow it.
DECLINED = frozenset({Outcome.AT_BOUND, Outcome.COOLDOWN, Outcome.OVERRULED})
KERNEL_METRICS = ("cpu_util", "mem", "net_rx", "net_tx")


def step_sign(condition: Condition | str) -> str:
    """Return the sign a step size shows for the condition: "−", "+" or "±"."""
    return {Condition.SCALE_IN: "−", Condition.SCALE_OUT: "+"}.get(Condition(condition), "±")


@dataclass(frozen=True, slots=True)
class Rule:
    """One autoscaling rule as the evaluator sees it (thresholds in the metric's unit)."""

    id: int
    condition: Condition
    min_threshold: float | None
    max_threshold: float | None
    step: int
    cooldown_s: float
    min_replicas: int
    max_replicas: int
    window_s: float = 60.0
    last_triggered_at: float | None = None

    def describe(self, metric: str = "metric") -> str:
        """Say when the rule fires: "metric > 5" / "metric < 1" / "metric < 1 or > 5"."""
        low = f"{metric} < {self.min_threshold:g}" if self.min_threshold is not None else ""
        high = f"{metric} > {self.max_threshold:g}" if self.max_threshold is not None else ""
        if self.condition == Condition.SCALE_IN:
            return low
        if self.condition == Condition.SCALE_OUT:
            return high
        return f"{low} or > {self.max_threshold:g}" if low and high else low or high


@dataclass(frozen=True, slots=True)
class Reading:
    """A rule's metric: its aggregated value, the newest sample's time, how many series."""

    value: float | None
    at: float | None = None
    series: int = 0
    problem: str = ""  # why there is no value (a failed query), shown as the reason


NO_READING = Reading(value=None)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one rule came to this cycle, and why."""

    rule_id: int
    outcome: Outcome
    value: float | None
    replicas_after: int  # what the rule proposed (the current count unless it fired)
    reason: str
    series: int = 0
    crossed: str = ""  # the threshold it crossed, "7 > 5", when it fired

    @property
    def fired(self) -> bool:
        return self.outcome in DECLINED or self.outcome in (Outcome.SCALED_OUT, Outcome.SCALED_IN)


@dataclass(frozen=True, slots=True)
class Decision:
    """The cycle's result: the count to keep, the rule that set it, every rule's verdict."""

    current: int
    desired: int
    rule_id: int | None
    verdicts: tuple[Verdict, ...]
    overruled: tuple[int, ...] = field(default=())

    @property
    def changes(self) -> bool:
        return self.desired != self.current

    def verdict(self, rule_id: int) -> Verdict:
        return next(v for v in self.verdicts if v.rule_id == rule_id)


def decide(
    current: int,
    rules: Sequence[Rule],
    readings: Mapping[int, Reading],
    *,
    now: float,
    service_cooldown_until: float | None = None,
) -> Decision:
    """Return how many replicas the service should have, with every rule's verdict."""
    judged = [_judge(rule, readings.get(rule.id, NO_READING), current, now) for rule in rules]
    wanting = [v for v in judged if v.outcome in (Outcome.SCALED_OUT, Outcome.SCALED_IN)]
    if service_cooldown_until is not None and now < service_cooldown_until and wanting:
        left = service_cooldown_until - now
        held = {v.rule_id for v in wanting}
        judged = [
            _held(
                v,
                current,
                f"the service is cooling down for {left:.0f} s more after its last scaling",
            )
            if v.rule_id in held
            else v
            for v in judged
        ]
        return Decision(current, current, None, tuple(judged))
    outs = [v for v in wanting if v.outcome == Outcome.SCALED_OUT]
    # Scale-out wins; among scale-ins alone, the smallest reduction (the highest count).
    candidates = outs or wanting
    if not candidates:
        return Decision(current, current, None, tuple(judged))
    winner = max(candidates, key=lambda v: (v.replicas_after, -v.rule_id))
    overruled = tuple(v.rule_id for v in wanting if v.rule_id != winner.rule_id)
    final = tuple(_overruled(v, winner) if v.rule_id in overruled else v for v in judged)
    return Decision(current, winner.replicas_after, winner.rule_id, final, overruled)


def _judge(rule: Rule, reading: Reading, current: int, now: float) -> Verdict:
    """Return the rule's verdict on its own, before other rules and the service's cooldown."""
    if reading.value is None or not math.isfinite(reading.value):
        why = reading.problem or "no samples in the window"
        return Verdict(rule.id, Outcome.NO_DATA, None, current, f"no data: {why}")
    value = reading.value
    if reading.at is not None:
        age = now - reading.at
        if age > max(rule.window_s * STALE_AFTER_WINDOWS, 1.0):
            return Verdict(
                rule.id,
                Outcome.NO_DATA,
                None,
                current,
                f"no data: the newest sample ({value:g}) is {age:.0f} s old",
                reading.series,
            )
    high = rule.max_threshold is not None and rule.condition != Condition.SCALE_IN
    low = rule.min_threshold is not None and rule.condition != Condition.SCALE_OUT
    if high and value > rule.max_threshold:  # type: ignore[operator]
        proposed = max(current, min(current + rule.step, rule.max_replicas))
        direction, bound, sign = Outcome.SCALED_OUT, "max", ">"
        threshold = rule.max_threshold
    elif low and value < rule.min_threshold:  # type: ignore[operator]
        proposed = min(current, max(current - rule.step, rule.min_replicas))
        direction, bound, sign = Outcome.SCALED_IN, "min", "<"
        threshold = rule.min_threshold
    else:
        return Verdict(
            rule.id, Outcome.WITHIN, value, current, f"{value:g}: within the thresholds",
            reading.series,
        )  # fmt: skip
    fired = f"{value:g} {sign} {threshold:g}"
    if proposed == current:
        limit = rule.max_replicas if bound == "max" else rule.min_replicas
        return Verdict(
            rule.id,
            Outcome.AT_BOUND,
            value,
            current,
            f"{fired}, but {current} is the rule's {bound} replicas ({limit})",
            reading.series,
            fired,
        )
    if rule.last_triggered_at is not None and now < rule.last_triggered_at + rule.cooldown_s:
        left = rule.last_triggered_at + rule.cooldown_s - now
        return Verdict(
            rule.id,
            Outcome.COOLDOWN,
            value,
            current,
            f"{fired}, but the rule is cooling down for {left:.0f} s more",
            reading.series,
            fired,
        )
    clamped = abs(proposed - current) < rule.step
    how = f" (step {rule.step} clamped to the {bound} of {proposed})" if clamped else ""
    reason = f"{fired}: {current} → {proposed}{how}"
    return Verdict(rule.id, direction, value, proposed, reason, reading.series, fired)


def _held(verdict: Verdict, current: int, why: str) -> Verdict:
    return Verdict(
        verdict.rule_id,
        Outcome.COOLDOWN,
        verdict.value,
        current,
        f"{verdict.crossed}, but {why}",
        verdict.series,
        verdict.crossed,
    )


def _overruled(verdict: Verdict, winner: Verdict) -> Verdict:
    return Verdict(
        verdict.rule_id,
        Outcome.OVERRULED,
        verdict.value,
        verdict.replicas_after,
        f"{verdict.reason}; overruled by rule {winner.rule_id} ({winner.replicas_after})",
        verdict.series,
        verdict.crossed,
    )


def aggregate(per_replica: Sequence[Sequence[float]], how: Aggregation | str) -> float | None:
    """Return one value from each replica's samples in the window; None when there are none.

    avg and sum take each replica's mean first (so a replica sampled more often does not weigh
    more, and a sum is a sum over replicas, not over samples); max and p95 pool every sample.
    """
    filled = [list(samples) for samples in per_replica if samples]
    if not filled:
        return None
    how = Aggregation(how)
    if how == Aggregation.MAX:
        return max(max(samples) for samples in filled)
    if how == Aggregation.P95:
        return percentile([value for samples in filled for value in samples], 95.0)
    means = [sum(samples) / len(samples) for samples in filled]
    return sum(means) if how == Aggregation.SUM else sum(means) / len(means)


def percentile(values: Iterable[float], q: float) -> float:
    """Return the q-th percentile (linear interpolation between the closest ranks)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    rank = (len(ordered) - 1) * q / 100.0
    below = math.floor(rank)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (rank - below)


@dataclass(frozen=True, slots=True)
class PrometheusPreset:
    """A ready-made Prometheus rule: the metric's name, a query template and a cooldown."""

    key: str
    label: str
    metric: str
    query: str  # $service, $pool and $window are substituted
    cooldown_s: int | None = None

    def render(self, **labels: str) -> str:
        return render_query(self.query, **labels)


def render_query(template: str, *, service: str, pool: str, window: str) -> str:
    """Fill a query template's $service, $pool and $window (PromQL never uses `$`)."""
    return Template(template).safe_substitute(service=service, pool=pool, window=window)


# Replicas are scraped with the label nexus_service="<service name>" (docs/autoscaling.md).
PRESETS = (
    PrometheusPreset(
        "vllm-requests-waiting",
        "vLLM: requests waiting",
        "vllm:num_requests_waiting",
        'avg_over_time(vllm:num_requests_waiting{nexus_service="$service"}[$window])',
        60,
    ),
    PrometheusPreset(
        "vllm-requests-running",
        "vLLM: requests running",
        "vllm:num_requests_running",
        'avg_over_time(vllm:num_requests_running{nexus_service="$service"}[$window])',
        60,
    ),
    PrometheusPreset(
        "vllm-kv-cache-usage",
        "vLLM: KV cache usage",
        "vllm:gpu_cache_usage_perc",
        'avg_over_time(vllm:gpu_cache_usage_perc{nexus_service="$service"}[$window])',
        120,
    ),
    PrometheusPreset(
        "vllm-generation-tokens-rate",
        "vLLM: generated tokens per second",
        "vllm:generation_tokens_total",
        'rate(vllm:generation_tokens_total{nexus_service="$service"}[$window])',
        120,
    ),
    PrometheusPreset(
        "sglang-queue",
        "SGLang: queued requests",
        "sglang:num_queue_reqs",
        'avg_over_time(sglang:num_queue_reqs{nexus_service="$service"}[$window])',
        60,
    ),
    PrometheusPreset(
        "llamacpp-deferred",
        "llama.cpp: deferred requests",
        "llamacpp:requests_deferred",
        'avg_over_time(llamacpp:requests_deferred{nexus_service="$service"}[$window])',
        60,
    ),
)
PRESETS_BY_KEY = {preset.key: preset for preset in PRESETS}


def with_preset(values: dict[str, Any], *, keep: Iterable[str] = ()) -> dict[str, Any]:
    """Fill a Prometheus rule's metric name, query and cooldown from its preset.

    The metric name and query are filled where empty; the cooldown unless named in `keep`
    (the caller gave one)."""
    preset = PRESETS_BY_KEY.get(values.get("prometheus_preset") or "")
    if preset is None or values.get("metric_source") != MetricSource.PROMETHEUS:
        return values
    filled = dict(values)
    if not filled.get("metric_name"):
        filled["metric_name"] = preset.metric
    if not filled.get("prometheus_query"):
        filled["prometheus_query"] = preset.query
    if "cooldown_s" not in keep and preset.cooldown_s is not None:
        filled["cooldown_s"] = preset.cooldown_s
    return filled
