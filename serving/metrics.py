"""Autoscaling's metric pipeline: samples per replica into Redis, Prometheus queries, readings.

- Inference framework: each ready replica's `/metrics` (vLLM, SGLang, llama.cpp and the
  simulator all speak Prometheus text), fetched through its node's agent like a health probe
  and read with `prometheus_client`'s parser; samples of one name are summed over their labels.
- Kernel: the agent's per-process sample (`cpu_percent`, `memory_bytes`) that the node refresh
  keeps on the node; `net_rx`/`net_tx` are the node's rates, as the kernel counts network bytes
  per interface, not per process (nodes/agent/metrics.py).

Both are kept as one sorted set per replica and source in Redis, scored by the sample's time
(epoch seconds), for an hour at most. A reading aggregates each replica's samples within the
rule's window (serving.autoscaling.aggregate). No sample in the window is no data, never zero.

- Prometheus: an instant query to `NEXUS_PROMETHEUS_URL`/api/v1/query; every series it returns
  is one value, aggregated over the series by the rule's aggregation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import httpx
from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families
from redis.exceptions import RedisError

from nexus import upstream
from nexus.services import redis_client
from serving.autoscaling import Aggregation, MetricSource, Reading, aggregate
from serving.models import Route

log = logging.getLogger(__name__)

# The longest window a rule may have (AutoScalingRule.window_s): older samples are dropped.
KEPT_S = 3600
SCRAPE_TIMEOUT_S = 5.0
QUERY_TIMEOUT_S = 5.0
MAX_METRICS_BYTES = 4 * 1024 * 1024
KERNEL_FIELDS = {"cpu_util": "cpu_percent", "mem": "memory_bytes"}
KERNEL_NODE_FIELDS = {"net_rx": "net_rx_bytes_per_s", "net_tx": "net_tx_bytes_per_s"}


def parse_metrics(text: str) -> dict[str, float]:
    """Return each sample name's value, summed over its label sets; {} for unreadable text."""
    values: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if math.isfinite(sample.value):
                    values[sample.name] = values.get(sample.name, 0.0) + sample.value
    except (ValueError, TypeError, IndexError) as error:
        log.info("unreadable /metrics text: %s", error)
        return {}
    return values


def _key(source: MetricSource | str, route_id: int) -> str:
    return f"{settings.NEXUS_REDIS_PREFIX}:autoscaling:samples:{source}:{route_id}"


def store_sample(
    source: MetricSource | str, route_id: int, at: float, values: Mapping[str, float]
) -> None:
    """Keep one replica's sample of its metrics at `at` (epoch seconds)."""
    key = _key(source, route_id)
    member = json.dumps({"at": at, "values": dict(values)}, sort_keys=True)
    pipe = redis_client().pipeline()
    pipe.zadd(key, {member: at})
    pipe.zremrangebyscore(key, "-inf", at - KEPT_S)
    pipe.expire(key, KEPT_S)
    pipe.execute()


def replica_reading(
    source: MetricSource | str,
    route_ids: Iterable[int],
    metric: str,
    *,
    window_s: float,
    aggregation: Aggregation | str,
    now: float,
) -> Reading:
    """Aggregate the metric's samples of the replicas within the window ending now."""
    route_ids = list(route_ids)
    if not route_ids:
        return Reading(value=None, problem="no ready replica to measure")
    try:
        pipe = redis_client().pipeline()
        for route_id in route_ids:
            pipe.zrangebyscore(_key(source, route_id), now - window_s, "+inf")
        found = pipe.execute()
    except RedisError as error:
        return Reading(value=None, problem=f"Redis is unreachable: {error}")
    per_replica: list[list[float]] = []
    newest: float | None = None
    for members in found:
        samples = [json.loads(member) for member in members]
        values = [float(s["values"][metric]) for s in samples if metric in s["values"]]
        if values:
            per_replica.append(values)
            at = max(float(s["at"]) for s in samples if metric in s["values"])
            newest = at if newest is None else max(newest, at)
    value = aggregate(per_replica, aggregation)
    if value is None:
        return Reading(value=None, problem=f"no {metric} sample in the last {window_s:g} s")
    return Reading(value=value, at=newest, series=len(per_replica))


@dataclass(frozen=True, slots=True)
class Scraped:
    """One replica's /metrics answer: its values, or why there are none."""

    route_id: int
    at: float
    values: dict[str, float]
    problem: str = ""


def scrape_replicas(routes: Sequence[Route], now: float) -> list[Scraped]:
    """Fetch the replicas' /metrics through their agents, store the samples; return them."""
    if not routes:
        return []
    scraped = asyncio.run(_scrape_all(routes, now))
    for result in scraped:
        if result.values:
            _keep(MetricSource.INFERENCE_FRAMEWORK, result.route_id, now, result.values)
        elif result.problem:
            log.info("route %s: no metrics: %s", result.route_id, result.problem)
    return scraped


