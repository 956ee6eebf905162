"""The simulated inference engine, driven over real sockets with httpx and the OpenAI SDK."""

from __future__ import annotations

import functools
import json
import math
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import httpx
import openai
import pytest

from serving.runtimes.simulator.config import SimulatorConfig
from serving.runtimes.simulator.engine import VOCABULARY, Engine, PrefixCache
from tests.support.http import LOOPBACK
from tests.support.simulator import Simulator, running_simulator, start_simulator
from tests.support.waiting import wait_until

MODEL = "demo-8b"
TTFT_S = 0.1
TPOT_S = 0.02
T = TypeVar("T")

# One pooled client: a new httpx client costs ~0.1 s of TLS setup, which would swamp timings.
http = httpx.Client(timeout=5)


def teardown_module() -> None:
    http.close()


@pytest.fixture(scope="module")
def fast() -> Iterator[Simulator]:
    """An instant simulator for API-shape tests."""
    with running_simulator(MODEL, ttft_ms=0, tpot_ms=0, concurrency=4) as simulator:
        yield simulator


@pytest.fixture(scope="module")
def paced() -> Iterator[Simulator]:
    """A simulator with measurable latencies and two slots, for timing and load tests."""
    with running_simulator(
        MODEL, ttft_ms=TTFT_S * 1000, tpot_ms=TPOT_S * 1000, concurrency=2, slowdown=0
    ) as simulator:
        yield simulator


@pytest.fixture(scope="module")
def faulty_process() -> Iterator[Simulator]:
    """The process behind ``faulty``."""
    with running_simulator(MODEL, ttft_ms=0, tpot_ms=0) as simulator:
        yield simulator


@pytest.fixture
def faulty(faulty_process: Simulator) -> Iterator[Simulator]:
    """A simulator whose faults are cleared after each test."""
    yield faulty_process
    faulty_process.clear_faults()


@functools.cache
def sdk(simulator: Simulator) -> openai.OpenAI:
    return openai.OpenAI(base_url=simulator.base_url, api_key="x", max_retries=0, timeout=5)


def chat_body(content: str = "Hello there", **extra: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


def post_chat(simulator: Simulator, timeout: float = 5, **body: object) -> httpx.Response:
    return http.post(
        f"{simulator.base_url}/chat/completions", json={**chat_body(), **body}, timeout=timeout
    )


def sse_payloads(lines: Iterable[str]) -> list[str]:
    return [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]


def metric(simulator: Simulator, name: str) -> float:
    text = http.get(f"{simulator.root_url}/metrics").text
    found = re.search(rf'^{re.escape(name)}\{{model_name="{MODEL}"\}} (\S+)$', text, re.M)
    assert found, f"{name} missing from /metrics"
    return float(found.group(1))


def wait_for(condition: Callable[[], bool], timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def timed(call: Callable[[], T]) -> tuple[float, T]:
    started = time.monotonic()
    result = call()
    return time.monotonic() - started, result


# -- models, health, metrics -------------------------------------------------------------------


def test_models_lists_the_served_model(fast: Simulator) -> None:
    body = http.get(f"{fast.base_url}/models").json()

    assert body["object"] == "list"
    [entry] = body["data"]
    assert entry == {
        "id": MODEL,
        "object": "model",
        "created": entry["created"],
        "owned_by": "nexus-simulator",
        "state": "loaded",
    }
    assert isinstance(entry["created"], int)
    assert [model.id for model in sdk(fast).models.list()] == [MODEL]


def test_health_answers_ok(fast: Simulator) -> None:
    response = http.get(f"{fast.root_url}/health")

    assert (response.status_code, response.json()) == (200, {"status": "ok"})


def test_metrics_use_vllm_names_labelled_with_the_model(fast: Simulator) -> None:
    response = http.get(f"{fast.root_url}/metrics")

    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:gpu_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
    ):
        assert f"# TYPE {name} " in response.text
        assert metric(fast, name) >= 0


# -- chat and completions ----------------------------------------------------------------------


def test_chat_completion_has_the_openai_shape(fast: Simulator) -> None:
    completion = sdk(fast).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "one two three"}], max_tokens=5
    )

    assert completion.id.startswith("chatcmpl-")
    assert completion.object == "chat.completion"
    assert completion.model == MODEL
    [choice] = completion.choices
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert len(choice.message.content.split()) == 5
    assert set(choice.message.content.split()) <= set(VOCABULARY)
    assert choice.finish_reason == "length"
    assert completion.usage.model_dump(include={"prompt_tokens", "completion_tokens"}) == {
        "prompt_tokens": 3,
        "completion_tokens": 5,
    }
    assert completion.usage.total_tokens == 8


