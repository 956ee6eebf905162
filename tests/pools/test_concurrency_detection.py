"""Capacity from the runtime: each runtime's own answer to "how many requests at once", read from
a loopback server that answers as that runtime does; anything else says it cannot tell."""

from __future__ import annotations

import json

import pytest

from pools.validation import detect_runtime_concurrency
from tests.support.fileserver import serving_files


@pytest.mark.parametrize(
    ("path", "answer", "expected"),
    [
        ("sim/stats", {"concurrency": 6, "running": 0}, (6, "the simulator's --concurrency")),
        ("props", {"total_slots": 4, "n_ctx": 8192}, (4, "llama.cpp's total_slots")),
        (
            "get_server_info",
            {"max_running_requests": 48, "version": "0.5"},
            (48, "SGLang's max_running_requests"),
        ),
        (
            "server_info",
            {"vllm_config": {"scheduler_config": {"max_num_seqs": 256}}, "vllm_env": {}},
            (256, "vLLM's max_num_seqs"),
        ),
    ],
)
def test_each_runtime_says_how_many_requests_it_runs_at_once(
    path: str, answer: dict[str, object], expected: tuple[int, str]
) -> None:
    with serving_files({path: json.dumps(answer).encode()}) as server:
        assert detect_runtime_concurrency(f"{server.base_url}/v1") == expected


def test_vllms_text_configuration_and_odd_figures_are_not_taken_for_a_capacity() -> None:
    files = {
        # vLLM's default /server_info answer: the configuration as one string.
        "server_info": json.dumps({"vllm_config": "model='m', max_num_seqs=256"}).encode(),
        "props": json.dumps({"total_slots": True}).encode(),
        "get_server_info": json.dumps({"max_running_requests": 0}).encode(),
        "sim/stats": b"not json",
    }
    with serving_files(files) as server:
        assert detect_runtime_concurrency(f"{server.base_url}/v1") == (None, "")
        asked = {request["path"] for request in server.requests}
    assert {"/sim/stats", "/props", "/get_server_info", "/server_info"} <= asked


def test_a_provider_that_answers_none_of_them_cannot_tell() -> None:
    with serving_files({"v1/models": b'{"data": []}'}) as server:
        assert detect_runtime_concurrency(f"{server.base_url}/v1") == (None, "")
