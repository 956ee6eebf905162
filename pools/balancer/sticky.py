"""Bounded wait for a full sticky target (issue 11, point 3): stay warm when it pays.

When a conversation's target (or the target that served its prompt prefix) is full while
another has room, Smart would move it there and the new engine would compute the whole prompt
again, and decode at its own speed. `sticky_wait` says whether waiting for the next slot on the
sticky target is the shorter way, and for how long at most; the gateway enacts the verdict (it
waits in the pool's queue for that target only, where the affinity wake-up hands it the next
slot freed there) and, after the wait, `after_wait` explains where the request went.

Pure: no clock, no I/O; every time is in seconds. docs/balancer.md "Bounded wait for a full
sticky target" states the rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pools.balancer import explain
from pools.balancer.snapshot import (
    Decision,
    Health,
    PoolPolicy,
    RequestFacts,
    SkipReason,
    StickyWait,
    Strategy,
    TargetView,
)
from pools.balancer.strategies import NOMINAL_OUTPUT_TOKENS

# The longest a request waits for its sticky target, whatever the prediction (the gateway also
# keeps it within the request's queue allowance): a wrong prediction costs at most this.
MAX_WAIT_S = 2.0
# A prediction is an average; the bound leaves room for a slot that frees a little late ...
BOUND_FACTOR = 1.5
# ... and at least this much, so that a tiny prediction still has a chance to come true.
MIN_BOUND_S = 0.05
# A max_tokens far beyond what answers use would inflate the decode loss: counted up to this.
MAX_OUTPUT_TOKENS = 1024


def output_tokens(request: RequestFacts) -> int:
    """Return the answer length the loss is computed for: max_tokens, else a typical answer."""
    wanted = request.output_tokens
    if wanted is None or wanted <= 0:
        return NOMINAL_OUTPUT_TOKENS
    return min(wanted, MAX_OUTPUT_TOKENS)


def predicted_wait_s(target: TargetView, ahead: int, tokens: int) -> float | None:
    """Return how long until a slot frees on this full target for a request with `ahead`
    requests already waiting for it; None when its speed is unknown.

    Its slots free at capacity / service time per second (service time: the observed time a
    request holds a slot there, else ttft + tokens × tpot), so the (ahead + 1)-th slot frees
    after service × (ahead + 1) / capacity; requests above the capacity (another gateway's)
    come first.
    """
    service = target.service_s
    if service is None:
        if target.ttft_s is None or target.tpot_s is None:
            return None
        service = target.ttft_s + tokens * target.tpot_s
    excess = max(0, target.in_flight - target.capacity)
    return service * (ahead + 1 + excess) / target.capacity


def move_loss_s(home: TargetView, elsewhere: TargetView, tokens: int) -> float | None:
    """Return what serving the request on `elsewhere` instead of its warm `home` costs it;
    None when either's speed is unknown.

    Re-prefill: the conversation's prompt is computed again there, which costs at least the
    time to first token measured there (its own requests mostly hit its cache, so this errs
    low), while the cached prompt at home costs little. Decode: `tokens` at the difference of
    their per-token times (negative when elsewhere is faster).
    """
    if elsewhere.ttft_s is None or elsewhere.tpot_s is None or home.tpot_s is None:
        return None
    return elsewhere.ttft_s + tokens * (elsewhere.tpot_s - home.tpot_s)


def sticky_wait(
    targets: Sequence[TargetView],
    policy: PoolPolicy,
    request: RequestFacts,
    decision: Decision,
    *,
    ahead: int = 0,
) -> StickyWait | None:
    """Return the verdict that the request waits for its full sticky target, or None.

    It waits only when Smart with continuity placed it elsewhere (a target has room), its
    conversation's target (else its prompt prefix's) is in service and healthy but full, both
    speeds are known, and the predicted wait there is shorter than the loss of moving. The
    bound is max(BOUND_FACTOR × predicted, MIN_BOUND_S), never above the loss, MAX_WAIT_S or
    `request.may_wait_s`; a bound below the prediction means waiting would likely be in vain
    (no wait). ahead: requests already waiting for that target.
    """
    if (
        request.may_wait_s <= 0.0
        or decision.target_id is None
        or policy.strategy != Strategy.SMART
        or not policy.continuity_enabled
    ):
        return None
    home_id = request.sticky_target_id
    if home_id is None:
        home_id = request.prefix_target_id
        if home_id is None:
            return None
    if not any(s.target_id == home_id and s.reason is SkipReason.FULL for s in decision.skipped):
        # A candidate (it has room), gone, or out for a reason a wait does not cure.
        return None
    home = elsewhere = None
    for target in targets:
        if target.id == home_id:
            home = target
        elif target.id == decision.target_id:
            elsewhere = target
    if home is None or elsewhere is None or home.health is not Health.HEALTHY:
        return None
    tokens = output_tokens(request)
    predicted = predicted_wait_s(home, ahead, tokens)
    loss = move_loss_s(home, elsewhere, tokens)
    if predicted is None or loss is None or not predicted < loss:
        return None
    bound = min(max(BOUND_FACTOR * predicted, MIN_BOUND_S), loss, MAX_WAIT_S, request.may_wait_s)
    if bound < predicted:
        return None
    return StickyWait(home.id, home.name, elsewhere.id, elsewhere.name, predicted, loss, bound)


def after_wait(decision: Decision, wait: StickyWait, waited_s: float) -> Decision:
    """Return the decision taken after waiting for the sticky target, explained.

    When the sticky target has room now it takes the request whatever the scores (waiting was
    worth it only to be served there); otherwise the request goes where the decision says, and
    the continuity text says it waited in vain.
    """
    waited = f"{waited_s * 1000:.0f} ms"
    home = wait.target_id
    place = next(
        (place for place, ranked in enumerate(decision.ranking) if ranked.target_id == home), -1
    )
    if place < 0:
        reason = next(
            (skip.reason.value for skip in decision.skipped if skip.target_id == home), "gone"
        )
        return replace(
            decision,
            continuity=f"yielded: sticky target {reason} after waiting {waited} for it "
            f"(bound {wait.bound_s * 1000:.0f} ms)",
            sticky_wait=wait,
        )
    ranked = decision.ranking[place]
    factors = tuple(
        explain.factor("continuity", factor.value, explain.NOTE_STICKY_KEPT)
        if factor.name == "continuity"
        else factor
        for factor in ranked.factors
    )
    kept = explain.ranked(ranked.target_id, ranked.name, ranked.score, factors)
    ranking = (kept, *decision.ranking[:place], *decision.ranking[place + 1 :])
    return replace(
        decision,
        target_id=home,
        ranking=ranking,
        continuity=f"waited {waited} for sticky target {wait.name} ({wait.reason()})",
        sticky_wait=wait,
    )
