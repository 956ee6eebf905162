"""The gateway, end to end: the official openai SDK -> a live daphne Nexus -> simulator engines."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import httpx
import openai
import pytest
from django.db import transaction
from django.utils import timezone

from nexus.models import ApiToken
from pools.models import Pool, Target
from tests.support.http import LOOPBACK
from tests.support.live import LiveServer, running_nexus
from tests.support.ports import free_port
from tests.support.simulator import Simulator, running_simulator
from tests.support.waiting import wait_until


@dataclass
class World:
    """What the tests in this module call: a live Nexus, its engines and client tokens."""

    nexus: LiveServer
    fast: Simulator
    slow: Simulator
    flaky: Simulator
    locked: Simulator
    token: str
    scoped_token: str
    expired_token: str
    revoked_token: str

    @property
    def v1(self) -> str:
        return f"{self.nexus.url}/v1"

    def sdk(self, token: str | None = None) -> openai.OpenAI:
        # The SDK retries 5xx and 429 by itself; the tests want to see each answer.
        return openai.OpenAI(base_url=self.v1, api_key=token or self.token, max_retries=0)

    def post(self, path: str, body: object, token: str | None = None) -> httpx.Response:
        return LOOPBACK.post(
            f"{self.v1}{path}",
            json=body,
            headers={"Authorization": f"Bearer {token or self.token}"},
            timeout=10,
        )


def _target(pool: Pool, name: str, sim: Simulator, **fields: object) -> Target:
    return Target.objects.create(
        pool=pool, name=name, base_url=sim.base_url, model_id=sim.model, **fields
    )


@pytest.fixture(scope="module")
def world(committed_db, django_db_blocker, tmp_path_factory) -> Iterator[World]:
    with (
        running_simulator(model="demo-8b", ttft_ms=0, tpot_ms=1) as fast,
        running_simulator(model="demo-8b", ttft_ms=0, tpot_ms=40) as slow,
        running_simulator(model="demo-8b", ttft_ms=0, tpot_ms=1) as flaky,
        running_simulator(model="demo-8b", ttft_ms=0, tpot_ms=0, api_key="sk-engine") as locked,
    ):
        with django_db_blocker.unblock():
            demo = Pool.objects.create(name="Demo", slug="demo", strategy="round_robin")
            _target(demo, "fast-a", fast)
            _target(demo, "fast-b", fast, kinds=["chat", "completions"])
            other = Pool.objects.create(name="Other", slug="other")
            _target(other, "other-a", fast)
            Pool.objects.create(name="Empty", slug="empty")
            slow_pool = Pool.objects.create(name="Slow", slug="slow")
            _target(slow_pool, "slow", slow)
            flaky_pool = Pool.objects.create(name="Flaky", slug="flaky")
            _target(flaky_pool, "flaky", flaky)
            keyed = Pool.objects.create(name="Keyed", slug="keyed")
            keyed_target = Target(
                pool=keyed, name="locked", base_url=locked.base_url, model_id="demo-8b"
            )
            keyed_target.set_credential("sk-engine")
            keyed_target.save()
            dead = Pool.objects.create(name="Dead", slug="dead")
            Target.objects.create(
                pool=dead, name="gone", base_url=f"http://127.0.0.1:{free_port()}/v1",
                model_id="demo-8b",
            )  # fmt: skip
            _, token = ApiToken.issue("everything")
            _, scoped = ApiToken.issue("demo only", pools=["demo"])
            _, expired = ApiToken.issue("old", expires_at=timezone.now() - timedelta(days=1))
            revoked_row, revoked = ApiToken.issue("revoked")
            revoked_row.revoke()
        tmp = tmp_path_factory.mktemp("gateway")
        try:
            with running_nexus(tmp) as nexus:
                yield World(nexus, fast, slow, flaky, locked, token, scoped, expired, revoked)
        finally:
            with django_db_blocker.unblock():
                Pool.objects.all().delete()
                ApiToken.objects.all().delete()


def test_it_answers_a_chat_completion_from_a_pool_through_the_openai_sdk(world: World) -> None:
    raw = world.sdk().chat.completions.with_raw_response.create(
        model="@pool/demo", messages=[{"role": "user", "content": "Hello there"}], max_tokens=5
    )
    completion = raw.parse()

    assert completion.object == "chat.completion"
    assert completion.model == "demo-8b"
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.completion_tokens == 5
    assert len(raw.headers["x-nexus-request-id"]) == 32
    assert raw.headers["x-nexus-target"] in {"fast-a", "fast-b"}


def test_it_relays_a_stream_chunk_by_chunk_as_the_engine_produces_it(world: World) -> None:
    arrivals: list[float] = []
    text: list[str] = []
    stream = world.sdk().chat.completions.create(
        model="@pool/slow",
        messages=[{"role": "user", "content": "Count for me"}],
        max_tokens=8,
        stream=True,
    )
    for chunk in stream:
        arrivals.append(time.monotonic())
        if chunk.choices and chunk.choices[0].delta.content:
            text.append(chunk.choices[0].delta.content)

    assert len(text) == 8
    # The engine spends 40 ms per token: relayed as produced, the chunks arrive spread out;
    # buffered, they would arrive together at the end.
    assert arrivals[-1] - arrivals[0] >= 0.2


def test_it_relays_the_usage_chunk_when_the_client_asks_for_it(world: World) -> None:
    chunks = list(
        world.sdk().chat.completions.create(
            model="@pool/demo",
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )

    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


def test_it_answers_completions_and_embeddings(world: World) -> None:
    client = world.sdk()

    completion = client.completions.create(model="@pool/demo", prompt="Once upon", max_tokens=4)
    embedding = client.embeddings.create(model="@pool/demo", input=["alpha", "beta"])

    assert completion.choices[0].text
    assert [item.index for item in embedding.data] == [0, 1]
    assert len(embedding.data[0].embedding) > 0


def test_it_sends_embeddings_only_to_targets_that_serve_them(world: World) -> None:
    targets = {
        world.post("/embeddings", {"model": "@pool/demo", "input": "x"}).headers["x-nexus-target"]
        for _ in range(4)
    }

    assert targets == {"fast-a"}


def test_it_takes_turns_between_the_targets_of_a_round_robin_pool(world: World) -> None:
    body = {"model": "@pool/demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}

    targets = [world.post("/chat/completions", body).headers["x-nexus-target"] for _ in range(4)]

    assert sorted(targets) == ["fast-a", "fast-a", "fast-b", "fast-b"]


def test_it_lists_the_pools_each_token_may_use(world: World) -> None:
    everything = [model.id for model in world.sdk().models.list()]
    scoped = [model.id for model in world.sdk(world.scoped_token).models.list()]

    assert everything == [
        "@pool/dead", "@pool/demo", "@pool/empty", "@pool/flaky", "@pool/keyed", "@pool/other",
        "@pool/slow",
    ]  # fmt: skip
    assert scoped == ["@pool/demo"]


def test_it_replaces_the_client_token_with_the_target_credential(world: World) -> None:
    # The engine accepts only its own key: the answer proves the key was sent in place of
    # the client's token, which the engine would refuse.
    answer = world.sdk().chat.completions.create(
        model="@pool/keyed", messages=[{"role": "user", "content": "x"}], max_tokens=1
    )

    assert answer.choices[0].message.content
    assert world.locked.stats()["requests_total"] == 1


def _error(exc: openai.APIStatusError) -> dict[str, object]:
    return exc.response.json()["error"]


def test_it_refuses_a_request_without_a_token(world: World) -> None:
    response = LOOPBACK.post(f"{world.v1}/chat/completions", json={"model": "@pool/demo"})

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(
    ("which", "code"),
    [("nx-not-a-real-token", "invalid_api_key"), ("expired", "token_expired"),
     ("revoked", "invalid_api_key")],
)  # fmt: skip
def test_it_refuses_unknown_expired_and_revoked_tokens(world: World, which: str, code: str) -> None:
    token = {"expired": world.expired_token, "revoked": world.revoked_token}.get(which, which)

    with pytest.raises(openai.AuthenticationError) as caught:
        world.sdk(token).chat.completions.create(
            model="@pool/demo", messages=[{"role": "user", "content": "hi"}]
        )

    assert caught.value.status_code == 401
    assert _error(caught.value)["code"] == code


def test_it_refuses_a_pool_outside_the_token_scope(world: World) -> None:
    with pytest.raises(openai.PermissionDeniedError) as caught:
        world.sdk(world.scoped_token).chat.completions.create(
            model="@pool/other", messages=[{"role": "user", "content": "hi"}]
        )

    assert _error(caught.value) == {
        "message": "This client token may not use '@pool/other'.",
        "type": "permission_error",
        "param": "model",
        "code": "pool_not_allowed",
    }


@pytest.mark.parametrize("model", ["@pool/nope", "demo-8b", "gpt-4o"])
def test_it_answers_model_not_found_for_anything_but_a_known_pool(world: World, model: str) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        world.sdk().chat.completions.create(
            model=model, messages=[{"role": "user", "content": "x"}]
        )

    assert _error(caught.value)["code"] == "model_not_found"
    assert _error(caught.value)["param"] == "model"


def test_it_rejects_a_body_that_is_not_json(world: World) -> None:
    response = LOOPBACK.post(
        f"{world.v1}/chat/completions",
        content=b'{"model": "@pool/demo", ',
        headers={"Authorization": f"Bearer {world.token}", "Content-Type": "application/json"},
    )

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"


def test_it_rejects_a_request_without_a_model(world: World) -> None:
    response = world.post("/chat/completions", {"messages": [{"role": "user", "content": "x"}]})

    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": "The request has no 'model': send '@pool/<slug>'.",
        "type": "invalid_request_error",
        "param": "model",
        "code": "missing_model",
    }


def test_it_rejects_a_body_over_the_limit_with_413(world: World) -> None:
    huge = "x" * (16 * 1024 * 1024 + 1)

    response = world.post("/chat/completions", {"model": "@pool/demo", "prompt": huge})

    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_it_answers_503_when_a_pool_has_no_target_for_the_request(world: World) -> None:
    with pytest.raises(openai.InternalServerError) as caught:
        world.sdk().chat.completions.create(
            model="@pool/empty", messages=[{"role": "user", "content": "x"}]
        )

    assert caught.value.status_code == 503
    assert _error(caught.value)["code"] == "no_target_available"


def test_it_answers_502_when_the_target_cannot_be_reached(world: World) -> None:
    response = world.post(
        "/chat/completions", {"model": "@pool/dead", "messages": [{"role": "user", "content": "x"}]}
    )

    assert response.status_code == 502
    assert response.json()["error"]["code"] == "target_unreachable"
    assert "x-nexus-request-id" in response.headers


def test_it_relays_an_engine_error_in_the_openai_shape(world: World) -> None:
    world.flaky.set_faults(error_rate=1.0, error_codes=[503])
    try:
        with pytest.raises(openai.InternalServerError) as caught:
            world.sdk().chat.completions.create(
                model="@pool/flaky", messages=[{"role": "user", "content": "x"}]
            )
    finally:
        world.flaky.clear_faults()

    assert caught.value.status_code == 503
    assert set(_error(caught.value)) == {"message", "type", "param", "code"}


def test_it_ends_a_stream_that_breaks_off_with_an_error_event_not_done(world: World) -> None:
    world.flaky.set_faults(cut_stream_after=3)
    try:
        with LOOPBACK.stream(
            "POST",
            f"{world.v1}/chat/completions",
            json={
                "model": "@pool/flaky",
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 20,
                "stream": True,
            },
            headers={"Authorization": f"Bearer {world.token}"},
            timeout=10,
        ) as response:
            events = [line for line in response.iter_lines() if line.startswith("data: ")]
    finally:
        world.flaky.clear_faults()

    assert response.status_code == 200
    assert "data: [DONE]" not in events
    assert json.loads(events[-1][len("data: ") :])["error"]["code"] == "stream_interrupted"


def test_it_cancels_the_upstream_request_when_the_client_disconnects(world: World) -> None:
    request = json.dumps(
        {
            "model": "@pool/slow",
            "messages": [{"role": "user", "content": "a long answer please"}],
            "max_tokens": 200,
            "stream": True,
        }
    ).encode()
    with socket.create_connection(("127.0.0.1", world.nexus.port), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Authorization: Bearer " + world.token.encode() + b"\r\n"
            b"Content-Type: application/json\r\n"
            b"Content-Length: " + str(len(request)).encode() + b"\r\n\r\n" + request
        )
        assert b"200" in sock.recv(4096).split(b"\r\n", 1)[0]
        wait_until(lambda: world.slow.stats()["requests_running"] == 1, timeout_s=5)

    # 200 tokens at 40 ms would keep the engine busy for 8 s; the disconnect frees it at once.
    wait_until(lambda: world.slow.stats()["requests_running"] == 0, timeout_s=2)


def test_it_picks_up_a_new_pool_without_a_restart(world: World, django_db_blocker) -> None:
    # One commit, as the admin API makes them: a snapshot taken between two commits would hold
    # the pool without its target (and answer 503 until the next one).
    with django_db_blocker.unblock(), transaction.atomic():
        pool = Pool.objects.create(name="Late", slug="late")
        _target(pool, "late-a", world.fast)

    wait_until(
        lambda: "@pool/late" in [model.id for model in world.sdk().models.list()], timeout_s=5
    )
    answer = world.sdk().chat.completions.create(
        model="@pool/late", messages=[{"role": "user", "content": "x"}], max_tokens=1
    )

    assert answer.choices[0].message.content