def test_chat_without_a_token_limit_stops_after_the_default_length(fast: Simulator) -> None:
    body = post_chat(fast).json()

    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == 16
    assert len(body["choices"][0]["message"]["content"].split()) == 16


def test_max_completion_tokens_is_honoured(fast: Simulator) -> None:
    body = post_chat(fast, max_completion_tokens=2).json()

    assert body["usage"]["completion_tokens"] == 2
    assert body["choices"][0]["finish_reason"] == "length"


def test_it_streams_one_token_per_chunk_and_ends_with_done(fast: Simulator) -> None:
    body = chat_body("stream me", max_tokens=4, stream=True, stream_options={"include_usage": True})
    with http.stream("POST", f"{fast.base_url}/chat/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        payloads = sse_payloads(response.iter_lines())

    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(payload) for payload in payloads[:-1]]
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    assert len({chunk["id"] for chunk in chunks}) == 1
    role, *tokens, finish, usage = chunks
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert len(tokens) == 4
    words = [token["choices"][0]["delta"]["content"] for token in tokens]
    assert all(len(word.split()) == 1 for word in words)
    assert all(word.startswith(" ") for word in words[1:])
    assert finish["choices"] == [
        {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
    ]
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}
    non_streamed = post_chat(fast, messages=body["messages"], max_tokens=4).json()
    assert "".join(words) == non_streamed["choices"][0]["message"]["content"]


def test_streams_carry_no_usage_chunk_unless_asked(fast: Simulator) -> None:
    body = chat_body(max_tokens=2, stream=True)
    with http.stream("POST", f"{fast.base_url}/chat/completions", json=body) as response:
        payloads = sse_payloads(response.iter_lines())

    chunks = [json.loads(payload) for payload in payloads[:-1]]
    assert len(chunks) == 4  # role, two tokens, finish
    assert all("usage" not in chunk for chunk in chunks)


def test_openai_sdk_streams_chat_with_usage(fast: Simulator) -> None:
    stream = sdk(fast).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)

    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(content.split()) == 3
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 3


def test_completions_answer_each_prompt_of_a_batch(fast: Simulator) -> None:
    completion = sdk(fast).completions.create(model=MODEL, prompt=["a b", "c d e"], max_tokens=3)

    assert completion.id.startswith("cmpl-")
    assert completion.object == "text_completion"
    assert [choice.index for choice in completion.choices] == [0, 1]
    assert all(len(choice.text.split()) == 3 for choice in completion.choices)
    assert all(choice.finish_reason == "length" for choice in completion.choices)
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (5, 6)


def test_streamed_completion_text_equals_the_non_streamed_text(fast: Simulator) -> None:
    client = sdk(fast)
    whole = client.completions.create(model=MODEL, prompt="once upon", max_tokens=6)
    pieces = [
        chunk.choices[0].text
        for chunk in client.completions.create(
            model=MODEL, prompt="once upon", max_tokens=6, stream=True
        )
    ]

    assert len(pieces) == 7  # six tokens and the finishing chunk
    assert "".join(pieces) == whole.choices[0].text


def test_output_depends_only_on_seed_and_prompt(fast: Simulator, paced: Simulator) -> None:
    def content(simulator: Simulator, prompt: str, seed: int) -> str:
        body = post_chat(simulator, messages=[{"role": "user", "content": prompt}], seed=seed)
        return body.json()["choices"][0]["message"]["content"]

    assert content(fast, "same prompt", 7) == content(fast, "same prompt", 7)
    assert content(fast, "same prompt", 7) == content(paced, "same prompt", 7)
    assert content(fast, "same prompt", 7) != content(fast, "same prompt", 8)
    assert content(fast, "same prompt", 7) != content(fast, "other prompt", 7)


def test_context_length_is_enforced(fast: Simulator) -> None:
    response = post_chat(fast, max_tokens=40_000)

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"


# -- embeddings --------------------------------------------------------------------------------


