"""A pool's page in a real Chromium against a real daphne gateway: it shows drained, ejected and
node-offline targets as such within about 2 s, and a target drained under traffic reaches
drained once its requests finish."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.utils import timezone
from playwright.sync_api import Page, expect

from nexus.models import ApiToken
from nodes.models import Node, NodeStatus
from pools.models import Target, TargetState
from tests.deployments.factories import make_node
from tests.nexus.factories import make_pool, make_target, make_user
from tests.support.browser import PASSWORD, committed, sign_in
from tests.support.live import LiveServer, running_nexus
from tests.support.ports import free_port
from tests.support.screenshots import screenshot
from tests.support.simulator import Simulator, running_simulator
from tests.support.traffic import chat_body, send
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

# A database change shows at the page's next tick (1 s). An ejection first waits for the
# gateway's next publication (1 s), then for the tick: 2 s, plus rendering on a busy machine.
WITHIN_A_TICK_MS = 2_000
WITHIN_A_PUBLICATION_AND_A_TICK_MS = 2_500


@dataclass
class World:
    nexus: LiveServer
    engine: Simulator
    token: str
    targets: dict[str, int]

    def row(self, page: Page, name: str) -> Any:
        return page.locator(f"#live-target-{self.targets[name]} td.status")

    def chat(self, **body: Any) -> Any:
        url = f"{self.nexus.url}/v1/chat/completions"
        return send(url, self.token, chat_body("tour", **body))


@pytest.fixture
def world(transactional_db: None, tmp_path: Path) -> Iterator[World]:
    prefix = f"test-pool-page-{uuid.uuid4().hex[:12]}"
    make_user("operator", password=PASSWORD, staff=True)
    with running_simulator(model="demo-8b", ttft_ms=0, tpot_ms=100, concurrency=8) as engine:
        # Ejection uncapped, so that the dead target's circuit stays open (docs/reliability.md).
        pool = make_pool("tour", name="Tour", strategy="priority", max_ejection_percent=100)
        dead = make_target(
            pool, "dead", base_url=f"http://127.0.0.1:{free_port()}/v1", model_id="demo-8b"
        )
        busy = make_target(
            pool, "busy", base_url=engine.base_url, model_id="demo-8b", priority=2,
            capacity_weight=8,
        )  # fmt: skip
        spare = make_target(pool, "spare", base_url=engine.base_url, model_id="demo-8b", priority=3)
        node = make_node("gpu-1")
        edge = Target.objects.create(
            pool=pool, name="edge", node=node, model_id="demo-8b", priority=3
        )
        _, token = ApiToken.issue("pool page")
        targets = {"dead": dead.pk, "busy": busy.pk, "spare": spare.pk, "edge": edge.pk}
        try:
            with running_nexus(tmp_path, NEXUS_REDIS_PREFIX=prefix) as nexus:
                yield World(nexus, engine, token, targets)
        finally:
            client = redis.Redis.from_url(settings.REDIS_URL)
            keys = list(client.scan_iter(f"{prefix}:*"))
            if keys:
                client.delete(*keys)
            client.close()


# Timed: in the serial pass, where no parallel test takes the CPU the page's tick needs.
@pytest.mark.serial
def test_drained_ejected_and_offline_targets_show_as_such_within_two_seconds(
    world: World, page: Page
) -> None:
    sign_in(page, world.nexus, "/pools/tour/", username="operator")
    expect(page.locator("[data-live-status]")).to_have_text("Live")
    for name in ("dead", "busy", "spare", "edge"):
        expect(world.row(page, name)).to_have_text("✓ Active")

    # A target drained elsewhere (the API, another operator) reads drained.
    committed(lambda: Target.objects.filter(pk=world.targets["spare"]).update(
        state=TargetState.DRAINED, state_changed_at=timezone.now()
    ))  # fmt: skip
    expect(world.row(page, "spare")).to_have_text("○ Drained", timeout=WITHIN_A_TICK_MS)

    # A node that stops answering takes its target out, with the reason.
    committed(lambda: Node.objects.filter(name="gpu-1").update(
        status=NodeStatus.OFFLINE, status_changed_at=timezone.now(),
        last_error="connection refused",
    ))  # fmt: skip
    expect(world.row(page, "edge")).to_contain_text("Node offline (since", timeout=WITHIN_A_TICK_MS)
    expect(world.row(page, "edge")).to_contain_text("connection refused")

    # Three requests fail on the dead target (each answered by the next tier): it is ejected.
    answers = [world.chat() for _ in range(3)]
    assert [(answer.status, answer.target) for answer in answers] == [(200, "busy")] * 3
    expect(world.row(page, "dead")).to_contain_text(
        "Ejected (trial in", timeout=WITHIN_A_PUBLICATION_AND_A_TICK_MS
    )
    expect(world.row(page, "dead")).to_contain_text("3 consecutive failures")
    expect(world.row(page, "busy")).to_have_text("✓ Active")
    screenshot(page, "pools-detail-states")


@pytest.mark.serial
def test_a_target_drained_under_traffic_reaches_drained_when_its_requests_end(
    world: World, page: Page
) -> None:
    sign_in(page, world.nexus, "/pools/tour/", username="operator")
    expect(page.locator("[data-live-status]")).to_have_text("Live")
    # Given two long streams on busy (the dead target refuses them first),
    with ThreadPoolExecutor(max_workers=2) as executor:
        started = [threading.Event(), threading.Event()]
        streams = [
            executor.submit(
                send,
                f"{world.nexus.url}/v1/chat/completions",
                world.token,
                chat_body("tour", max_tokens=40, stream=True),
                started=event,
            )
            for event in started
        ]
        wait_until(lambda: all(event.is_set() for event in started), timeout_s=5)
        busy = page.locator(f"#live-target-{world.targets['busy']}")
        expect(busy.locator("td.num").first).to_have_text("2 / 8", timeout=WITHIN_A_TICK_MS * 2)

        # when the operator drains it,
        busy.get_by_role("button", name="Drain busy").click()

        # then it drains with its two requests in flight, and is drained once they end.
        expect(page.locator("#toasts")).to_contain_text("busy is draining")
        expect(world.row(page, "busy")).to_have_text(
            "◐ Draining (2 in flight)", timeout=WITHIN_A_TICK_MS
        )
        screenshot(page, "pools-detail-draining")
        answers = [stream.result() for stream in streams]
    began = time.monotonic()
    expect(world.row(page, "busy")).to_have_text("○ Drained", timeout=WITHIN_A_TICK_MS * 2)
    assert time.monotonic() - began < 4
    assert [(answer.status, answer.done) for answer in answers] == [(200, True)] * 2
    assert committed(lambda: Target.objects.get(pk=world.targets["busy"]).state) == "drained"
