"""Inference through the agent's `/v1`: the official OpenAI SDK to real simulator runtimes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.agent import RunningAgent, running_agent, start_managed_simulator
from tests.support.simulator import Simulator, running_simulator
from tests.support.waiting import wait_until

MESSAGES = [{"role": "user", "content": "tell me about the fleet"}]
http = httpx.Client(timeout=10)


def teardown_module() -> None:
    http.close()


class Fleet:
    """One agent with managed simulators (fast and paced) and a watched one."""

    def __init__(self, agent: RunningAgent, watched: Simulator) -> None:
        self.agent = agent
        self.watched = watched
        self.fast = start_managed_simulator(agent, "fast", "--ttft-ms", "0", "--tpot-ms", "0")
        self.paced = start_managed_simulator(
            agent, "paced", "--ttft-ms", "0", "--tpot-ms", "100", "--concurrency", "4"
        )

    def sdk(self, api_key: str | None = None) -> openai.OpenAI:
        """Return an OpenAI client whose base URL is the agent's /v1."""
        return openai.OpenAI(
            base_url=f"{self.agent.url}/v1",
            api_key=api_key or self.agent.credential,
            max_retries=0,
            timeout=30,
        )

    def direct(self, process: dict[str, Any]) -> openai.OpenAI:
        """Return an OpenAI client that talks to a managed runtime itself, not via the agent."""
        return openai.OpenAI(
            base_url=f"http://127.0.0.1:{process['port']}/v1", api_key="-", max_retries=0
        )

    def stats(self, process: dict[str, Any]) -> dict[str, Any]:
        return http.get(f"http://127.0.0.1:{process['port']}/sim/stats").json()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp_path = tmp_path_factory.mktemp("forwarding")
    with (
        running_simulator("watched", ttft_ms=0, tpot_ms=0) as watched,
        running_agent(tmp_path, args=["--watch", watched.base_url]) as agent,
    ):
        yield Fleet(agent, watched)


# -- the OpenAI SDK through the agent ----------------------------------------------------------


def test_a_chat_completion_through_the_agent_is_the_runtimes_own(fleet: Fleet) -> None:
    via_agent = fleet.sdk().chat.completions.create(
        model="fast", messages=MESSAGES, max_tokens=8, seed=7
    )
    direct = fleet.direct(fleet.fast).chat.completions.create(
        model="fast", messages=MESSAGES, max_tokens=8, seed=7
    )

    assert via_agent.model == "fast"
    assert via_agent.choices[0].message.content == direct.choices[0].message.content
    assert via_agent.usage.completion_tokens == 8


def test_a_streamed_chat_arrives_as_the_same_tokens_in_chunks(fleet: Fleet) -> None:
    stream = fleet.sdk().chat.completions.create(
        model="fast", messages=MESSAGES, max_tokens=8, seed=7, stream=True
    )
    chunks = list(stream)
    whole = fleet.sdk().chat.completions.create(
        model="fast", messages=MESSAGES, max_tokens=8, seed=7
    )

    content = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert content == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"
    assert len(chunks) >= 9  # the role chunk and one per token at least


def test_completions_and_embeddings_are_forwarded_by_path(fleet: Fleet) -> None:
    completion = fleet.sdk().completions.create(model="fast", prompt="one two", max_tokens=3)
    embeddings = fleet.sdk().embeddings.create(model="fast", input=["a", "b"])

    assert completion.object == "text_completion"
    assert completion.usage.completion_tokens == 3
    assert [item.index for item in embeddings.data] == [0, 1]


def test_a_watched_runtimes_model_is_served_through_the_agent(fleet: Fleet) -> None:
    before = fleet.watched.stats()["requests_completed"]

    completion = fleet.sdk().chat.completions.create(
        model="watched", messages=MESSAGES, max_tokens=2
    )

    assert completion.model == "watched"
    assert fleet.watched.stats()["requests_completed"] == before + 1


def test_the_node_lists_its_models_in_openai_shape(fleet: Fleet) -> None:
    models = fleet.sdk().models.list().data
    raw = http.get(f"{fleet.agent.url}/v1/models", headers=fleet.agent.headers()).json()

    assert sorted(model.id for model in models) == ["fast", "paced", "watched"]
    assert {model.owned_by for model in models} == {"simulator"}
    assert raw["object"] == "list"
    assert {entry["object"] for entry in raw["data"]} == {"model"}


# -- streaming behaviour -----------------------------------------------------------------------


def test_stream_chunks_are_relayed_as_they_are_generated(fleet: Fleet) -> None:
    # 10 tokens at 100 ms each: a buffering relay would deliver everything at the end.
    arrivals = []
    stream = fleet.sdk().chat.completions.create(
        model="paced", messages=MESSAGES, max_tokens=10, stream=True
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.monotonic())

    assert len(arrivals) == 10
    assert arrivals[-1] - arrivals[0] >= 0.6