def test_embeddings_are_deterministic_unit_vectors(fast: Simulator) -> None:
    client = sdk(fast)  # the SDK asks for base64 and decodes it
    result = client.embeddings.create(model=MODEL, input=["alpha", "beta gamma"])
    again = client.embeddings.create(model=MODEL, input="alpha")
    as_floats = http.post(
        f"{fast.base_url}/embeddings", json={"model": MODEL, "input": "alpha"}
    ).json()

    assert [item.index for item in result.data] == [0, 1]
    alpha, beta = (item.embedding for item in result.data)
    assert len(alpha) == 64
    assert math.fsum(v * v for v in alpha) == pytest.approx(1.0, abs=1e-5)
    assert alpha == again.data[0].embedding
    assert alpha != beta
    assert as_floats["data"][0]["embedding"] == pytest.approx(alpha, abs=1e-6)
    assert result.usage.prompt_tokens == 3
    assert result.usage.total_tokens == 3


def test_embedding_dimensions_can_be_shortened(fast: Simulator) -> None:
    result = sdk(fast).embeddings.create(model=MODEL, input="alpha", dimensions=8)

    vector = result.data[0].embedding
    assert len(vector) == 8
    assert math.fsum(v * v for v in vector) == pytest.approx(1.0, abs=1e-5)


# -- errors ------------------------------------------------------------------------------------


