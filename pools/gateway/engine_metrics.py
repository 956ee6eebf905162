"""Read engines' own load from their Prometheus /metrics (vLLM, SGLang, llama.cpp names).

The gateway scrapes each target about once a second in a background task; a reading older than
STALE_AFTER_S is ignored and the balancer falls back to the gateway's own in-flight counts. Each
reading keeps Nexus's own in-flight count on the target at the time, so that the balancer counts
only the engine's load beyond it (pools.balancer.strategies.load_of).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from nodes.runtimes import metric_names

log = logging.getLogger(__name__)

STALE_AFTER_S = 2.0
SCRAPE_INTERVAL_S = 1.0
SCRAPE_TIMEOUT_S = 0.8

# Gauge names per runtime, from the runtime catalogue: (running, waiting). The first family
# present in a scrape wins.
RUNNING_NAMES, WAITING_NAMES = metric_names()
WANTED = frozenset(RUNNING_NAMES + WAITING_NAMES)
WANTED_PREFIXES = tuple(sorted({name.partition(":")[0] + ":" for name in WANTED}))


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """An engine's own count of running and waiting requests, and when it was read."""

    running: int
    waiting: int
    read_at: float  # monotonic seconds
    # Nexus's requests on the target that the engine may have counted: those in flight when the
    # scrape began plus those started during it (even one that also ended during it), at least
    # as many as are in flight after, so that none passes for another client's.
    counted: int = 0


def parse_load(text: str) -> tuple[int, int] | None:
    """Return (running, waiting) summed over all series, or None if the engine exports neither.

    Only lines of the wanted runtimes' families are parsed (an engine's /metrics holds hundreds
    of others), one by one, so that one malformed line loses only itself.
    """
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(WANTED_PREFIXES):
            continue
        try:
            families = list(text_string_to_metric_families(line))
        except ValueError:
            continue
        for family in families:
            for sample in family.samples:
                if sample.name in WANTED:
                    sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    running = next((sums[name] for name in RUNNING_NAMES if name in sums), None)
    waiting = next((sums[name] for name in WAITING_NAMES if name in sums), None)
    if running is None and waiting is None:
        return None
    return int(running or 0), int(waiting or 0)


def metrics_url(base_url: str) -> str:
    """Return the /metrics URL of an OpenAI-compatible base URL (which ends in /v1)."""
    root = base_url.rstrip("/")
    return (root[: -len("/v1")] if root.endswith("/v1") else root) + "/metrics"


class EngineLoads:
    """The latest fresh reading per target; scraped in the background, read without I/O."""

    def __init__(self) -> None:
        self._loads: dict[int, EngineLoad] = {}
        self._unsupported: set[int] = set()

    def fresh(self, target_id: int, now: float) -> EngineLoad | None:
        """Return the target's reading if it is younger than STALE_AFTER_S."""
        load = self._loads.get(target_id)
        if load is None or now - load.read_at > STALE_AFTER_S:
            return None
        return load

    async def scrape(
        self,
        client: httpx.AsyncClient,
        targets: Iterable[tuple[int, str]],
        in_flight: Callable[[int], int],
        started: Callable[[int], int],
    ) -> None:
        """Read every target's /metrics once, concurrently; failures just leave readings stale.

        in_flight: Nexus's own count of requests on a target, kept with its reading.
        started: how many requests this process has ever started on a target.
        """
        pending = [(tid, url) for tid, url in targets if tid not in self._unsupported]
        await asyncio.gather(
            *(self._scrape_one(client, tid, url, in_flight, started) for tid, url in pending)
        )

    async def _scrape_one(
        self,
        client: httpx.AsyncClient,
        target_id: int,
        base_url: str,
        in_flight: Callable[[int], int],
        started: Callable[[int], int],
    ) -> None:
        before = in_flight(target_id)
        started_before = started(target_id)
        try:
            response = await client.get(metrics_url(base_url), timeout=SCRAPE_TIMEOUT_S)
        except httpx.HTTPError:
            return
        if response.status_code == 404:
            # Hosted providers have no /metrics: stop asking until the snapshot changes.
            self._unsupported.add(target_id)
            return
        parsed = parse_load(response.text) if response.status_code == 200 else None
        if parsed is not None:
            # A request that started and ended while the engine was read is in neither count
            # (one such would make a one-slot target that Nexus alone uses look full to the
            # next request).
            during = started(target_id) - started_before
            counted = max(before + during, in_flight(target_id))
            self._loads[target_id] = EngineLoad(*parsed, read_at=time.monotonic(), counted=counted)

    def forget_unsupported(self) -> None:
        """Ask every target again (after a configuration change)."""
        self._unsupported.clear()