def _keep(source: MetricSource, route_id: int, at: float, values: Mapping[str, float]) -> bool:
    """Store a sample; without Redis it is lost, and the readings say "no data" for it."""
    try:
        store_sample(source, route_id, at, values)
    except RedisError as error:
        log.warning("route %s: sample not kept, Redis is unreachable: %s", route_id, error)
        return False
    return True


async def _scrape_all(routes: Sequence[Route], now: float) -> list[Scraped]:
    try:
        return list(await asyncio.gather(*(_scrape(route, now) for route in routes)))
    finally:
        # The client belongs to this call's event loop, which ends here.
        await upstream.close()


async def _scrape(route: Route, now: float) -> Scraped:
    node = route.node
    assert node is not None
    url = f"{node.address.rstrip('/')}/agent/v1/processes/{route.process_id}/http/metrics"
    request = httpx.Request(
        "GET", url, headers={"Authorization": f"Bearer {node.get_credential()}"}
    )
    try:
        async with asyncio.timeout(SCRAPE_TIMEOUT_S):
            response = await upstream.get().send(request)
            try:
                body = b""
                async for chunk in response.aiter_raw():
                    body += chunk
                    if len(body) > MAX_METRICS_BYTES:
                        return Scraped(route.pk, now, {}, "/metrics is too large")
            finally:
                await response.aclose()
    except TimeoutError:
        return Scraped(route.pk, now, {}, f"/metrics took over {SCRAPE_TIMEOUT_S:g} s")
    except httpx.HTTPError as error:
        return Scraped(route.pk, now, {}, f"unreachable: {error}")
    if response.status_code != 200:
        return Scraped(route.pk, now, {}, f"/metrics answered {response.status_code}")
    return Scraped(route.pk, now, parse_metrics(body.decode(errors="replace")))


def store_kernel_samples(routes: Sequence[Route]) -> int:
    """Keep each replica's latest agent sample (taken at its node's last refresh); return how
    many replicas had one."""
    stored = 0
    for route in routes:
        node = route.node
        if node is None or node.last_seen_at is None or not node.metrics:
            continue
        process = next(
            (p for p in node.metrics.get("processes", []) if p.get("id") == route.process_id),
            None,
        )
        if process is None:
            continue
        values = {name: float(process[field]) for name, field in KERNEL_FIELDS.items()}
        machine = node.metrics.get("node", {})
        values |= {
            name: float(machine.get(field, 0.0)) for name, field in KERNEL_NODE_FIELDS.items()
        }
        stored += _keep(MetricSource.KERNEL, route.pk, node.last_seen_at.timestamp(), values)
    return stored


@dataclass(frozen=True, slots=True)
class QueryResult:
    """What a Prometheus instant query returned: each series' value and time, or a problem."""

    values: tuple[tuple[float, float], ...]  # (epoch seconds, value) per series
    problem: str = ""

    @property
    def series(self) -> int:
        return len(self.values)

    @property
    def latest(self) -> tuple[float, float] | None:
        """Return the most recent series sample (time, value)."""
        return max(self.values) if self.values else None

    def reading(self, aggregation: Aggregation | str) -> Reading:
        """Return the value over every series (each series one replica or one label set)."""
        if self.problem:
            return Reading(value=None, problem=self.problem)
        value = aggregate([[v] for _, v in self.values if math.isfinite(v)], aggregation)
        if value is None:
            return Reading(value=None, problem="the query returned no data")
        return Reading(value=value, at=max(at for at, _ in self.values), series=self.series)


def query_prometheus(query: str) -> QueryResult:
    """Run an instant query against NEXUS_PROMETHEUS_URL."""
    base = settings.NEXUS_PROMETHEUS_URL
    if not base:
        return QueryResult((), "no Prometheus server is configured (NEXUS_PROMETHEUS_URL)")
    return asyncio.run(_query(f"{base.rstrip('/')}/api/v1/query", query))


async def _query(url: str, query: str) -> QueryResult:
    try:
        async with asyncio.timeout(QUERY_TIMEOUT_S):
            response = await upstream.get().client.get(url, params={"query": query})
    except TimeoutError:
        return QueryResult((), f"Prometheus did not answer in {QUERY_TIMEOUT_S:g} s")
    except httpx.HTTPError as error:
        return QueryResult((), f"Prometheus is unreachable: {error}")
    finally:
        await upstream.close()
    try:
        answer = response.json()
    except ValueError:
        return QueryResult((), f"Prometheus answered {response.status_code}, not JSON")
    if answer.get("status") != "success":
        return QueryResult((), f"Prometheus refused the query: {answer.get('error', '?')}")
    data = answer.get("data", {})
    if data.get("resultType") == "scalar":
        at, value = data["result"]
        return QueryResult(((float(at), float(value)),))
    if data.get("resultType") != "vector":
        return QueryResult((), f"the query returned a {data.get('resultType')}, not a vector")
    return QueryResult(
        tuple((float(item["value"][0]), float(item["value"][1])) for item in data["result"])
    )