def test_unknown_model_is_a_404_model_not_found(fast: Simulator) -> None:
    response = post_chat(fast, model="gpt-nope")

    assert response.status_code == 404
    assert response.json() == {
        "error": {
            "message": "The model `gpt-nope` does not exist or you do not have access to it.",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }
    with pytest.raises(openai.NotFoundError):
        sdk(fast).completions.create(model="gpt-nope", prompt="x")


def test_invalid_json_is_a_400(fast: Simulator) -> None:
    response = http.post(
        f"{fast.base_url}/chat/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("We could not parse the JSON body")
    assert (error["param"], error["code"]) == (None, None)


def test_missing_messages_is_a_400_naming_the_parameter(fast: Simulator) -> None:
    response = http.post(f"{fast.base_url}/chat/completions", json={"model": MODEL})

    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": "Missing required parameter: 'messages'.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "missing_required_parameter",
    }


def test_unknown_paths_answer_an_openai_404(fast: Simulator) -> None:
    response = http.get(f"{fast.base_url}/nothing")

    assert response.status_code == 404
    assert response.json()["error"]["message"] == "Invalid URL (GET /v1/nothing)"


# -- behaviour model ---------------------------------------------------------------------------


def test_streaming_is_paced_by_ttft_then_tpot(paced: Simulator) -> None:
    body = chat_body(f"pace {uuid.uuid4()}", max_tokens=5, stream=True)
    arrivals = []
    started = time.monotonic()
    with http.stream("POST", f"{paced.base_url}/chat/completions", json=body) as response:
        for line in response.iter_lines():
            if line.startswith('data: {"') and '"content":"' in line and '"role"' not in line:
                arrivals.append(time.monotonic() - started)

    assert len(arrivals) == 5
    assert TTFT_S * 0.9 <= arrivals[0] < TTFT_S + 0.1
    gaps = [later - earlier for earlier, later in zip(arrivals, arrivals[1:], strict=False)]
    assert all(TPOT_S * 0.5 <= gap < TPOT_S + 0.05 for gap in gaps), gaps


def test_requests_beyond_the_concurrency_limit_wait(paced: Simulator) -> None:
    # Two slots, five requests of 0.1 s + 39 x 0.02 s: three waves of 0.88 s. Two running and
    # three waiting lasts only while the first wave runs: with waves of 0.28 s, a CI run beside
    # other tests saw the five arrive too late to catch it.
    started = time.monotonic()
    with ThreadPoolExecutor(5) as pool:
        futures = [pool.submit(post_chat, paced, max_tokens=40) for _ in range(5)]
        wait_for(
            lambda: (
                (
                    metric(paced, "vllm:num_requests_running"),
                    metric(paced, "vllm:num_requests_waiting"),
                )
                == (2, 3)
            )
        )
        statuses = [future.result().status_code for future in futures]
    elapsed = time.monotonic() - started

    assert statuses == [200] * 5
    assert elapsed >= 3 * 0.88 * 0.9
    assert metric(paced, "vllm:num_requests_running") == 0
    assert metric(paced, "vllm:num_requests_waiting") == 0


def test_prefix_cache_hits_lower_ttft_and_are_counted(paced: Simulator) -> None:
    prompt = " ".join([str(uuid.uuid4())] + [f"w{i}" for i in range(63)])  # four 16-word blocks
    queries = metric(paced, "vllm:prefix_cache_queries_total")
    hits = metric(paced, "vllm:prefix_cache_hits_total")

    def first_token_latency() -> float:
        elapsed, response = timed(
            lambda: post_chat(paced, messages=[{"role": "user", "content": prompt}], max_tokens=1)
        )
        assert response.status_code == 200
        return elapsed

    cold = first_token_latency()
    warm = first_token_latency()

    assert cold >= TTFT_S * 0.9
    assert warm < TTFT_S * 0.6  # a full hit saves 80 % of the TTFT
    assert metric(paced, "vllm:prefix_cache_queries_total") - queries == 128
    assert metric(paced, "vllm:prefix_cache_hits_total") - hits == 64
    assert 0 < metric(paced, "vllm:gpu_cache_usage_perc") <= 1


@pytest.mark.parametrize("stream", [False, True])
def test_the_next_turn_finds_the_previous_answer_cached(fast: Simulator, stream: bool) -> None:
    question = " ".join([str(uuid.uuid4())] + [f"q{i}" for i in range(15)])  # one block
    first = [{"role": "user", "content": question}]
    response = post_chat(fast, messages=first, max_tokens=32, stream=stream)
    if stream:
        chunks = [json.loads(p) for p in sse_payloads(response.text.splitlines())[:-1]]
        content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    else:
        content = response.json()["choices"][0]["message"]["content"]
    answer = {"role": "assistant", "content": content}
    second = [*first, answer, {"role": "user", "content": "and then?"}]
    queries = metric(fast, "vllm:prefix_cache_queries_total")
    hits = metric(fast, "vllm:prefix_cache_hits_total")

    assert post_chat(fast, messages=second, max_tokens=1).status_code == 200

    # 16 question words and 32 answer words: three full blocks, all cached by the first turn.
    assert metric(fast, "vllm:prefix_cache_queries_total") - queries == 16 + 32 + 2
    assert metric(fast, "vllm:prefix_cache_hits_total") - hits == 48


# Alone: it asserts the freed slot answers within the first token's time plus 0.1 s.
@pytest.mark.serial
def test_a_client_disconnect_frees_its_slot(paced: Simulator) -> None:
    cancelled = paced.stats()["requests_cancelled"]
    body = chat_body(max_tokens=500, stream=True)  # ten seconds of tokens
    for _ in range(2):
        # Leaving the block after the first line abandons the stream and closes its connection.
        with http.stream("POST", f"{paced.base_url}/chat/completions", json=body) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("data: ")
            assert paced.stats()["requests_running"] == 1

    wait_for(lambda: paced.stats()["requests_running"] == 0, timeout=1)
    assert paced.stats()["requests_cancelled"] - cancelled == 2
    elapsed, response = timed(lambda: post_chat(paced, max_tokens=1))
    assert response.status_code == 200
    assert elapsed < TTFT_S + 0.1


def test_per_token_time_grows_with_the_share_of_busy_slots() -> None:
    engine = Engine(SimulatorConfig(tpot_ms=10, concurrency=4, slowdown=0.5))

    assert engine.token_interval() == pytest.approx(0.010)
    engine.running = 2
    assert engine.token_interval() == pytest.approx(0.0125)
    engine.running = 4
    assert engine.token_interval() == pytest.approx(0.015)


def test_prefix_cache_counts_only_hits_that_start_at_the_first_block() -> None:
    cache = PrefixCache(capacity_blocks=8, block_size=2)

    assert cache.admit(["a", "b", "c", "d", "e"]) == (0, 2)
    assert cache.admit(["a", "b", "c", "d", "x"]) == (2, 2)
    assert cache.admit(["a", "x", "c", "d"]) == (0, 2)  # same second block, different prefix
    assert (cache.queried_tokens, cache.hit_tokens) == (14, 4)


def test_prefix_cache_keeps_a_finished_sequence_without_counting_a_query() -> None:
    cache = PrefixCache(capacity_blocks=8, block_size=2)
    cache.keep(["a", "b", "c", "d", "e"])

    assert (cache.queried_tokens, cache.hit_tokens) == (0, 0)
    assert cache.admit(["a", "b", "c", "d", "x", "y"]) == (2, 3)


def test_prefix_cache_evicts_the_least_recently_used_block() -> None:
    cache = PrefixCache(capacity_blocks=2, block_size=1)
    for tokens in (["a"], ["b"], ["a"], ["c"]):  # "b" is the oldest when "c" arrives
        cache.admit(tokens)

    assert cache.usage == 1.0
    assert cache.admit(["a"]) == (1, 1)
    assert cache.admit(["b"]) == (0, 1)


def test_cold_start_delays_requests_and_idle_unload_repeats_it() -> None:
    with running_simulator(
        MODEL, ttft_ms=0, tpot_ms=0, cold_start_s=0.6, unload_after_idle_s=0.3
    ) as simulator:
        health = http.get(f"{simulator.root_url}/health")
        assert (health.status_code, health.json()) == (503, {"status": "loading"})
        first, response = timed(lambda: post_chat(simulator, max_tokens=1))
        assert response.status_code == 200
        assert first >= 0.45  # what was left of the 0.6 s load
        assert http.get(f"{simulator.root_url}/health").status_code == 200

        wait_for(lambda: simulator.stats()["model_state"] == "unloaded", timeout=1)
        assert http.get(f"{simulator.root_url}/health").status_code == 200
        assert http.get(f"{simulator.base_url}/models").json()["data"][0]["state"] == "cold"
        reloaded, response = timed(lambda: post_chat(simulator, max_tokens=1))

        assert response.status_code == 200
        assert reloaded >= 0.6
        assert simulator.stats()["loads"] == 2


# -- faults ------------------------------------------------------------------------------------


def test_error_rate_one_with_code_503_fails_every_request(faulty: Simulator) -> None:
    state = faulty.set_faults(error_rate=1.0, error_codes=[503])
    responses = [post_chat(faulty) for _ in range(3)]

    assert (state["error_rate"], state["error_codes"]) == (1.0, [503])
    assert [response.status_code for response in responses] == [503] * 3
    error = responses[0].json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "server_error",
        "service_unavailable",
        None,
    )
    with pytest.raises(openai.InternalServerError) as raised:
        sdk(faulty).chat.completions.create(model=MODEL, messages=chat_body()["messages"])
    assert raised.value.status_code == 503