def test_a_caller_that_disconnects_cancels_the_runtimes_request(fleet: Fleet) -> None:
    before = fleet.stats(fleet.paced)["requests_cancelled"]
    body = {"model": "paced", "messages": MESSAGES, "max_tokens": 200, "stream": True}

    with http.stream(
        "POST", f"{fleet.agent.url}/v1/chat/completions", headers=fleet.agent.headers(), json=body
    ) as response:
        first = next(response.iter_lines())
    # Leaving the block closed the connection after one line of a 20-second stream.

    wait_until(
        lambda: fleet.stats(fleet.paced)["requests_cancelled"] == before + 1,
        timeout_s=10,
        what="the runtime to see the request cancelled",
    )
    assert first.startswith("data: ")
    assert fleet.stats(fleet.paced)["requests_running"] == 0


def test_the_runtimes_content_type_and_sse_framing_pass_through(fleet: Fleet) -> None:
    body = {"model": "fast", "messages": MESSAGES, "max_tokens": 2, "stream": True}

    response = http.post(
        f"{fleet.agent.url}/v1/chat/completions", headers=fleet.agent.headers(), json=body
    )

    assert response.headers["Content-Type"].startswith("text/event-stream")
    events = [line for line in response.text.split("\n\n") if line]
    assert events[-1] == "data: [DONE]"
    assert all(event.startswith("data: ") for event in events)
    assert json.loads(events[0].removeprefix("data: "))["object"] == "chat.completion.chunk"


# -- refusals and failures ---------------------------------------------------------------------


def test_a_model_the_node_does_not_serve_is_not_found(fleet: Fleet) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        fleet.sdk().chat.completions.create(model="elsewhere", messages=MESSAGES)

    assert raised.value.code == "model_not_found"


def test_a_body_without_a_model_names_the_field(fleet: Fleet) -> None:
    response = http.post(
        f"{fleet.agent.url}/v1/chat/completions",
        headers=fleet.agent.headers(),
        json={"messages": MESSAGES},
    )

    assert response.status_code == 400
    assert response.json()["error"]["message"] == "model: required"


def test_the_sdk_with_a_wrong_key_is_refused(fleet: Fleet) -> None:
    with pytest.raises(openai.AuthenticationError) as raised:
        fleet.sdk(api_key="not-the-credential").chat.completions.create(
            model="fast", messages=MESSAGES
        )

    assert raised.value.code == "invalid_credential"


def test_the_callers_credential_never_reaches_the_runtime(fleet: Fleet) -> None:
    # This runtime demands the very credential the caller presents to the agent: it must not
    # get it, so it refuses.
    guarded = start_managed_simulator(
        fleet.agent, "guarded", "--api-key", fleet.agent.credential, "--ttft-ms", "0"
    )
    try:
        with pytest.raises(openai.AuthenticationError) as raised:
            fleet.sdk().chat.completions.create(model="guarded", messages=MESSAGES)
    finally:
        stop(fleet.agent, guarded)

    assert raised.value.code == "invalid_api_key"  # the runtime's refusal, relayed


def test_a_runtime_error_is_relayed_unchanged(fleet: Fleet) -> None:
    failing = start_managed_simulator(
        fleet.agent, "failing", "--error-rate", "1", "--error-codes", "503"
    )
    try:
        response = http.post(
            f"{fleet.agent.url}/v1/chat/completions",
            headers=fleet.agent.headers(),
            json={"model": "failing", "messages": MESSAGES},
        )
    finally:
        stop(fleet.agent, failing)

    assert response.status_code == 503
    assert response.json()["error"]["code"] == "service_unavailable"
    assert "X-Nexus-Not-Delivered" not in response.headers  # the runtime's answer


def test_a_runtime_refusing_connections_is_a_502(fleet: Fleet) -> None:
    refusing = start_managed_simulator(fleet.agent, "refusing", "--refuse-connections")
    try:
        with pytest.raises(openai.APIStatusError) as raised:
            fleet.sdk().chat.completions.create(model="refusing", messages=MESSAGES)
    finally:
        stop(fleet.agent, refusing)

    assert raised.value.status_code == 502
    assert raised.value.code == "runtime_unavailable"
    assert raised.value.response.headers["X-Nexus-Not-Delivered"] == "1"


def test_a_runtime_that_does_not_answer_in_time_is_a_504(tmp_path: Path) -> None:
    with running_agent(tmp_path, env={"NEXUS_AGENT_UPSTREAM_TIMEOUT_S": "1"}) as agent:
        start_managed_simulator(agent, "hanging", "--hang")
        started = time.monotonic()
        response = http.post(
            f"{agent.url}/v1/chat/completions",
            headers=agent.headers(),
            json={"model": "hanging", "messages": MESSAGES},
        )
        took = time.monotonic() - started

    assert response.status_code == 504
    assert response.json()["error"]["code"] == "runtime_unavailable"
    assert "X-Nexus-Not-Delivered" not in response.headers  # it may be generating
    assert 0.9 <= took < 5


def stop(agent: RunningAgent, process: dict[str, Any]) -> None:
    http.delete(
        f"{agent.url}/agent/v1/processes/{process['id']}",
        headers=agent.headers(),
        params={"grace": 2},
    )
