"""The agent's pure rules: GPU listing, free resources, runtime states and runtime guesses."""

from __future__ import annotations

import pytest

from nodes.agent.inventory import guess_runtime, reported_state
from nodes.agent.resources import free_resources, parse_nvidia_smi

MIB = 2**20
TOTAL = {
    "cpu_count": 16,
    "memory_bytes": 128 * 2**30,
    "gpus": [
        {"index": 0, "name": "NVIDIA H200", "memory_bytes": 143771 * MIB},
        {"index": 1, "name": "NVIDIA H200", "memory_bytes": 143771 * MIB},
    ],
}


def test_nvidia_smi_csv_becomes_gpus_with_memory_in_bytes() -> None:
    output = "0, NVIDIA H200, 143771\n1, NVIDIA GeForce RTX 4090, 24564\n"

    assert parse_nvidia_smi(output) == [
        {"index": 0, "name": "NVIDIA H200", "memory_bytes": 143771 * MIB},
        {"index": 1, "name": "NVIDIA GeForce RTX 4090", "memory_bytes": 24564 * MIB},
    ]


def test_lines_nvidia_smi_could_not_fill_are_skipped() -> None:
    output = "0, NVIDIA H200, [N/A]\nNo devices were found\n\n1, NVIDIA H200, 143771\n"

    assert [gpu["index"] for gpu in parse_nvidia_smi(output)] == [1]


def test_free_resources_subtract_each_reservation() -> None:
    reservations = [
        {"cpu_count": 4, "memory_bytes": 32 * 2**30, "gpus": [1]},
        {"cpu_count": 0.5, "memory_bytes": 2**30, "gpus": [{"index": 0}]},
        None,
    ]

    assert free_resources(TOTAL, reservations) == {
        "cpu_count": 11.5,
        "memory_bytes": 95 * 2**30,
        "gpus": [],
    }


def test_free_resources_never_go_below_zero() -> None:
    free = free_resources(TOTAL, [{"cpu_count": 64, "memory_bytes": 2**40, "gpus": []}])

    assert (free["cpu_count"], free["memory_bytes"]) == (0, 0)
    assert free["gpus"] == TOTAL["gpus"]


@pytest.mark.parametrize(
    ("entry", "state"),
    [
        ({"id": "m", "state": "loaded"}, "loaded"),
        ({"id": "m", "state": "cold"}, "cold"),
        ({"id": "m", "status": "sleeping"}, "warm"),
        ({"id": "m", "status": "LOADING"}, "warm"),
        ({"id": "m", "status": {"value": "unloaded", "args": []}}, "cold"),
        ({"id": "m", "status": "something new"}, "unknown"),
        ({"id": "m"}, "unknown"),
    ],
)
def test_the_state_is_what_the_runtime_reports_or_unknown(entry: dict, state: str) -> None:
    assert reported_state(entry) == state


@pytest.mark.parametrize(
    ("owned_by", "base_url", "runtime"),
    [
        ("llamacpp", "http://127.0.0.1:8080/v1", "llama-cpp"),
        ("vllm", "http://127.0.0.1:8000/v1", "vllm"),
        ("nexus-simulator", "http://127.0.0.1:9101/v1", "simulator"),
        ("library", "http://127.0.0.1:11434/v1", "ollama"),
        ("someone", "http://127.0.0.1:1234/v1", "openai-compatible"),
        (None, "http://127.0.0.1:1234/v1", "openai-compatible"),
    ],
)
def test_a_watched_runtime_is_guessed_from_its_owner_or_port(
    owned_by: str | None, base_url: str, runtime: str
) -> None:
    assert guess_runtime({"id": "m", "owned_by": owned_by}, base_url) == runtime
