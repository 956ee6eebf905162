"""What the Live page counts per pool: requests, errors, tokens, time to first output, per target.

Each gateway process adds every finished request to its LiveCounters (plain integer additions,
no I/O) and its publisher (pools.gateway.publish) adds what was counted since the previous
publication to Redis about once a second, into one hash per pool and BUCKET_S-second bucket:
`<prefix>:gateway:counts:<pool id>:<bucket start>`. HINCRBY adds up the processes, so a bucket
holds the sum over every gateway; buckets expire after the Live page's longest window.
pools.live_figures reads them back.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from pools.gateway.metrics import TTFT_BUCKETS
from pools.models import RoutingOutcome

BUCKET_S = 5
# Kept for the Live page's 15-minute charts, plus a bucket being written and a margin.
KEEP_S = 15 * 60 + 2 * BUCKET_S
# Outcomes that are not an error of the pool's: answered, or the client left by itself.
NOT_ERRORS = frozenset({RoutingOutcome.OK, RoutingOutcome.CLIENT_GONE})
# Field names in a bucket's hash: short, they are written every second by every process.
REQUESTS, ERRORS, PROMPT, COMPLETION = "n", "e", "pt", "ct"
TTFT_FIELD = "h{}"  # requests whose first output came within TTFT_BUCKETS[i] (the last: beyond)
TARGET_FIELD = "t{}"  # requests a target answered, by target id


def counts_key(prefix: str, pool_id: int, bucket: int) -> str:
    """Return the key of one pool's counts in the bucket starting at `bucket` (epoch seconds)."""
    return f"{prefix}:gateway:counts:{pool_id}:{bucket}"


def bucket_of(epoch_s: float) -> int:
    """Return the start of the bucket holding this moment."""
    return int(epoch_s // BUCKET_S) * BUCKET_S


@dataclass
class PoolCounts:
    """One pool's counts since the previous publication."""

    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft: list[int] = field(default_factory=lambda: [0] * (len(TTFT_BUCKETS) + 1))
    targets: dict[int, int] = field(default_factory=dict)

    def fields(self) -> dict[str, int]:
        """Return the non-zero counts as the bucket hash's fields."""
        found = {
            REQUESTS: self.requests,
            ERRORS: self.errors,
            PROMPT: self.prompt_tokens,
            COMPLETION: self.completion_tokens,
        }
        found.update({TTFT_FIELD.format(i): n for i, n in enumerate(self.ttft)})
        found.update({TARGET_FIELD.format(t): n for t, n in self.targets.items()})
        return {name: n for name, n in found.items() if n}


class LiveCounters:
    """One process's counts per pool, taken (and reset) by each publication."""

    def __init__(self) -> None:
        self._pools: dict[int, PoolCounts] = {}

    def add(
        self,
        pool_id: int,
        target_id: int | None,
        outcome: str,
        ttft_ms: float | None,
        prompt_tokens: int | None,
        completion_tokens: int | None,
    ) -> None:
        """Count one finished request."""
        counts = self._pools.get(pool_id)
        if counts is None:
            counts = self._pools[pool_id] = PoolCounts()
        counts.requests += 1
        if outcome not in NOT_ERRORS:
            counts.errors += 1
        counts.prompt_tokens += prompt_tokens or 0
        counts.completion_tokens += completion_tokens or 0
        if ttft_ms is not None:
            counts.ttft[bisect_left(TTFT_BUCKETS, ttft_ms / 1000)] += 1
        if target_id is not None:
            counts.targets[target_id] = counts.targets.get(target_id, 0) + 1

    def take(self) -> dict[int, PoolCounts]:
        """Return the counts since the last take, and start again from zero."""
        taken, self._pools = self._pools, {}
        return taken
