"""The balancer's inputs and its decision: frozen values, no behaviour beyond serialising."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class SkipReason(StrEnum):
    """Why a target was not ranked; the values are shown to operators as they are."""

    DISABLED = "disabled"
    DRAINING = "draining"
    DRAINED = "drained"
    UNHEALTHY = "unhealthy"
    CIRCUIT_OPEN = "circuit open"
    INCOMPATIBLE = "incompatible"
    ALREADY_TRIED = "already tried"
    FULL = "full"


class Strategy(StrEnum):
    """How a pool ranks the candidates of a tier (docs/balancer.md)."""

    SMART = "smart"
    PRIORITY = "priority"
    CAPACITY = "capacity"
    LEAST_BUSY = "least_busy"
    ROUND_ROBIN = "round_robin"


class DrainState(StrEnum):
    """Where a target stands in draining: draining takes no new requests, drained has none left."""

    ACTIVE = "active"
    DRAINING = "draining"
    DRAINED = "drained"


class Health(StrEnum):
    """The active probes' view of a target."""

    HEALTHY = "healthy"
    # The latest probe failed but the failure threshold is not exceeded yet: still routable,
    # ranked after every healthy target of its tier.
    DEGRADED = "degraded"
    UNHEALTHY = "unhealthy"


@dataclass(frozen=True, slots=True)
class TargetView:
    """One target of a pool as the balancer sees it at the moment of a decision."""

    id: int
    name: str
    priority: int  # the tier: 1 is primary
    capacity: int  # concurrency limit and share within the tier, at least 1
    position: int  # configured order, for round robin and ties
    kinds: frozenset[str]
    model_id: str
    enabled: bool = True
    # Why an enabled target is out anyway (enabled is then False), e.g. "node gpu-1 is offline":
    # the skip's detail.
    unavailable: str = ""
    drain: DrainState = DrainState.ACTIVE
    health: Health = Health.HEALTHY
    circuit_open: bool = False  # passive ejection in force right now
    # Why the circuit is open and when it tries again (the skip's detail); set only while it is
    # open, so the common path computes nothing.
    circuit_detail: str = ""
    in_flight: int = 0  # requests Nexus has on it (the ledger's count)
    engine_running: int | None = None  # from the engine's /metrics, None when unknown or stale
    engine_waiting: int | None = None
    # Nexus's own in-flight count on the target when the engine was read: the engine's count
    # above it is other clients' load. None: unknown, the engine's count is taken as it is.
    engine_counted: int | None = None
    ttft_s: float | None = None  # EWMA of time to first token, None when no sample yet
    tpot_s: float | None = None  # EWMA of time per output token
    # EWMA of how long a request held a slot here (sent to released), None when no sample yet:
    # how soon a full target frees a slot (sticky.py).
    service_s: float | None = None
    error_rate: float = 0.0  # recent share of failed requests, 0..1
    warm: bool = False  # served a request recently or reports the model loaded


@dataclass(frozen=True, slots=True)
class PoolPolicy:
    """The pool settings a decision depends on."""

    strategy: str  # a Strategy value
    continuity_enabled: bool = True
    continuity_threshold: float = 0.25  # how much worse (score) the sticky target may be
    # Passive ejection takes out at most this share of the capacity that could serve a request;
    # past it, ejected targets stay eligible, ranked after every other candidate.
    max_ejected_share: float = 0.5


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What the gateway knows about the request that matters for routing."""

    kind: str  # "chat" | "completions" | "embeddings"
    sticky_target_id: int | None = None  # the target this conversation used last
    prefix_target_id: int | None = None  # a target that recently served the same prompt prefix
    # The answer's length as the request bounds it (max_tokens), None when it does not.
    output_tokens: int | None = None
    # How long the request may still wait for its sticky target when that is full (sticky.py);
    # 0: it may not (it waited once already, was woken for another slot, or is a retry).
    may_wait_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Factor:
    """One term of a target's score, or a note on its ranking."""

    name: str
    value: float
    note: str = ""


