"""Prometheus metrics of the gateway (pools.views.metrics_view serves them at /metrics).

Each process counts its own requests and exposes them at its own /metrics. With several gateway
processes, scrape each one, or run them in prometheus-client's multiprocess mode
(PROMETHEUS_MULTIPROC_DIR set before start): /metrics then merges every process's files.
Labels are pool slugs and target names only, so the series are bounded by the configuration.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, multiprocess
from prometheus_client.metrics import MetricWrapperBase

# Waiting for a slot: from immediate to the longest configurable queue waits.
QUEUE_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# First output: tens of milliseconds on a warm engine to tens of seconds on a long prefill.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
# A whole request: an embedding in milliseconds to a long generation in minutes.
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
# The target label of a request that never reached one (queue full, no target).
NO_TARGET = ""

REQUESTS = Counter(
    "nexus_requests", "Requests the gateway finished, by outcome.", ["pool", "target", "outcome"]
)
ATTEMPTS = Counter(
    "nexus_attempts", "Attempts sent to targets, by how far they got.", ["pool", "target", "phase"]
)
TOKENS = Counter(
    "nexus_tokens",
    "Tokens of answered requests, from the answer's usage, by kind (prompt or completion).",
    ["pool", "target", "kind"],
)
QUEUE_WAIT = Histogram(
    "nexus_queue_wait_seconds",
    "Time waiting for a free slot.",
    ["pool"],
    buckets=QUEUE_WAIT_BUCKETS,
)
TTFT = Histogram(
    "nexus_time_to_first_token_seconds",
    "Time from arrival to the first byte of output.",
    ["pool", "target"],
    buckets=TTFT_BUCKETS,
)
DURATION = Histogram(
    "nexus_request_duration_seconds",
    "Time from arrival to the end of the answer.",
    ["pool", "target"],
    buckets=DURATION_BUCKETS,
)
# In multiprocess mode: in-flight counts may come from the shared ledger (every process sees the
# same number), so keep the latest; queues are per process, so add the live processes' values.
IN_FLIGHT = Gauge(
    "nexus_in_flight",
    "Requests in flight on a target.",
    ["pool", "target"],
    multiprocess_mode="livemostrecent",
)
QUEUED = Gauge(
    "nexus_queued", "Requests waiting in a pool's queue.", ["pool"], multiprocess_mode="livesum"
)
HISTORY_DROPPED = Counter(
    "nexus_history_dropped_rows",
    "Routing records a gateway dropped, by cause: buffer_full (Redis away too long), shutdown "
    "(neither Redis nor the database took them). The writers' own: "
    "nexus_history_writer_dropped_rows.",
    ["cause"],
)

# Every series used so far, with the pool and target it belongs to (the target is None for
# per-pool series), so that the series of deleted pools and targets can be removed.
_series: dict[tuple[MetricWrapperBase, tuple[str, ...]], tuple[str, str | None]] = {}
# The labelled children themselves: labels() takes a lock and validates on every call, which
# the hot path should pay once per series, not per request.
_children: dict[tuple[MetricWrapperBase, tuple[str, ...]], Any] = {}


def _child(metric: MetricWrapperBase, pool: str, target: str | None, *labels: str) -> Any:
    key = (metric, labels)
    child = _children.get(key)
    if child is None:
        _series[key] = (pool, target)
        child = _children[key] = metric.labels(*labels)
    return child


def observe_request(
    pool: str,
    target: str | None,
    outcome: str,
    queue_wait_s: float | None,
    ttft_s: float | None,
    total_s: float,
    usage: tuple[int, int] | None = None,
) -> None:
    """Count a finished request, its timings (in seconds; None when it did not happen) and the
    (prompt, completion) tokens its answer reported."""
    target = target or NO_TARGET
    _child(REQUESTS, pool, target, pool, target, outcome).inc()
    if usage is not None:
        prompt, completion = usage
        if prompt:
            _child(TOKENS, pool, target, pool, target, "prompt").inc(prompt)
        if completion:
            _child(TOKENS, pool, target, pool, target, "completion").inc(completion)
    if queue_wait_s is not None:
        _child(QUEUE_WAIT, pool, None, pool).observe(queue_wait_s)
    if ttft_s is not None:
        _child(TTFT, pool, target, pool, target).observe(ttft_s)
    _child(DURATION, pool, target, pool, target).observe(total_s)


def observe_attempt(pool: str, target: str, phase: str) -> None:
    """Count an attempt on a target and the phase it ended in."""
    _child(ATTEMPTS, pool, target, pool, target, phase).inc()


def set_in_flight(pool: str, target: str, n: int) -> None:
    """Report a target's in-flight count."""
    _child(IN_FLIGHT, pool, target, pool, target).set(n)


def set_queued(pool: str, n: int) -> None:
    """Report how many requests wait in a pool's queue."""
    _child(QUEUED, pool, None, pool).set(n)


def retain(targets: Collection[tuple[str, str]]) -> None:
    """Keep only the series of these (pool slug, target name) pairs and their pools."""
    live = set(targets)
    live_pools = {pool for pool, _ in live}
    for (metric, labels), (pool, target) in list(_series.items()):
        if target is None or target == NO_TARGET:
            keep = pool in live_pools
        else:
            keep = (pool, target) in live
        if not keep:
            del _series[(metric, labels)]
            _children.pop((metric, labels), None)
            metric.remove(*labels)


def registry() -> CollectorRegistry:
    """Return the registry to expose: this process's, or every process's in multiprocess mode."""
    if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        return REGISTRY
    merged = CollectorRegistry()
    multiprocess.MultiProcessCollector(merged)
    return merged
