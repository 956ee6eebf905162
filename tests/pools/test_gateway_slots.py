"""Every slot the gateway takes on a target is given back, however the request ends."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings

from nexus import upstream
from nexus.models import ApiToken
from pools.balancer.retry import RetryBudget
from pools.gateway.app import Gateway
from pools.gateway.ledger import LoadLedger, MemoryLedger, RedisLedger
from pools.gateway.state import GatewayState
from pools.models import Pool, Target
from tests.support import asgi
from tests.support.ports import free_port
from tests.support.simulator import Simulator, running_simulator
from tests.support.waiting import eventually


@pytest.fixture(scope="module")
def engine() -> Iterator[Simulator]:
    with running_simulator(model="demo-8b", ttft_ms=0, tpot_ms=20) as sim:
        yield sim


class Client:
    """Drive the ASGI app as a server would; `leave()` makes the client disconnect."""

    def __init__(self, body: dict[str, Any], token: str, *, hang_up: bool = False) -> None:
        raw = json.dumps(body).encode()
        headers = [
            (b"authorization", f"Bearer {token}".encode()),
            (b"content-type", b"application/json"),
        ]
        self.scope = asgi.http_scope("POST", "/v1/chat/completions", headers)
        self.incoming: asyncio.Queue[dict] = asyncio.Queue()
        self.incoming.put_nowait({"type": "http.request", "body": raw, "more_body": False})
        self.sent: list[dict] = []
        self.first_body = asyncio.Event()
        self.hang_up = hang_up  # close the connection as soon as the answer is complete

    async def receive(self) -> dict:
        return await self.incoming.get()

    async def send(self, message: dict) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            self.first_body.set()
        if self.hang_up and message["type"] == "http.response.body" and not message["more_body"]:
            self.leave()

    def leave(self) -> None:
        self.incoming.put_nowait({"type": "http.disconnect"})


def redis_ledger() -> RedisLedger:
    return RedisLedger(settings.REDIS_URL, prefix=f"test-slots-{uuid.uuid4().hex}")


@pytest.mark.parametrize("make_ledger", [MemoryLedger, redis_ledger], ids=["memory", "redis"])
@pytest.mark.django_db(transaction=True)
async def test_no_slot_leaks_when_clients_leave_targets_fail_or_answer(
    engine: Simulator, make_ledger: Callable[[], LoadLedger]
) -> None:
    def configure() -> tuple[str, int, int]:
        pool = Pool.objects.create(name="Slots", slug="slots", strategy="round_robin")
        live = Target.objects.create(
            pool=pool, name="live", base_url=engine.base_url, model_id="demo-8b"
        )
        dead = Target.objects.create(
            pool=pool, name="dead", base_url=f"http://127.0.0.1:{free_port()}/v1",
            model_id="demo-8b",
        )  # fmt: skip
        return ApiToken.issue("slots")[1], live.pk, dead.pk

    token, live, dead = await sync_to_async(configure)()
    ledger = make_ledger()
    # Every request whose first target is the dead one retries at once: let them all.
    state = GatewayState(ledger=ledger, budget=RetryBudget(minimum=10))
    app = Gateway(state=state)
    body = {"model": "@pool/slots", "messages": [{"role": "user", "content": "hi"}]}

    # Streams the client abandons after the first chunk, plain answers (half of them hang up the
    # moment their answer is complete, as clients do), and requests whose first target refuses
    # the connection (retried on the other): all at once.
    leaving = [Client({**body, "stream": True, "max_tokens": 50}, token) for _ in range(4)]
    staying = [Client({**body, "max_tokens": 3}, token, hang_up=i % 2 == 0) for i in range(6)]
    calls = [asyncio.create_task(app(c.scope, c.receive, c.send)) for c in [*leaving, *staying]]
    await asyncio.wait_for(asyncio.gather(*(c.first_body.wait() for c in leaving)), 10)
    for client in leaving:
        client.leave()
    await asyncio.wait_for(asyncio.gather(*calls), 10)

    async def none_held() -> bool:
        await ledger.refresh([live, dead])
        return (ledger.in_flight(live), ledger.in_flight(dead)) == (0, 0)

    # Releases shielded from a hang-up finish in the background: wait for them, not a while.
    released = False
    with contextlib.suppress(TimeoutError):  # then the assertion below says so, after cleanup
        released = await eventually(none_held, timeout_s=5)
    await app.aclose()
    await upstream.close()

    assert [c.sent[0]["status"] for c in staying] == [200] * 6
    assert released
    assert engine.stats()["requests_running"] == 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("make_ledger", [MemoryLedger, redis_ledger], ids=["memory", "redis"])
@pytest.mark.django_db(transaction=True)
async def test_the_slot_is_free_before_the_client_hears_the_answer_end(
    engine: Simulator, make_ledger: Callable[[], LoadLedger], stream: bool
) -> None:
    """A client that sends its next request the moment an answer ends finds the slot free."""

    def configure() -> tuple[str, int]:
        pool = Pool.objects.create(name="Free", slug="free-at-end")
        target = Target.objects.create(
            pool=pool, name="only", base_url=engine.base_url, model_id="demo-8b"
        )
        return ApiToken.issue("free at end")[1], target.pk

    token, target = await sync_to_async(configure)()
    ledger = make_ledger()
    app = Gateway(state=GatewayState(ledger=ledger))
    body = {"model": "@pool/free-at-end", "messages": [{"role": "user", "content": "hi"}]}
    client = Client({**body, "max_tokens": 3, "stream": stream}, token)
    held_at_end: list[int] = []
    send = client.send

    async def send_then_answer(message: dict) -> None:
        await send(message)
        if message["type"] == "http.response.body" and not message["more_body"]:
            # The client's next request reaches the gateway a loop turn later at the soonest.
            await asyncio.sleep(0)
            held_at_end.append(ledger.in_flight(target))

    await asyncio.wait_for(app(client.scope, client.receive, send_then_answer), 10)
    await app.aclose()
    await upstream.close()

    assert client.sent[0]["status"] == 200
    assert held_at_end == [0]
