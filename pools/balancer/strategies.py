"""Choose a target among a pool's targets: eligibility, priority tiers, then the pool's strategy.

`decide` is pure and deterministic: the same targets, policy, request, turn and random state give
the same decision. It runs on every request, so its loops avoid per-target dicts and build the
explanation through explain's cheap constructors. docs/balancer.md states the rules.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterable, Sequence

from pools.balancer import explain
from pools.balancer.explain import _F_NAME, _F_NOTE, _F_VALUE, _R_FACTORS, _R_ID, _R_NAME, _R_SCORE
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
    Strategy,
    TargetView,
)

# Smart's constants; docs/balancer.md explains each one.
# Output tokens of a typical answer: turns ttft and tpot into one request time.
NOMINAL_OUTPUT_TOKENS = 256
# Relative request times are clamped so that one wild EWMA cannot put a target out of play.
MIN_RELATIVE_TIME = 0.1
MAX_RELATIVE_TIME = 10.0
# Each 10 % of recent failures counts like 10 % more utilization.
STABILITY_WEIGHT = 1.0
# A loaded model saves a cold start: worth 0.1 of utilization.
WARM_BONUS = 0.1
# A target that served the same prompt prefix gets this share of the conversation bonus.
PREFIX_SHARE = 0.5

_ACTIVE = DrainState.ACTIVE
_HEALTHY = Health.HEALTHY
_DEGRADED = Health.DEGRADED
_FULL = SkipReason.FULL
_INCOMPATIBLE = SkipReason.INCOMPATIBLE
_CIRCUIT_OPEN = SkipReason.CIRCUIT_OPEN
_DISABLED = SkipReason.DISABLED
_SKIP_DRAIN = {DrainState.DRAINING: SkipReason.DRAINING, DrainState.DRAINED: SkipReason.DRAINED}
_WARM = Factor("warm", -WARM_BONUS, explain.NOTE_WARM)
# A tier of more candidates than this ranks only its best ones in full (with every one tied
# for the first place and the sticky or prefix target); the decision counts the rest.
RANK_IN_FULL = 16


def load_of(target: TargetView) -> int:
    """Return the target's load: Nexus's in-flight count plus what the engine reports beyond it."""
    running = target.engine_running
    waiting = target.engine_waiting
    if running is None and waiting is None:
        return target.in_flight
    return engine_load(target.in_flight, (running or 0) + (waiting or 0), target.engine_counted)


def engine_load(in_flight: int, engine: int, counted: int | None) -> int:
    """Return in_flight plus the engine's count beyond `counted`, Nexus's own count when the
    engine was read (None: unknown, taken as in_flight).

    The rest of the engine's count are Nexus's own requests, which in_flight counts as of now: a
    reading taken before Nexus's last change to the target's load (a request finished or started
    since) adds only other clients' load, never Nexus's own requests a second time, so a target
    that Nexus alone uses looks exactly as busy as Nexus keeps it, and idle once idle
    (docs/balancer.md "Load signals").
    """
    others = engine - (in_flight if counted is None else counted)
    return in_flight + others if others > 0 else in_flight


def skip_reason(target: TargetView, kind: str, exclude: frozenset[int]) -> SkipReason | None:
    """Return the first reason the target cannot take this request, or None when it can."""
    if not target.enabled:
        return SkipReason.DISABLED
    if target.drain != _ACTIVE:
        return _SKIP_DRAIN[target.drain]
    if target.health == Health.UNHEALTHY:
        return SkipReason.UNHEALTHY
    if target.circuit_open:
        return SkipReason.CIRCUIT_OPEN
    if kind not in target.kinds:
        return SkipReason.INCOMPATIBLE
    if target.id in exclude:
        return SkipReason.ALREADY_TRIED
    if target.in_flight >= target.capacity:
        # Nexus never sends a target more than its capacity; the engine's own count may be
        # higher (other clients), which ranks the target lower but does not make it full.
        return SkipReason.FULL
    return None


def _past_ejection_cap(
    targets: Sequence[TargetView], ejected: list[TargetView], kind: str, share: float
) -> bool:
    """Say whether the ejected targets hold more than `share` of the capacity for this kind.

    The capacity counted is what could serve the request but for passive ejection: enabled,
    active, not reported unhealthy by the probes, serving the kind (Envoy's panic threshold).
    """
    serving = sum(
        target.capacity
        for target in targets
        if target.enabled
        and target.drain is _ACTIVE
        and target.health != Health.UNHEALTHY
        and kind in target.kinds
    )
    out = sum(target.capacity for target in ejected)
    return out > share * serving


def _readmit(ejected: list[TargetView], tiers: dict[int, _Bucket], exclude: frozenset[int]) -> None:
    """Make ejected targets candidates again, after every other one of their tier."""
    for target in ejected:
        _, degraded, skips = tiers[target.priority]
        skips.remove((target, _CIRCUIT_OPEN))
        if target.id in exclude:
            skips.append((target, SkipReason.ALREADY_TRIED))
        elif target.in_flight >= target.capacity:
            skips.append((target, _FULL))
        else:
            degraded.append(target)


# A tier's targets as the eligibility pass sorts them: healthy candidates, degraded ones, skips.
_Bucket = tuple[list[TargetView], list[TargetView], list[tuple[TargetView, SkipReason]]]


def decide(
    targets: Sequence[TargetView],
    policy: PoolPolicy,
    request: RequestFacts,
    *,
    rng: random.Random,
    turn: int,
    exclude: frozenset[int] = frozenset(),
) -> Decision:
    """Return where this request goes, with the ranking and every skip explained."""
    strategy = _STRATEGIES.get(policy.strategy)
    if strategy is None:
        raise ValueError(f"unknown balancing strategy {policy.strategy!r}")
    kind = request.kind
    tiers: dict[int, _Bucket] = {}
    last_priority: int | None = None
    healthy: list[TargetView] = []
    degraded: list[TargetView] = []
    skips: list[tuple[TargetView, SkipReason]] = []
    ejected: list[TargetView] = []
    for target in targets:
        priority = target.priority
        if priority != last_priority:
            # Targets usually come ordered by tier, so this lookup runs once per tier.
            bucket = tiers.get(priority)
            if bucket is None:
                bucket = tiers[priority] = ([], [], [])
            healthy, degraded, skips = bucket
            last_priority = priority
        # The common case in one expression; anything else takes the careful path.
        if (
            target.enabled
            and target.drain is _ACTIVE
            and target.health is _HEALTHY
            and not target.circuit_open
            and kind in target.kinds
            and target.in_flight < target.capacity
            and (not exclude or target.id not in exclude)
        ):
            healthy.append(target)
            continue
        reason = skip_reason(target, kind, exclude)
        if reason is _CIRCUIT_OPEN and kind in target.kinds:
            ejected.append(target)
        if reason is not None:
            skips.append((target, reason))
        elif target.health == _DEGRADED:
            degraded.append(target)
        else:
            healthy.append(target)

    if ejected and _past_ejection_cap(targets, ejected, kind, policy.max_ejected_share):
        _readmit(ejected, tiers, exclude)

    # The lowest-numbered tier with a candidate takes the request. Tiers above it are not
    # needed and appear nowhere in the decision; tiers below it explain why they were passed.
    tier: int | None = None
    considered = sorted(tiers) if len(tiers) > 1 else list(tiers)
    for place, priority in enumerate(considered):
        bucket = tiers[priority]
        if bucket[0] or bucket[1]:
            tier = priority
            del considered[place + 1 :]
            break

    skipped: list[Skipped] = []
    any_full = False
    for priority in considered:
        for target, reason in tiers[priority][2]:
            detail = ""
            if reason is _FULL:
                any_full = True
                detail = explain.full_detail(target.in_flight, target.capacity)
            elif reason is _INCOMPATIBLE:
                detail = explain.incompatible_detail(kind)
            elif reason is _CIRCUIT_OPEN:
                detail = target.circuit_detail
            elif reason is _DISABLED:
                detail = target.unavailable
            skipped.append(explain.skipped(target.id, target.name, reason, detail))

    ranking: tuple[Ranked, ...] = ()
    continuity = None
    unranked = 0
    if tier is not None:
        healthy, degraded, _ = tiers[tier]
        ranking, continuity = strategy(healthy, degraded, policy, request, rng, turn)
        unranked = len(healthy) + len(degraded) - len(ranking)
    if continuity is None:
        continuity = _continuity_elsewhere(targets, policy, request, skipped, tier)
    return explain.decision(
        ranking[0].target_id if ranking else None,
        tier,
        ranking,
        tuple(skipped),
        tier is None and any_full,
        continuity,
        unranked,
    )


def _continuity_elsewhere(
    targets: Sequence[TargetView],
    policy: PoolPolicy,
    request: RequestFacts,
    skipped: list[Skipped],
    tier: int | None,
) -> str:
    """Return the continuity text when the sticky target is not a candidate of the tier."""
    sticky = request.sticky_target_id
    if sticky is None or not policy.continuity_enabled or policy.strategy != Strategy.SMART:
        return "none"
    for skip in skipped:
        if skip.target_id == sticky:
            return f"yielded: sticky target {skip.reason}"
    for target in targets:
        if target.id == sticky:
            return f"yielded: sticky target in tier {target.priority}, tier {tier} has room"
    return "yielded: sticky target gone"


# A strategy ranks the chosen tier's candidates, given as the healthy ones and the degraded ones
# (used only when no healthy target has room). It returns the ranking, best first, and the
# continuity text, or None when the sticky target is not a candidate (decide() says why).
Ranker = Callable[
    [list[TargetView], list[TargetView], PoolPolicy, RequestFacts, random.Random, int],
    tuple[tuple[Ranked, ...], str | None],
]


# --- Smart -------------------------------------------------------------------------------------


def relative_times(candidates: Sequence[TargetView]) -> list[float] | None:
    """Return each candidate's request time over the tier's median, or None with no samples."""
    measured = _request_times(candidates)
    if measured is None:
        return None
    times, middle = measured
    return [_relative(time, middle) for time in times]


def _relative(time: float | None, middle: float) -> float:
    if time is None:
        return 1.0  # no sample yet: assume the tier's typical speed
    return min(MAX_RELATIVE_TIME, max(MIN_RELATIVE_TIME, time / middle))


def _request_times(candidates: Sequence[TargetView]) -> tuple[list[float | None], float] | None:
    """Return each candidate's estimated request time (None: no sample) and their median."""
    tokens = NOMINAL_OUTPUT_TOKENS
    times: list[float | None] = [
        t.ttft_s + tokens * t.tpot_s if t.ttft_s is not None and t.tpot_s is not None else None
        for t in candidates
    ]
    known = [time for time in times if time is not None]
    if len(known) < len(times) and any(
        (t.ttft_s is None) != (t.tpot_s is None) for t in candidates
    ):
        # A target with one of the two samples borrows the tier's median for the other.
        ttfts = [t.ttft_s for t in candidates if t.ttft_s is not None]
        tpots = [t.tpot_s for t in candidates if t.tpot_s is not None]
        ttft_fill = _median(ttfts) if ttfts else 0.0
        tpot_fill = _median(tpots) if tpots else 0.0
        for index, target in enumerate(candidates):
            ttft, tpot = target.ttft_s, target.tpot_s
            if times[index] is None and (ttft is not None or tpot is not None):
                time = (ttft_fill if ttft is None else ttft) + tokens * (
                    tpot_fill if tpot is None else tpot
                )
                times[index] = time
                known.append(time)
    if not known:
        return None
    middle = _median(known)
    if middle <= 0.0:
        return None
    return times, middle


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def _smart(
    healthy: list[TargetView],
    degraded: list[TargetView],
    policy: PoolPolicy,
    request: RequestFacts,
    rng: random.Random,
    turn: int,
) -> tuple[tuple[Ranked, ...], str | None]:
    """Rank by expected wait (utilization × relative time), stability, warmth and continuity."""
    candidates = healthy + degraded if degraded else healthy
    n_healthy = len(healthy)
    measured = _request_times(candidates)
    times, middle = measured if measured is not None else ((), 0.0)
    if policy.continuity_enabled:
        sticky = request.sticky_target_id
        prefix = request.prefix_target_id
        sticky_bonus = policy.continuity_threshold
    else:
        sticky = prefix = None
        sticky_bonus = 0.0
    if prefix == sticky:
        prefix = None  # the conversation bonus covers it already
    prefix_bonus = sticky_bonus * PREFIX_SHARE
    sticky_index = prefix_index = -1
    affinity = sticky is not None or prefix is not None

    # The hot loop: one pass scores each candidate, keeping the terms its explanation needs;
    # the explanation itself (Factor and Ranked objects) is built afterwards, and for large
    # tiers only for the candidates ranked in full (`_chosen_indices`).
    low, high = MIN_RELATIVE_TIME, MAX_RELATIVE_TIME
    scores: list[float] = []
    utilizations: list[float] = []
    latencies: list[float | None] = []  # score - utilization from speed; None: no samples
    for index, target in enumerate(candidates):
        load = target.in_flight
        running = target.engine_running
        waiting = target.engine_waiting
        if running is not None or waiting is not None:
            # The engine may serve other clients too (load_of says how that counts).
            load = engine_load(load, (running or 0) + (waiting or 0), target.engine_counted)
        utilization = (load + 1) / target.capacity
        time = times[index] if middle else None
        if time is None:
            score = utilization  # no samples: the tier's typical speed
            latencies.append(None)
        else:
            relative = time / middle
            if relative < low:
                relative = low
            elif relative > high:
                relative = high
            score = utilization * relative
            latencies.append(score - utilization)
        error_rate = target.error_rate
        if error_rate:
            score += STABILITY_WEIGHT * error_rate
        if target.warm:
            score -= WARM_BONUS
        if affinity:
            if target.id == sticky:
                score -= sticky_bonus
                sticky_index = index
            elif target.id == prefix:
                score -= prefix_bonus
                prefix_index = index
        scores.append(score)
        utilizations.append(utilization)

    # Degraded targets form a layer after every healthy one, whatever their scores; they are
    # drawn from only when no healthy target has room. Ties favour continuity.
    preferred = sticky_index if sticky_index >= 0 else prefix_index
    order = _order(scores, candidates, 0, n_healthy, preferred, rng)
    if degraded:
        order += _order(
            scores, candidates, n_healthy, len(candidates), preferred, None if n_healthy else rng
        )
    sticky_ranked: Ranked | None = None
    new = object.__new__
    set_f_name, set_f_value, set_f_note = _F_NAME, _F_VALUE, _F_NOTE
    set_r_id, set_r_name, set_r_score, set_r_factors = _R_ID, _R_NAME, _R_SCORE, _R_FACTORS
    utilization_factors = explain.shared_factors("utilization")
    no_latency, no_errors = explain.NO_LATENCY_SAMPLES, explain.NO_ERRORS
    warm, cold, no_continuity = _WARM, explain.COLD, explain.NO_CONTINUITY
    ranking: list[Ranked] = []
    for index in order:
        target = candidates[index]
        utilization = utilizations[index]
        utilization_factor = utilization_factors.get(utilization)
        if utilization_factor is None:
            utilization_factor = explain.shared_factor("utilization", utilization)
        delta = latencies[index]
        if delta is None:
            latency = no_latency
        else:
            latency = new(Factor)
            set_f_name(latency, "latency")
            set_f_value(latency, delta)
            set_f_note(latency, "")
        error_rate = target.error_rate
        stability = (
            explain.factor("stability", STABILITY_WEIGHT * error_rate) if error_rate else no_errors
        )
        warmth = warm if target.warm else cold
        if index == sticky_index:
            # Rebuilt with "kept" below if the sticky target comes first.
            continuity = explain.factor("continuity", -sticky_bonus, explain.NOTE_STICKY_YIELDED)
        elif index == prefix_index:
            continuity = explain.factor("continuity", -prefix_bonus, explain.NOTE_PREFIX)
        else:
            continuity = no_continuity
        ranked = new(Ranked)
        set_r_id(ranked, target.id)
        set_r_name(ranked, target.name)
        set_r_score(ranked, scores[index])
        if index < n_healthy:
            set_r_factors(ranked, (utilization_factor, latency, stability, warmth, continuity))
        else:
            factors = (utilization_factor, latency, stability, warmth, continuity)
            set_r_factors(ranked, (*factors, explain.last_layer(target)))
        if index == sticky_index:
            sticky_ranked = ranked
        ranking.append(ranked)

    if sticky is None:
        return tuple(ranking), "none"
    if sticky_index < 0:
        return tuple(ranking), None
    best = ranking[0]
    if best is sticky_ranked:
        kept = explain.factor("continuity", -sticky_bonus, explain.NOTE_STICKY_KEPT)
        best_factors = best.factors
        ranking[0] = explain.ranked(
            best.target_id, best.name, best.score, (*best_factors[:4], kept, *best_factors[5:])
        )
        return tuple(ranking), "kept"
    if sticky_index >= n_healthy and n_healthy:
        return tuple(ranking), "yielded: sticky target degraded"
    return tuple(ranking), (
        f"yielded: score {scores[sticky_index] + sticky_bonus:.2f} vs {best.score:.2f} "
        f"on {best.name}, threshold {sticky_bonus:.2f}"
    )


def _order(
    scores: list[float],
    candidates: list[TargetView],
    start: int,
    stop: int,
    preferred: int,
    rng: random.Random | None,
) -> list[int]:
    """Return the indices start..stop-1 best first: all of them in a tier of up to
    RANK_IN_FULL candidates, else the RANK_IN_FULL best, every one tied with the best and
    `preferred` (the rest are summarised by the decision's `unranked`).

    Equal scores put `preferred` (sticky or prefix target) first, then configured order; with
    `rng`, a tie for the first place is drawn by capacity weight instead, so that equally
    utilized targets share the traffic as their weights say. The first place is the same
    whether the tier is ranked in full or not: every candidate that could take it is kept.
    """
    indices: Iterable[int] = range(start, stop)
    if stop - start > RANK_IN_FULL:
        best = min(scores[start:stop])
        kept = set(heapq.nsmallest(RANK_IN_FULL, indices, key=scores.__getitem__))
        kept.update(index for index in indices if scores[index] == best)
        if start <= preferred < stop:
            kept.add(preferred)
        indices = kept
    layer_scores = [scores[index] for index in indices]
    if len(set(layer_scores)) == len(layer_scores):
        # No ties, the usual case once latency samples exist: a float sort, several times
        # faster than sorting tuples.
        return sorted(indices, key=scores.__getitem__)

    def tie_key(index: int) -> tuple[float, bool, int, int]:
        target = candidates[index]
        return (scores[index], index != preferred, target.position, target.id)

    order = sorted(indices, key=tie_key)
    best = scores[order[0]]
    if rng is not None and order[0] != preferred and len(order) > 1 and scores[order[1]] == best:
        tied = [index for index in order if scores[index] == best]
        drawn = tied[_draw([candidates[index].capacity for index in tied], rng)]
        order.remove(drawn)
        order.insert(0, drawn)
    return order


def _draw(weights: Sequence[float], rng: random.Random) -> int:
    """Return an index drawn with chances proportional to the weights (some positive)."""
    point = rng.random() * sum(weights)
    last = 0
    for index, weight in enumerate(weights):
        if weight:
            if point < weight:
                return index
            point -= weight
            last = index
    return last  # rounding left the point at the very end


# --- Priority, Least busy ----------------------------------------------------------------------


def _priority(
    healthy: list[TargetView],
    degraded: list[TargetView],
    policy: PoolPolicy,
    request: RequestFacts,
    rng: random.Random,
    turn: int,
) -> tuple[tuple[Ranked, ...], str | None]:
    """Rank by load over capacity: the least busy target of the tier first."""
    return _by_measure(healthy, degraded, "utilization", _utilization_now), "none"


def _least_busy(
    healthy: list[TargetView],
    degraded: list[TargetView],
    policy: PoolPolicy,
    request: RequestFacts,
    rng: random.Random,
    turn: int,
) -> tuple[tuple[Ranked, ...], str | None]:
    """Rank by (requests in flight + requests waiting at the engine) over capacity."""
    return _by_measure(healthy, degraded, "busy", _busy), "none"


def _utilization_now(target: TargetView) -> float:
    return load_of(target) / target.capacity


def _busy(target: TargetView) -> float:
    return (target.in_flight + (target.engine_waiting or 0)) / target.capacity


def _by_measure(
    healthy: list[TargetView],
    degraded: list[TargetView],
    name: str,
    measure: Callable[[TargetView], float],
) -> tuple[Ranked, ...]:
    """Rank each layer by the measure, lowest first, ties by configured order."""
    ranking: list[Ranked] = []
    for layer in (healthy, degraded):
        room = RANK_IN_FULL - len(ranking)
        if room <= 0:
            break
        keyed = ((measure(t), t.position, t.id, i) for i, t in enumerate(layer))
        keys = sorted(keyed) if len(layer) <= room else heapq.nsmallest(room, keyed)
        for score, _, _, index in keys:
            target = layer[index]
            factors: tuple[Factor, ...] = (explain.shared_factor(name, score),)
            if layer is degraded:
                factors += (explain.last_layer(target),)
            ranking.append(explain.ranked(target.id, target.name, score, factors))
    return tuple(ranking)


# --- Capacity ----------------------------------------------------------------------------------


def _capacity(
    healthy: list[TargetView],
    degraded: list[TargetView],
    policy: PoolPolicy,
    request: RequestFacts,
    rng: random.Random,
    turn: int,
) -> tuple[tuple[Ranked, ...], str | None]:
    """Draw a target with chances proportional to its weight corrected by its utilization."""
    ranking: list[Ranked] = []
    for layer in (healthy, degraded):
        if not layer:
            continue
        loads = [load_of(target) for target in layer]
        # weight × (1 − load / capacity) is simply the free slots, never below zero.
        weights = [
            float(target.capacity - load) if load < target.capacity else 0.0
            for target, load in zip(layer, loads, strict=True)
        ]
        if not any(weights):
            # Every engine reports itself busy (other clients): fall back to the plain weights.
            weights = [float(target.capacity) for target in layer]
        total = sum(weights)
        # Only the first non-empty layer is drawn from: degraded targets have no chance while
        # a healthy one has room, and are listed after it.
        drawn = _draw(weights, rng) if not ranking else -1
        keys = sorted(
            (
                index != drawn,
                1.0 - (weights[index] / total if drawn >= 0 else 0.0),
                target.position,
                target.id,
                index,
            )
            for index, target in enumerate(layer)
        )
        for _, score, _, _, index in keys[: max(0, RANK_IN_FULL - len(ranking))]:
            target = layer[index]
            factors: tuple[Factor, ...] = (
                explain.shared_factor("weight", float(target.capacity)),
                explain.shared_factor("utilization", loads[index] / target.capacity),
                explain.factor("share", 1.0 - score),
            )
            if layer is degraded:
                factors += (explain.last_layer(target),)
            ranking.append(explain.ranked(target.id, target.name, score, factors))
    return tuple(ranking), "none"


# --- Round robin -------------------------------------------------------------------------------


def _round_robin(
    healthy: list[TargetView],
    degraded: list[TargetView],
    policy: PoolPolicy,
    request: RequestFacts,
    rng: random.Random,
    turn: int,
) -> tuple[tuple[Ranked, ...], str | None]:
    """Take the targets in configured order, starting where the pool's turn points."""
    layer = sorted(healthy or degraded, key=_configured_order)
    start = turn % len(layer)
    order = layer[start:] + layer[:start]
    if healthy and degraded:
        order += sorted(degraded, key=_configured_order)
    ranking = []
    for place, target in enumerate(order[:RANK_IN_FULL]):
        last = not healthy or place >= len(layer)
        marks = (explain.last_layer(target),) if last else ()
        factors = (explain.shared_factor("order", float(place)), *marks)
        ranking.append(explain.ranked(target.id, target.name, float(place), factors))
    return tuple(ranking), "none"


def _configured_order(target: TargetView) -> tuple[int, int]:
    return (target.position, target.id)


_STRATEGIES: dict[str, Ranker] = {
    Strategy.SMART: _smart,
    Strategy.PRIORITY: _priority,
    Strategy.CAPACITY: _capacity,
    Strategy.LEAST_BUSY: _least_busy,
    Strategy.ROUND_ROBIN: _round_robin,
}