@dataclass(frozen=True, slots=True)
class Ranked:
    """A candidate of the chosen tier with its score (lower is better) and how it was reached."""

    target_id: int
    name: str
    score: float
    factors: tuple[Factor, ...]


@dataclass(frozen=True, slots=True)
class Skipped:
    """A target that was not a candidate, and why."""

    target_id: int
    name: str
    reason: SkipReason
    detail: str = ""


@dataclass(frozen=True, slots=True)
class StickyWait:
    """The verdict that a request waits for its full sticky target rather than move (sticky.py).

    Times in seconds: `predicted_s` until a slot frees there, `loss_s` that moving to
    `alternative` would cost (recomputing the prompt there, slower decoding), `bound_s` the
    longest it waits before it is placed as usual.
    """

    target_id: int
    name: str
    alternative_id: int
    alternative: str
    predicted_s: float
    loss_s: float
    bound_s: float

    def reason(self) -> str:
        """Say why it waits, e.g. "predicted 150 ms < 420 ms re-prefill and decode loss on t2"."""
        return (
            f"predicted {self.predicted_s * 1000:.0f} ms < {self.loss_s * 1000:.0f} ms "
            f"re-prefill and decode loss on {self.alternative}"
        )

    def to_dict(self) -> dict[str, Any]:
        """Return the verdict as JSON-ready data (milliseconds), for history and the dry run."""
        return {
            "target_id": self.target_id,
            "name": self.name,
            "alternative": self.alternative,
            "predicted_ms": round(self.predicted_s * 1000, 1),
            "loss_ms": round(self.loss_s * 1000, 1),
            "bound_ms": round(self.bound_s * 1000, 1),
        }


@dataclass(frozen=True, slots=True)
class Decision:
    """Where a request goes, and the explanation kept in its history."""

    target_id: int | None  # None: nothing eligible has room (see all_full) or nothing eligible
    tier: int | None  # the tier the ranking comes from; None when no target was chosen
    ranking: tuple[Ranked, ...]  # candidates of the chosen tier, best first
    # Every target of the chosen tier and of lower-numbered tiers that is not ranked; targets of
    # higher-numbered tiers are not considered at all and appear in neither list.
    skipped: tuple[Skipped, ...]
    all_full: bool  # eligible targets exist but all are full: the caller queues
    continuity: str  # "none" | "kept" | "yielded: <why>"
    # Candidates of the chosen tier left out of `ranking`: a tier of more than RANK_IN_FULL
    # candidates lists only its best ones (strategies.RANK_IN_FULL; the choice is the same).
    unranked: int = 0
    # Set when the request should wait for its full sticky target before taking `target_id`
    # (sticky.py); kept on the decision that follows the wait, for its history.
    sticky_wait: StickyWait | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the decision as JSON-ready data, for history and the dry-run API."""
        data: dict[str, Any] = {
            "target_id": self.target_id,
            "tier": self.tier,
            "all_full": self.all_full,
            "continuity": self.continuity,
            "ranking": [
                {
                    "target_id": ranked.target_id,
                    "name": ranked.name,
                    "score": round(ranked.score, 4),
                    "factors": [
                        {"name": factor.name, "value": round(factor.value, 4), "note": factor.note}
                        for factor in ranked.factors
                    ],
                }
                for ranked in self.ranking
            ],
            "skipped": [
                {
                    "target_id": skip.target_id,
                    "name": skip.name,
                    "reason": skip.reason.value,
                    "detail": skip.detail,
                }
                for skip in self.skipped
            ],
        }
        if self.unranked:
            # A large tier: only its best candidates are listed (strategies.RANK_IN_FULL).
            data["unranked"] = self.unranked
        if self.sticky_wait is not None:
            data["sticky_wait"] = self.sticky_wait.to_dict()
        return data
