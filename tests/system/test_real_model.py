"""A real model end to end (issue 19, done-when 2): the llama.cpp runtime serving SmolLM2-135M
with two replicas on a real agent, placed and started by the real reconciler under a real Celery
beat, answering chats through a real daphne's `@pool/<service>` and `/serve/<service>/` to the
official `openai` SDK, streamed and not; and a pool mixing the llama.cpp model with a simulator
in Equivalent generation mode balances between them.

Marked `llama`: `make test` (and so CI) runs it; `-m "not llama"` leaves it out locally.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from openai import APIStatusError, OpenAI
from rest_framework.test import APIClient

from nexus.models import ApiToken
from nodes.models import Node, NodeModel
from nodes.services import refresh_node
from pools.models import Pool
from serving import folders
from serving.models import ModelFolder, Route, RouteState, Service, models_root
from tests.nexus.factories import make_user
from tests.nodes.fleet import trusted_node
from tests.support.agent import RunningAgent, running_agent, start_managed_simulator
from tests.support.live import LiveServer, running_nexus
from tests.support.real_model import require_real_model
from tests.support.waiting import wait_until
from tests.support.worker import RunningWorker, running_worker

pytestmark = pytest.mark.llama

SERVICE = "smol-chat"
NODE = "local-llama"
TICK_S = 0.5
# The runtime's own first probe is due 5 + 10 s after the start; loading takes a few seconds.
READY_TIMEOUT_S = 120.0
QUESTION = [{"role": "user", "content": "Say hello in five words."}]


@dataclass
class Stack:
    nexus: LiveServer
    worker: RunningWorker
    agent: RunningAgent
    owner: APIClient
    token: str

    def why(self) -> str:
        routes = "\n".join(
            f"  route {r.pk} {r.state} on {r.node and r.node.name} {r.status_message!r} "
            f"{r.errors[-1:]}"
            for r in Route.objects.filter(service__name=SERVICE).order_by("pk")
        )
        service = Service.objects.filter(name=SERVICE).first()
        status = service.status_message if service else "(no service)"
        return f"{status}\n{routes}\n--- worker\n{self.worker.log()[-3000:]}"

    def ready(self, count: int) -> bool:
        healthy = Route.objects.filter(
            service__name=SERVICE, state=RouteState.HEALTHY, target__isnull=False
        )
        return healthy.count() == count

    def client(self, base_url: str) -> OpenAI:
        # No retries of its own: a failed request must be seen failing.
        return OpenAI(base_url=base_url, api_key=self.token, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def stack(committed_db, django_db_blocker, tmp_path_factory) -> Iterator[Stack]:
    """Start Nexus, a worker with beat and an agent; declare the llama.cpp service via the API."""
    gguf = require_real_model()
    tmp_path = tmp_path_factory.mktemp("real-model")
    suffix = uuid.uuid4().hex[:8]
    folder_name = f"smollm2-{suffix}"
    with ExitStack() as stack:
        with django_db_blocker.unblock():
            user = make_user(f"owner-{suffix}", staff=True)
            owner = APIClient()
            owner.force_login(user)
        stack.callback(_remove_rows, django_db_blocker, user.pk, folder_name)
        models_root().mkdir(parents=True, exist_ok=True)
        agent = stack.enter_context(
            running_agent(tmp_path, name=NODE, args=["--allow-dir", str(models_root())])
        )
        with django_db_blocker.unblock():
            trusted_node(NODE, agent)
        nexus = stack.enter_context(running_nexus(tmp_path, NEXUS_LEDGER="memory"))
        worker = stack.enter_context(
            running_worker(tmp_path, beat=True, NEXUS_SERVING_TICK_S=str(TICK_S))
        )
        with django_db_blocker.unblock():
            created = owner.post("/api/v1/model-folders/", {"name": folder_name}, format="json")
            assert created.status_code == 201, created.content
            folder = ModelFolder.objects.get(name=folder_name)
            _put_model(gguf, folder.path / gguf.name)
            declared = owner.post(
                "/api/v1/services/",
                {
                    "name": SERVICE,
                    "model_folder": folder_name,
                    "runtime_variant": "llama-cpp",
                    "desired_replicas": 2,
                    "environ": {"BACKEND_MODEL_NAME": "smollm2"},
                },
                format="json",
            )
            assert declared.status_code == 201, declared.content
            expires_at = (timezone.now() + timedelta(hours=1)).isoformat()
            token = owner.post(
                f"/api/v1/services/{SERVICE}/tokens/",
                {"name": "real-model client", "expires_at": expires_at},
                format="json",
            )
            assert token.status_code == 201, token.content
        world = Stack(nexus, worker, agent, owner, token.json()["token"])
        with django_db_blocker.unblock():
            wait_until(lambda: world.ready(2), timeout_s=READY_TIMEOUT_S, what=world.why)
        yield world


def _put_model(source: Path, destination: Path) -> None:
    """Put the model file into the folder: a hard link (the file is 98 MB) where one can be."""
    try:
        os.link(source, destination)
    except OSError:
        shutil.copyfile(source, destination)


def _remove_rows(blocker: Any, user_id: int, folder_name: str) -> None:
    with blocker.unblock():
        Service.objects.filter(name=SERVICE).delete()
        Pool.objects.filter(slug__in=[SERVICE, "mixed-smol"]).delete()
        ApiToken.objects.filter(name="mixed client").delete()
        Node.objects.filter(name=NODE).delete()
        for folder in ModelFolder.objects.filter(name=folder_name):
            folders.delete_folder(folder)
        ApiToken.objects.filter(created_by_id=user_id).delete()
        User.objects.filter(pk=user_id).delete()


@pytest.fixture(autouse=True)
def database(django_db_blocker: Any) -> Iterator[None]:
    with django_db_blocker.unblock():
        yield


def _chat_both_ways(client: OpenAI, model: str) -> tuple[Any, str, list[str | None]]:
    completion = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=24)
    chunks = list(
        client.chat.completions.create(model=model, messages=QUESTION, max_tokens=24, stream=True)
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [choice.finish_reason for chunk in chunks for choice in chunk.choices]
    return completion, streamed, finishes


def test_two_llama_cpp_replicas_become_ready_on_the_local_agent(stack: Stack) -> None:
    service = Service.objects.get(name=SERVICE)
    routes = list(Route.objects.filter(service=service, state=RouteState.HEALTHY))
    spec = service.latest_revision.spec

    assert len(routes) == 2
    assert {route.node.name for route in routes} == {NODE}
    assert spec["argv"][:4] == ["${NEXUS_PYTHON}", "-m", "llama_cpp.server", "--model"]
    assert spec["argv"][4] == "/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert (spec["health_check"]["path"], spec["capacity"]) == ("/openapi.json", 1)


def test_the_model_answers_through_the_pool_streamed_and_not(stack: Stack) -> None:
    client = stack.client(f"{stack.nexus.url}/v1")

    started = time.monotonic()
    completion, streamed, finishes = _chat_both_ways(client, f"@pool/{SERVICE}")
    took = time.monotonic() - started

    text = completion.choices[0].message.content or ""
    assert completion.model == "smollm2"
    assert text.strip(), completion
    assert streamed.strip(), finishes
    assert finishes[-1] in ("stop", "length")
    assert took < 60


def test_the_model_answers_through_serve_streamed_and_not(stack: Stack) -> None:
    client = stack.client(f"{stack.nexus.url}/serve/{SERVICE}/v1")

    completion, streamed, finishes = _chat_both_ways(client, "smollm2")

    assert (completion.choices[0].message.content or "").strip(), completion
    assert streamed.strip(), finishes
    assert completion.usage is not None and completion.usage.completion_tokens > 0


def test_a_pool_mixing_llama_cpp_and_the_simulator_balances_between_them(stack: Stack) -> None:
    # Given the llama.cpp replicas' model and a simulator on the same node, both in its inventory
    start_managed_simulator(stack.agent, "sim-smol", "--ttft-ms", "0", "--tpot-ms", "1")
    node = Node.objects.get(name=NODE)

    def inventory() -> set[str]:
        refresh_node(node)
        return set(NodeModel.objects.filter(node=node).values_list("model_id", flat=True))

    wait_until(lambda: {"smollm2", "sim-smol"} <= inventory(), timeout_s=20)
    # And a pool of Equivalent generation over both: different models, answers alike in kind
    created = stack.owner.post(
        "/api/v1/pools/",
        {
            "slug": "mixed-smol",
            "name": "mixed-smol",
            "compatibility_mode": "equivalent_generation",
            "strategy": "round_robin",
        },
        format="json",
    )
    assert created.status_code == 201, created.content
    for name, model in (("llama", "smollm2"), ("sim", "sim-smol")):
        target = stack.owner.post(
            "/api/v1/targets/",
            {"pool": "mixed-smol", "name": name, "node": NODE, "model_id": model,
             "capacity_weight": 1},
            format="json",
        )  # fmt: skip
        assert target.status_code == 201, target.content
    # (the token last: a gateway snapshot that knows it was read after both targets were saved;
    # with the token first, a snapshot read between the two targets once served llama alone)
    _, secret = ApiToken.issue("mixed client", pools=["mixed-smol"])
    client = OpenAI(base_url=f"{stack.nexus.url}/v1", api_key=secret, max_retries=0, timeout=60)

    def ask() -> tuple[str, str]:
        raw = client.chat.completions.with_raw_response.create(
            model="@pool/mixed-smol", messages=QUESTION, max_tokens=8
        )
        return raw.headers["x-nexus-target"], raw.parse().choices[0].message.content or ""

    # The gateway reads the new pool with its next snapshot (about a second).
    wait_until(lambda: _answers(ask), timeout_s=10)

    # When chats go to the pool
    answers = [ask() for _ in range(6)]

    # Then both kinds of engine answered, each with text
    assert {target for target, _ in answers} == {"llama", "sim"}
    assert all(text.strip() for _, text in answers), answers


def _answers(ask: Any) -> bool:
    try:
        ask()
    except APIStatusError as error:
        # Until the gateway's next snapshot has the pool and the token.
        assert error.status_code in (401, 404, 503), error
        return False
    return True