def test_injected_errors_are_drawn_from_the_configured_codes(faulty: Simulator) -> None:
    faulty.set_faults(error_rate=1.0, error_codes=[429, 500])
    statuses = {post_chat(faulty).status_code for _ in range(20)}

    assert statuses == {429, 500}
    with pytest.raises((openai.RateLimitError, openai.InternalServerError)):
        sdk(faulty).embeddings.create(model=MODEL, input="x")


def test_hang_accepts_requests_and_never_answers(faulty: Simulator) -> None:
    faulty.set_faults(hang=True)

    with pytest.raises(httpx.ReadTimeout):
        post_chat(faulty, timeout=0.3)
    wait_for(lambda: faulty.stats()["requests_hanging"] == 0, timeout=1)


def test_cut_stream_after_ends_the_stream_without_done(faulty: Simulator) -> None:
    faulty.set_faults(cut_stream_after=3)
    body = chat_body(max_tokens=10, stream=True)
    lines: list[str] = []

    with (
        pytest.raises(httpx.RemoteProtocolError),
        http.stream("POST", f"{faulty.base_url}/chat/completions", json=body) as response,
    ):
        lines.extend(response.iter_lines())

    payloads = sse_payloads(lines)

    assert "[DONE]" not in payloads
    deltas = [json.loads(payload)["choices"][0]["delta"] for payload in payloads]
    assert [delta for delta in deltas if delta.get("content")] == deltas[1:]
    assert len(deltas[1:]) == 3


def test_stall_stream_after_sends_tokens_then_goes_silent_until_the_client_leaves(
    faulty: Simulator,
) -> None:
    faulty.set_faults(stall_stream_after=2)
    body = chat_body(max_tokens=10, stream=True)
    lines: list[str] = []

    with (
        pytest.raises(httpx.ReadTimeout),
        http.stream(
            "POST", f"{faulty.base_url}/chat/completions", json=body, timeout=0.5
        ) as response,
    ):
        for line in response.iter_lines():
            lines.append(line)

    deltas = [json.loads(payload)["choices"][0]["delta"] for payload in sse_payloads(lines)]
    assert len([delta for delta in deltas if delta.get("content")]) == 2
    wait_for(lambda: faulty.stats()["requests_hanging"] == 0, timeout=1)


