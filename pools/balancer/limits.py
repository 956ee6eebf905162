"""Per-token limits: requests and tokens in a sliding 60 s window, and requests at once.

Pure: no clock, no I/O. A window is a handful of one-second buckets (epoch second -> amount);
the memory ledger keeps them in a dict, the Redis ledger in a hash and runs the same rule in Lua
(pools.gateway.ledger). A request is admitted while the window's total is below the limit: a
requests limit counts the request itself on admission, a tokens limit counts the tokens the
answer reported once it ends (a request is never refused halfway).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

WINDOW_S = 60
# A request refused for its concurrency limit cannot know when one in progress ends: it is told
# to come back in this many seconds.
CONCURRENCY_RETRY_S = 1.0


class Limit(StrEnum):
    """Which of a token's limits refused a request (named in the 429's message)."""

    REQUESTS_PER_MINUTE = "requests per minute"
    TOKENS_PER_MINUTE = "tokens per minute"
    CONCURRENT = "concurrent requests"


@dataclass(frozen=True, slots=True)
class TokenLimits:
    """A token's limits; None: that one is not limited."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    concurrent: int | None = None

    @property
    def any(self) -> bool:
        return (
            self.requests_per_minute is not None
            or self.tokens_per_minute is not None
            or self.concurrent is not None
        )

    def value(self, limit: Limit) -> int | None:
        return {
            Limit.REQUESTS_PER_MINUTE: self.requests_per_minute,
            Limit.TOKENS_PER_MINUTE: self.tokens_per_minute,
            Limit.CONCURRENT: self.concurrent,
        }[limit]


NO_LIMITS = TokenLimits()


def prune(buckets: dict[int, int], now: float) -> int:
    """Drop the buckets that left the window ending at `now`; return the total of the rest."""
    oldest = int(now) - WINDOW_S  # a bucket of second s counts until s + WINDOW_S
    for second in [s for s in buckets if s <= oldest]:
        del buckets[second]
    return sum(buckets.values())


def retry_after(buckets: dict[int, int], total: int, limit: int, now: float) -> float | None:
    """Return None when one more request fits under `limit`, else the seconds until one does.

    `buckets` holds the window's amounts only (see `prune`), `total` their sum: the answer is
    when enough of the oldest buckets have left the window for the total to fall below the limit.
    """
    if total < limit:
        return None
    for second in sorted(buckets):
        total -= buckets[second]
        if total < limit:
            return second + WINDOW_S - now
    return float(WINDOW_S)  # unreachable with a positive limit: every bucket gone leaves 0
