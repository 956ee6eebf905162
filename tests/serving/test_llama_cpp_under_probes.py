"""The llama.cpp variant's command and health path, run for real: llama-cpp-python's server with
SmolLM2, streaming a long answer while its health path is probed.

By default that server ends a stream early, its [DONE] sent without a finish reason, whenever
another request waits for the model, and its /v1/models waits for the model behind a whole
generation: a health probe on /v1/models cut streams short (a CI run saw it) or would have
waited out its timeout behind a long answer. Marked `llama` like the other real-model tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import httpx
import pytest

from nodes.runtimes import build_command, runtime
from tests.support.http import LOOPBACK
from tests.support.ports import free_port
from tests.support.processes import stop
from tests.support.real_model import require_real_model
from tests.support.waiting import wait_until

pytestmark = pytest.mark.llama

PROBES = 3
# SmolLM2 on this CPU writes ~100 tokens a second: a 200-token answer outlasts the probes.
MAX_TOKENS = 200


def _answered(url: str) -> bool:
    try:
        return LOOPBACK.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_stream_ends_with_its_finish_reason_while_the_health_path_answers_at_once(
    tmp_path,
) -> None:
    gguf = require_real_model()
    variant = runtime("llama-cpp")
    port = free_port()
    argv = build_command(
        variant, model_path=str(gguf), model_name="smol", port=port, env={}, python=sys.executable
    )
    log = (tmp_path / "llama.log").open("wb")
    engine = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answered(base + variant.health_path), timeout_s=60)
        probe_seconds: list[float] = []
        probed_at: list[float] = []
        streaming = threading.Event()

        def probe() -> None:
            streaming.wait(30)
            for _ in range(PROBES):
                started = time.monotonic()
                assert LOOPBACK.get(base + variant.health_path, timeout=30).status_code == 200
                probed_at.append(time.monotonic())
                probe_seconds.append(probed_at[-1] - started)

        prober = threading.Thread(target=probe)
        prober.start()
        finishes: list[str | None] = []
        body = {
            "model": "smol",
            "messages": [{"role": "user", "content": "Tell a long story about a dragon."}],
            "max_tokens": MAX_TOKENS,
            "stream": True,
        }
        with LOOPBACK.stream(
            "POST", f"{base}/v1/chat/completions", json=body, timeout=60
        ) as answer:
            for line in answer.iter_lines():
                if line.startswith("data: {"):
                    streaming.set()
                    chunk = json.loads(line.removeprefix("data: "))
                    finishes += [choice["finish_reason"] for choice in chunk["choices"]]
                if line == "data: [DONE]":
                    # The server closes the connection without ending the chunked body.
                    break
        ended_at = time.monotonic()
        prober.join(30)
    finally:
        stop(engine, 10)
        log.close()

    assert len(probe_seconds) == PROBES
    # The probes answered while the answer was still being written, each at once.
    assert probed_at[-1] < ended_at
    assert max(probe_seconds) < 1.0, probe_seconds
    assert len(finishes) > PROBES
    assert finishes[-1] in ("stop", "length"), finishes[-5:]
