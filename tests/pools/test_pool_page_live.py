"""A pool page's socket sends its live card on connect and again every second, for those who may
see the pool; a change shows within the next tick."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from pools.models import Target, TargetState, TrafficRun, TrafficRunKind
from tests.nexus.factories import make_pool, make_target
from tests.support.sockets import refusal, signed_in_socket

pytestmark = pytest.mark.django_db(transaction=True)


async def test_an_outsider_and_an_unknown_pool_are_refused() -> None:
    await sync_to_async(make_pool)("chat")

    assert await refusal("/ws/pools/chat/") == (False, 1000)
    assert await refusal("/ws/pools/nope/", "operator", staff=True) == (False, 1000)


async def test_the_live_card_comes_on_connect_and_a_drain_shows_within_a_tick() -> None:
    pool = await sync_to_async(make_pool)("chat")
    target = await sync_to_async(make_target)(pool, "gpu-a")
    socket = await signed_in_socket("/ws/pools/chat/", "operator", staff=True)
    try:
        first = await socket.receive_from(timeout=5)
        assert first.lstrip().startswith('<section class="card" id="pool-live" hx-swap-oob="true">')
        assert 'data-state="active"' in first
        # Staff may drain: the buttons come with the card.
        assert f"/pools/chat/targets/{target.pk}/drain/" in first

        await Target.objects.filter(pk=target.pk).aupdate(state=TargetState.DRAINED)
        tick = await socket.receive_from(timeout=3)

        assert 'data-state="drained"' in tick
        assert f"/pools/chat/targets/{target.pk}/resume/" in tick
    finally:
        await socket.disconnect()


async def test_a_traffic_runs_socket_sends_its_card_and_refuses_outsiders() -> None:
    pool = await sync_to_async(make_pool)("chat")
    run = await TrafficRun.objects.acreate(
        pool=pool, kind=TrafficRunKind.TRY,
        params={"requests": 5, "concurrency": 1, "kind": "chat", "stream": False,
                "max_tokens": 1},
    )  # fmt: skip
    assert await refusal(f"/ws/pools/chat/runs/{run.pk}/") == (False, 1000)
    assert await refusal(f"/ws/pools/chat/runs/{run.pk + 1}/", "staff-a", staff=True) == (
        False, 1000,
    )  # fmt: skip

    socket = await signed_in_socket(f"/ws/pools/chat/runs/{run.pk}/", "operator", staff=True)
    try:
        first = await socket.receive_from(timeout=5)
        assert 'id="run-live" data-status="queued" hx-swap-oob="true"' in first
        assert "Waiting for a worker to start it." in first

        phase = {"name": "traffic", "planned": 5, "sent": 2, "ok": 2, "failed": 0,
                 "by_target": {"a": 2}, "ttft_ms": [12.0, 14.0]}  # fmt: skip
        await TrafficRun.objects.filter(pk=run.pk).aupdate(status="running", phases=[phase])
        tick = await socket.receive_from(timeout=3)

        assert 'data-status="running"' in tick
        assert '<span data-fact="sent">2</span> of 5' in tick
        assert "100 % · 2" in tick
    finally:
        await socket.disconnect()