def test_a_prompt_with_a_lone_surrogate_fails_with_500_as_engines_do(fast: Simulator) -> None:
    body = json.dumps(chat_body(content="broken \ud800 prompt"))

    response = http.post(
        f"{fast.base_url}/chat/completions",
        content=body,
        headers={"Content-Type": "application/json"},
    )

    assert response.status_code == 500
    assert response.json()["error"]["type"] == "server_error"


def test_fail_health_fails_only_the_health_check(faulty: Simulator) -> None:
    faulty.set_faults(fail_health=True)
    health = http.get(f"{faulty.root_url}/health")

    assert (health.status_code, health.json()) == (503, {"status": "unhealthy"})
    assert post_chat(faulty).status_code == 200


def test_refuse_connections_refuses_at_the_tcp_level(faulty: Simulator) -> None:
    faulty.set_faults(refuse_connections=True)

    with pytest.raises(httpx.ConnectError):
        http.get(f"{faulty.root_url}/health")
    faulty.clear_faults()  # by SIGUSR1, since HTTP cannot get through
    assert http.get(f"{faulty.root_url}/health").status_code == 200


def test_refuse_connections_for_some_seconds_recovers_by_itself(faulty: Simulator) -> None:
    faulty.set_faults(refuse_connections=0.3)

    with pytest.raises(httpx.ConnectError):
        http.get(f"{faulty.root_url}/health")

    def recovered() -> bool:
        try:
            return http.get(f"{faulty.root_url}/sim/faults").json()["refuse_connections"] is False
        except httpx.ConnectError:
            return False

    # It recovers by itself, once the 0.3 s are over.
    wait_until(recovered, timeout_s=5)


def test_slow_start_answers_503_until_it_elapses(faulty: Simulator) -> None:
    faulty.set_faults(slow_start_s=0.4)
    health = http.get(f"{faulty.root_url}/health")
    response = post_chat(faulty)

    assert (health.status_code, health.json()) == (503, {"status": "starting"})
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "service_unavailable"
    wait_until(lambda: http.get(f"{faulty.root_url}/health").status_code == 200, timeout_s=5)
    assert post_chat(faulty).status_code == 200


def test_fault_api_validates_reports_and_clears(faulty: Simulator) -> None:
    url = f"{faulty.root_url}/sim/faults"
    rejected = http.post(url, json={"error_rate": 2})
    faulty.set_faults(hang=True, cut_stream_after=1)
    cleared = http.delete(url).json()

    assert rejected.status_code == 400
    assert "error_rate" in rejected.json()["error"]["message"]
    assert http.post(url, json={"no_such_fault": 1}).status_code == 400
    assert cleared == {
        "error_rate": 0.0,
        "error_codes": [429, 500, 503],
        "hang": False,
        "cut_stream_after": None,
        "stall_stream_after": None,
        "fail_health": False,
        "refuse_connections": False,
        "slow_start_s": 0.0,
    }
    assert http.get(url).json() == cleared


def test_faults_can_be_set_from_the_command_line() -> None:
    simulator = start_simulator(
        MODEL, ttft_ms=0, refuse_connections=True, error_rate=1, error_codes=(429,)
    )
    try:
        with pytest.raises(httpx.ConnectError):
            post_chat(simulator)
        simulator.clear_faults()  # by SIGUSR1, which clears the error rate too
        assert post_chat(simulator).status_code == 200
    finally:
        simulator.stop()
    with running_simulator(MODEL, error_rate=1, error_codes=(429,), slow_start_s=0.3) as simulator:
        assert post_chat(simulator).status_code == 503
        wait_until(lambda: post_chat(simulator).status_code != 503, timeout_s=5)
        assert post_chat(simulator).status_code == 429


def test_it_requires_the_api_key_it_was_started_with() -> None:
    with running_simulator(ttft_ms=0, tpot_ms=0, api_key="sk-engine") as sim:
        body = {"model": "demo-8b", "messages": [{"role": "user", "content": "hi"}]}
        url = f"{sim.base_url}/chat/completions"

        without = LOOPBACK.post(url, json=body)
        wrong = LOOPBACK.post(url, json=body, headers={"Authorization": "Bearer sk-other"})
        right = LOOPBACK.post(url, json=body, headers={"Authorization": "Bearer sk-engine"})

    assert without.status_code == wrong.status_code == 401
    assert without.json()["error"]["code"] == "invalid_api_key"
    assert right.status_code == 200
