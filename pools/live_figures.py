"""The Live page's figures, from the counts every gateway adds to Redis (pools.gateway.counters).

`read_buckets` fetches the last 15 minutes of buckets of some pools in one pipeline; the rest is
pure: rates over the latest complete buckets, TTFT percentiles from the merged histogram, and
the charts' columns. A bucket no gateway wrote counts as no requests (the gateways count every
request, so a missing bucket is a quiet one); a percentile without samples is None (no data).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from django.conf import settings
from redis.exceptions import RedisError

from nexus.services import redis_client, redis_text
from pools.gateway import counters
from pools.gateway.counters import BUCKET_S
from pools.gateway.metrics import TTFT_BUCKETS

# "Now" is the latest RATE_WINDOW_S of buckets that every gateway has finished writing: a
# bucket is complete once its end is PUBLISH_LAG_S past (gateways publish once a second).
RATE_WINDOW_S = 10
PUBLISH_LAG_S = 1.5
CHART_SPAN_S = 15 * 60
# Share of requests per target: over the last minute, steadier than the rate window.
SHARE_WINDOW_S = 60


@dataclass(frozen=True)
class Bucket:
    """What every gateway counted for one pool (or several, merged) in one bucket."""

    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft: tuple[int, ...] = (0,) * (len(TTFT_BUCKETS) + 1)
    targets: Mapping[int, int] = field(default_factory=dict)

    @classmethod
    def parse(cls, fields: Mapping[bytes | str, bytes | str]) -> Bucket:
        """Return the bucket a Redis hash holds (pools.gateway.counters' field names)."""
        values = {redis_text(name): int(n) for name, n in fields.items()}
        return cls(
            requests=values.get(counters.REQUESTS, 0),
            errors=values.get(counters.ERRORS, 0),
            prompt_tokens=values.get(counters.PROMPT, 0),
            completion_tokens=values.get(counters.COMPLETION, 0),
            ttft=tuple(
                values.get(counters.TTFT_FIELD.format(i), 0) for i in range(len(TTFT_BUCKETS) + 1)
            ),
            targets={
                int(name[1:]): n
                for name, n in values.items()
                if name.startswith("t") and name[1:].isdigit()
            },
        )

    def __add__(self, other: Bucket) -> Bucket:
        targets = dict(self.targets)
        for target_id, n in other.targets.items():
            targets[target_id] = targets.get(target_id, 0) + n
        return Bucket(
            requests=self.requests + other.requests,
            errors=self.errors + other.errors,
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            ttft=tuple(a + b for a, b in zip(self.ttft, other.ttft, strict=True)),
            targets=targets,
        )


EMPTY = Bucket()
# Buckets by their start (epoch seconds), of one pool or merged.
Buckets = Mapping[int, Bucket]


def percentile(histogram: Sequence[int], q: float) -> float | None:
    """Return the q-quantile (0..1) of a TTFT histogram in ms, interpolated within its bucket.

    Beyond the last bound the bound itself is the answer: the histogram knows no more.
    """
    total = sum(histogram)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    bounds_ms = [bound * 1000 for bound in TTFT_BUCKETS]
    for index, n in enumerate(histogram):
        if n and seen + n >= rank:
            if index >= len(bounds_ms):
                return bounds_ms[-1]
            low = bounds_ms[index - 1] if index else 0.0
            return low + (bounds_ms[index] - low) * (rank - seen) / n
        seen += n
    return bounds_ms[-1]


def last_complete(now: float) -> int:
    """Return the start of the newest bucket every gateway has finished writing."""
    return counters.bucket_of(now - PUBLISH_LAG_S) - BUCKET_S


def merge(buckets: Iterable[Bucket]) -> Bucket:
    """Return the buckets added up."""
    total = EMPTY
    for bucket in buckets:
        total = total + bucket
    return total


def merge_pools(by_pool: Iterable[Buckets]) -> dict[int, Bucket]:
    """Return several pools' buckets added up per bucket."""
    merged: dict[int, Bucket] = {}
    for buckets in by_pool:
        for start, bucket in buckets.items():
            merged[start] = merged[start] + bucket if start in merged else bucket
    return merged


@dataclass(frozen=True)
class Figures:
    """A pool's (or several pools') traffic now."""

    requests_per_s: float
    tokens_per_s: float  # completion tokens
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    error_rate: float | None  # None: no requests
    # Requests per target over the share window, and their total.
    target_requests: Mapping[int, int]
    share_total: int


def figures(buckets: Buckets, now: float) -> Figures:
    """Return the figures of the latest complete RATE_WINDOW_S (shares: SHARE_WINDOW_S)."""
    newest = last_complete(now)
    window = merge(
        buckets.get(newest - i * BUCKET_S, EMPTY) for i in range(RATE_WINDOW_S // BUCKET_S)
    )
    share = merge(
        buckets.get(newest - i * BUCKET_S, EMPTY) for i in range(SHARE_WINDOW_S // BUCKET_S)
    )
    return Figures(
        requests_per_s=window.requests / RATE_WINDOW_S,
        tokens_per_s=window.completion_tokens / RATE_WINDOW_S,
        ttft_p50_ms=percentile(window.ttft, 0.5),
        ttft_p95_ms=percentile(window.ttft, 0.95),
        error_rate=window.errors / window.requests if window.requests else None,
        target_requests=share.targets,
        share_total=sum(share.targets.values()),
    )


@dataclass(frozen=True)
class Series:
    """The charts' columns: one value per complete bucket of the last CHART_SPAN_S."""

    times: list[float]
    requests_per_s: list[float | None]
    tokens_per_s: list[float | None]
    ttft_p50_ms: list[float | None]
    ttft_p95_ms: list[float | None]
    target_requests_per_s: dict[int, list[float | None]]


def series(buckets: Buckets, now: float, target_ids: Sequence[int]) -> Series:
    """Return the last CHART_SPAN_S as chart columns, oldest first."""
    newest = last_complete(now)
    starts = [newest - i * BUCKET_S for i in range(CHART_SPAN_S // BUCKET_S)][::-1]
    # Before the first bucket any gateway wrote there is no data (nothing counted yet, or no
    # gateway ran): a gap, not zero. After it, a missing bucket is a quiet one.
    first = min(buckets, default=None)
    rows = [
        None if first is None or start < first else buckets.get(start, EMPTY) for start in starts
    ]

    def per_s(value: Callable[[Bucket], float]) -> list[float | None]:
        return [None if b is None else value(b) / BUCKET_S for b in rows]

    return Series(
        # A bucket is drawn at its end: the moment its figures were true.
        times=[float(start + BUCKET_S) for start in starts],
        requests_per_s=per_s(lambda b: b.requests),
        tokens_per_s=per_s(lambda b: b.completion_tokens),
        ttft_p50_ms=[None if b is None else percentile(b.ttft, 0.5) for b in rows],
        ttft_p95_ms=[None if b is None else percentile(b.ttft, 0.95) for b in rows],
        target_requests_per_s={
            target_id: per_s(_requests_of(target_id)) for target_id in target_ids
        },
    )


def _requests_of(target_id: int) -> Callable[[Bucket], float]:
    return lambda bucket: bucket.targets.get(target_id, 0)


def read_buckets(
    pool_ids: Sequence[int], now: float, cache: BucketCache | None = None
) -> dict[int, dict[int, Bucket]]:
    """Return each pool's buckets of the last CHART_SPAN_S from Redis (none if unreachable).

    With a cache, complete buckets are read once: only the newer ones are asked again.
    """
    if not pool_ids:
        return {}
    prefix = settings.NEXUS_REDIS_PREFIX
    newest = counters.bucket_of(now)
    starts = [newest - i * BUCKET_S for i in range(CHART_SPAN_S // BUCKET_S + 2)]
    complete = last_complete(now)
    wanted = [
        (pool_id, start)
        for pool_id in pool_ids
        for start in starts
        if cache is None or start > complete or (pool_id, start) not in cache.known
    ]
    client = redis_client()
    try:
        pipe = client.pipeline(transaction=False)
        for pool_id, start in wanted:
            pipe.hgetall(counters.counts_key(prefix, pool_id, start))
        answers = pipe.execute()
    except RedisError:
        return {}
    found: dict[int, dict[int, Bucket]] = {pool_id: {} for pool_id in pool_ids}
    for (pool_id, start), fields in zip(wanted, answers, strict=True):
        bucket = Bucket.parse(fields) if fields else None
        if cache is not None and start <= complete:
            cache.known[pool_id, start] = bucket
        if bucket is not None:
            found[pool_id][start] = bucket
    if cache is not None:
        oldest = starts[-1]
        for (pool_id, start), bucket in list(cache.known.items()):
            if start < oldest:
                del cache.known[pool_id, start]
            elif bucket is not None and pool_id in found:
                found[pool_id].setdefault(start, bucket)
    return found


@dataclass
class BucketCache:
    """Complete buckets already read (None: none was written), by pool and start; one per open
    Live page, so that its pushes read only the newest buckets from Redis."""

    known: dict[tuple[int, int], Bucket | None] = field(default_factory=dict)
