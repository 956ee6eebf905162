"""The gateway's hot path: no database query per request once its snapshot is loaded."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db.backends.base.base import BaseDatabaseWrapper

from nexus import upstream
from nexus.models import ApiToken
from nexus.scopes import TokenKind
from pools.gateway.app import Gateway
from pools.gateway.history import HistoryShipper
from pools.gateway.registry import TOKEN_LOOKUPS_PER_S, Registry
from pools.gateway.state import GatewayState
from pools.models import Pool, Target
from tests.support import asgi
from tests.support.simulator import Simulator, running_simulator


@pytest.fixture(scope="module")
def engine() -> Iterator[Simulator]:
    with running_simulator(model="demo-8b", ttft_ms=0, tpot_ms=0) as sim:
        yield sim


async def call(app: Gateway, path: str, body: dict[str, Any], token: str) -> list[dict]:
    """Drive the ASGI app as a server would and return what it sent."""
    raw = json.dumps(body).encode()
    headers = [
        (b"authorization", f"Bearer {token}".encode()),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(raw)).encode()),
    ]
    return await asgi.call(app, asgi.http_scope("POST", path, headers), raw)


class CursorCount:
    """Count the database cursors opened while it is on (each query opens one)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.opened: list[str] = []
        real_cursor = BaseDatabaseWrapper.cursor

        def counting_cursor(wrapper: BaseDatabaseWrapper) -> Any:
            self.opened.append(wrapper.alias)
            return real_cursor(wrapper)

        monkeypatch.setattr(BaseDatabaseWrapper, "cursor", counting_cursor)


def hot_pool(engine: Simulator) -> str:
    """Create the pool `hot` on the engine and return a client token's secret for it."""
    pool = Pool.objects.create(name="Hot", slug="hot")
    Target.objects.create(pool=pool, name="a", base_url=engine.base_url, model_id="demo-8b")
    return ApiToken.issue("hot")[1]


def counted_gateway(registry: Registry) -> Gateway:
    """Return a gateway whose cursors a test counts. History is shipped in batches in the
    background, off the request path: its timed flush is put off, since on a loaded machine it
    lands among the counted requests."""
    return Gateway(
        registry, GatewayState(history=HistoryShipper(ship_interval_s=3600, batch_size=1000))
    )


BODY = {"model": "@pool/hot", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.mark.django_db(transaction=True)
async def test_a_token_issued_after_the_snapshot_works_on_its_first_request(
    engine: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a warm gateway whose snapshot will not refresh during the test,
    token = await sync_to_async(hot_pool)(engine)
    registry = Registry(refresh_interval_s=3600)
    app = counted_gateway(registry)
    await call(app, "/v1/chat/completions", BODY, token)

    # when a token is issued and used at once, then used again,
    _, fresh = await sync_to_async(ApiToken.issue)("fresh")
    first = await call(app, "/v1/chat/completions", BODY, fresh)
    cursors = CursorCount(monkeypatch)
    again = await call(app, "/v1/chat/completions", BODY, fresh)
    monkeypatch.undo()
    await registry.aclose()
    await upstream.close()

    # then both calls are served, the second from memory.
    assert (first[0]["status"], again[0]["status"]) == (200, 200)
    assert cursors.opened == []


@pytest.mark.django_db(transaction=True)
async def test_unknown_tokens_reach_the_database_a_bounded_number_of_times(
    engine: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a warm gateway,
    token = await sync_to_async(hot_pool)(engine)
    registry = Registry(refresh_interval_s=3600)
    app = counted_gateway(registry)
    await call(app, "/v1/chat/completions", BODY, token)
    cursors = CursorCount(monkeypatch)

    # when one made-up token comes 30 times, and 100 different ones at once,
    repeated = [await call(app, "/v1/chat/completions", BODY, "nx-made-up") for _ in range(30)]
    lookups_for_one = len(cursors.opened)
    flood = await asyncio.gather(
        *(call(app, "/v1/chat/completions", BODY, f"nx-made-up-{n}") for n in range(100))
    )
    lookups_for_flood = len(cursors.opened) - lookups_for_one
    monkeypatch.undo()
    await registry.aclose()
    await upstream.close()

    # then every one is refused, the repeated one after a single lookup, and the flood after
    # at most a second's budget of lookups (two seconds' if it straddles a second).
    assert {sent[0]["status"] for sent in [*repeated, *flood]} == {401}
    assert lookups_for_one == 1
    assert TOKEN_LOOKUPS_PER_S - 1 <= lookups_for_flood <= 2 * TOKEN_LOOKUPS_PER_S


@pytest.mark.django_db(transaction=True)
async def test_it_answers_without_a_database_query_once_warm(
    engine: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    def configure() -> str:
        pool = Pool.objects.create(name="Hot", slug="hot")
        Target.objects.create(pool=pool, name="a", base_url=engine.base_url, model_id="demo-8b")
        return ApiToken.issue("hot")[1]

    token = await sync_to_async(configure)()
    registry = Registry(refresh_interval_s=3600)
    app = counted_gateway(registry)
    body = {"model": "@pool/hot", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    await call(app, "/v1/chat/completions", body, token)  # loads the snapshot

    cursors: list[str] = []
    real_cursor = BaseDatabaseWrapper.cursor

    def counting_cursor(self: BaseDatabaseWrapper) -> Any:
        cursors.append(self.alias)
        return real_cursor(self)

    monkeypatch.setattr(BaseDatabaseWrapper, "cursor", counting_cursor)
    statuses = []
    for _ in range(20):
        sent = await call(app, "/v1/chat/completions", body, token)
        statuses.append(sent[0]["status"])
    monkeypatch.undo()
    await registry.aclose()
    await upstream.close()

    assert statuses == [200] * 20
    assert cursors == []


@pytest.mark.django_db(transaction=True)
async def test_an_admin_token_is_refused_inference_saying_why(engine: Simulator) -> None:
    # Given a pool and an admin token,
    await sync_to_async(hot_pool)(engine)
    _, admin = await sync_to_async(ApiToken.issue)("automation", kind=TokenKind.ADMIN)
    registry = Registry(refresh_interval_s=3600)
    app = Gateway(registry)

    # when it is sent to /v1,
    sent = await call(app, "/v1/chat/completions", BODY, admin)
    await registry.aclose()
    await upstream.close()

    # then it is refused with an OpenAI-shaped error that names the kind of token to use.
    assert sent[0]["status"] == 403
    error = json.loads(sent[1]["body"])["error"]
    assert (error["code"], error["type"]) == ("admin_token_not_allowed", "permission_error")
    assert "/v1 and /serve take a client token" in error["message"]


@pytest.mark.django_db(transaction=True)
async def test_requests_that_wait_for_the_first_snapshot_all_resume_in_the_same_loop_turn() -> None:
    # Given 200 requests arriving together at a process that has no snapshot yet
    registry = Registry(refresh_interval_s=3600)
    turn = 0
    resumed_at: list[int] = []

    async def count_turns() -> None:
        nonlocal turn
        while True:
            await asyncio.sleep(0)
            turn += 1

    async def request() -> None:
        await registry.ready()
        resumed_at.append(turn)

    ticker = asyncio.create_task(count_turns())
    try:
        # When the snapshot has loaded
        await asyncio.gather(*(request() for _ in range(200)))
    finally:
        ticker.cancel()
        await registry.aclose()

    # Then they all went on at once: none waited for the others to be handed the snapshot
    # one per loop turn (under load, each turn is long: a burst waited for seconds).
    assert len(resumed_at) == 200
    assert max(resumed_at) - min(resumed_at) <= 1
