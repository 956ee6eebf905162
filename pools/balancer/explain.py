"""Build a decision's explanation cheaply, and say it in one line for logs and history."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pools.balancer.snapshot import Decision, Factor, Ranked, Skipped, SkipReason, TargetView

# Frozen dataclasses set each field through object.__setattr__ in __init__, which costs about
# three times a plain slot write. A decision builds one Ranked and a few Factors per candidate
# on every request, so the balancer builds them by writing the slots directly. The results are
# ordinary instances (equal, hashable and immutable like any other); tests compare them with
# normally built ones.
_new = object.__new__


def _slot_setters(cls: type, *names: str) -> tuple[Callable[[Any, Any], None], ...]:
    return tuple(vars(cls)[name].__set__ for name in names)


_F_NAME, _F_VALUE, _F_NOTE = _slot_setters(Factor, "name", "value", "note")
_R_ID, _R_NAME, _R_SCORE, _R_FACTORS = _slot_setters(
    Ranked, "target_id", "name", "score", "factors"
)
_S_ID, _S_NAME, _S_REASON, _S_DETAIL = _slot_setters(
    Skipped, "target_id", "name", "reason", "detail"
)
(_D_TARGET, _D_TIER, _D_RANKING, _D_SKIPPED, _D_ALL_FULL, _D_CONTINUITY, _D_UNRANKED, _D_WAIT) = (
    _slot_setters(
        Decision,
        "target_id",
        "tier",
        "ranking",
        "skipped",
        "all_full",
        "continuity",
        "unranked",
        "sticky_wait",
    )
)


def factor(name: str, value: float, note: str = "") -> Factor:
    """Return Factor(name, value, note), built cheaply."""
    built = _new(Factor)
    _F_NAME(built, name)
    _F_VALUE(built, value)
    _F_NOTE(built, note)
    return built


def ranked(target_id: int, name: str, score: float, factors: tuple[Factor, ...]) -> Ranked:
    """Return Ranked(target_id, name, score, factors), built cheaply."""
    built = _new(Ranked)
    _R_ID(built, target_id)
    _R_NAME(built, name)
    _R_SCORE(built, score)
    _R_FACTORS(built, factors)
    return built


def skipped(target_id: int, name: str, reason: SkipReason, detail: str) -> Skipped:
    """Return Skipped(target_id, name, reason, detail), built cheaply."""
    built = _new(Skipped)
    _S_ID(built, target_id)
    _S_NAME(built, name)
    _S_REASON(built, reason)
    _S_DETAIL(built, detail)
    return built


def decision(
    target_id: int | None,
    tier: int | None,
    ranking: tuple[Ranked, ...],
    skips: tuple[Skipped, ...],
    all_full: bool,
    continuity: str,
    unranked: int = 0,
) -> Decision:
    """Return the Decision, built cheaply."""
    built = _new(Decision)
    _D_TARGET(built, target_id)
    _D_TIER(built, tier)
    _D_RANKING(built, ranking)
    _D_SKIPPED(built, skips)
    _D_ALL_FULL(built, all_full)
    _D_CONTINUITY(built, continuity)
    _D_UNRANKED(built, unranked)
    _D_WAIT(built, None)
    return built


# Skip details repeat across decisions; formatting them anew costs more than the lookup.
_FULL_DETAILS: dict[tuple[int, int], str] = {}
_INCOMPATIBLE_DETAILS: dict[str, str] = {}
_CACHE_SIZE = 4096


def full_detail(in_flight: int, capacity: int) -> str:
    """Return the detail of a full target, e.g. "4 of 4 in flight"."""
    detail = _FULL_DETAILS.get((in_flight, capacity))
    if detail is None:
        if len(_FULL_DETAILS) >= _CACHE_SIZE:
            _FULL_DETAILS.clear()
        detail = _FULL_DETAILS[in_flight, capacity] = f"{in_flight} of {capacity} in flight"
    return detail


def incompatible_detail(kind: str) -> str:
    """Return the detail of a target that does not serve this request kind."""
    detail = _INCOMPATIBLE_DETAILS.get(kind)
    if detail is None:
        if len(_INCOMPATIBLE_DETAILS) >= _CACHE_SIZE:
            _INCOMPATIBLE_DETAILS.clear()
        detail = _INCOMPATIBLE_DETAILS[kind] = f"does not serve {kind}"
    return detail


# Some factors take few distinct values in a pool (utilization over small integers, weights,
# places in a rotation), so one instance per value is shared between decisions.
_SHARED_FACTORS: dict[str, dict[float, Factor]] = {}


def shared_factor(name: str, value: float) -> Factor:
    """Return Factor(name, value), one instance for all decisions."""
    by_value = _SHARED_FACTORS.get(name)
    if by_value is None:
        by_value = _SHARED_FACTORS[name] = {}
    built = by_value.get(value)
    if built is None:
        if len(by_value) >= _CACHE_SIZE:
            by_value.clear()
        built = by_value[value] = factor(name, value)
    return built


def shared_factors(name: str) -> dict[float, Factor]:
    """Return the shared factors of this name by value, for loops that look up many."""
    by_value = _SHARED_FACTORS.get(name)
    if by_value is None:
        by_value = _SHARED_FACTORS[name] = {}
    return by_value


# Factors and notes that do not depend on the target are shared by every decision.
NO_ERRORS = Factor("stability", 0.0)
COLD = Factor("warm", 0.0)
NO_CONTINUITY = Factor("continuity", 0.0)
NO_LATENCY_SAMPLES = Factor("latency", 0.0, "no latency samples: tier median")
DEGRADED = Factor("degraded", 0.0, "latest probe failed: ranked after healthy targets")
EJECTED = Factor(
    "ejected", 0.0, "circuit open, but ejection is past the pool's cap: ranked last, still eligible"
)
NOTE_WARM = "model loaded"
NOTE_STICKY_KEPT = "kept: same conversation"
NOTE_STICKY_YIELDED = "same conversation, yielded"
NOTE_PREFIX = "same prompt prefix served recently"


def last_layer(target: TargetView) -> Factor:
    """Return why a candidate ranks after the healthy ones: degraded, or ejected past the cap."""
    return EJECTED if target.circuit_open else DEGRADED
