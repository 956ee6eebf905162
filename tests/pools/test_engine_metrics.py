"""The gateway reads engines' own running and waiting counts from their /metrics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from pools.balancer.strategies import engine_load
from pools.gateway.engine_metrics import STALE_AFTER_S, EngineLoads, metrics_url, parse_load
from tests.support.ports import free_port
from tests.support.simulator import Simulator, running_simulator
from tests.support.waiting import eventually

VLLM_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0 1700000000000
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
"""


def test_it_sums_vllm_gauges_over_engines() -> None:
    assert parse_load(VLLM_TEXT) == (5, 7)


def test_it_reads_sglang_and_llama_cpp_names() -> None:
    sglang = 'sglang:num_running_reqs{model_name="m"} 4\nsglang:num_queue_reqs{model_name="m"} 1\n'
    llama = "llamacpp:requests_processing 2\nllamacpp:requests_deferred 6\n"

    assert parse_load(sglang) == (4, 1)
    assert parse_load(llama) == (2, 6)


def test_label_values_may_hold_braces_commas_and_escaped_quotes() -> None:
    text = 'vllm:num_requests_running{model_name="a,b}",path="x\\"y"} 2.0 1700000000000\n'

    assert parse_load(text) == (2, 0)


def test_a_malformed_line_loses_only_itself() -> None:
    text = (
        'vllm:num_requests_running{engine="0"} 3\n'
        'vllm:num_requests_running{engine="1" 4\n'  # no closing brace
        "vllm:num_requests_waiting not-a-number\n"
        "vllm:num_requests_waiting 2\n"
    )

    assert parse_load(text) == (3, 2)


def test_it_returns_nothing_for_an_engine_without_load_gauges() -> None:
    assert parse_load("process_cpu_seconds_total 12.5\n") is None


def test_it_finds_metrics_beside_the_openai_base_url() -> None:
    assert metrics_url("http://10.0.0.5:8000/v1") == "http://10.0.0.5:8000/metrics"
    assert metrics_url("http://10.0.0.5:8000/v1/") == "http://10.0.0.5:8000/metrics"


@pytest.fixture(scope="module")
def engine() -> Iterator[Simulator]:
    with running_simulator(ttft_ms=0, tpot_ms=200, concurrency=1) as sim:
        yield sim


async def test_it_scrapes_a_real_engine_and_forgets_stale_readings(engine: Simulator) -> None:
    loads = EngineLoads()
    body = {"model": "demo-8b", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5}
    async with httpx.AsyncClient() as client:
        busy = [
            client.post(f"{engine.base_url}/chat/completions", json=body, timeout=10)
            for _ in range(3)
        ]
        pending = [asyncio.ensure_future(request) for request in busy]

        async def all_arrived() -> bool:
            stats = (await client.get(f"{engine.root_url}/sim/stats", timeout=5)).json()
            return stats["requests_running"] + stats["requests_waiting"] == 3

        await eventually(all_arrived, what="the three requests reach the engine")
        # Nexus's own count on the target, kept with the reading: 2 of the 3 are its requests.
        await loads.scrape(client, [(1, engine.base_url)], lambda target_id: 2, lambda _: 0)
        reading = loads.fresh(1, time.monotonic())
        await asyncio.gather(*pending)

    assert reading is not None
    assert (reading.running, reading.waiting, reading.counted) == (1, 2, 2)
    assert loads.fresh(1, time.monotonic() + STALE_AFTER_S + 0.1) is None


async def test_a_request_nexus_started_and_ended_while_the_engine_was_read_is_nexuss_own(
    engine: Simulator,
) -> None:
    """The engine counted a request of Nexus's that started after the scrape read Nexus's count
    and ended before it read it again: in flight neither time, it is still not another
    client's load (a one-slot target would look full to the next request because of one)."""
    loads = EngineLoads()
    body = {"model": "demo-8b", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    starts = iter([0, 1])  # Nexus's count of requests started, before and after the read
    async with httpx.AsyncClient() as client:
        request = asyncio.ensure_future(
            client.post(f"{engine.base_url}/chat/completions", json=body, timeout=10)
        )

        async def arrived() -> bool:
            stats = (await client.get(f"{engine.root_url}/sim/stats", timeout=5)).json()
            return bool(stats["requests_running"] == 1)

        await eventually(arrived, what="the request reaches the engine")
        await loads.scrape(client, [(1, engine.base_url)], lambda _: 0, lambda _: next(starts))
        reading = loads.fresh(1, time.monotonic())
        await request

    assert reading is not None
    assert (reading.running, reading.counted) == (1, 1)
    assert engine_load(0, reading.running + reading.waiting, reading.counted) == 0


async def test_it_leaves_an_unreachable_engine_without_a_reading() -> None:
    loads = EngineLoads()
    async with httpx.AsyncClient() as client:
        await loads.scrape(
            client, [(7, f"http://127.0.0.1:{free_port()}/v1")], lambda _: 0, lambda _: 0
        )

    assert loads.fresh(7, time.monotonic()) is None
