"""Live and History in a real Chromium against a real daphne gateway and simulator engines:
traffic moves the Live page without a reload, a drained target shows draining then drained, a
decision in the stream leads to its history entry with each attempt's factors, Replay compares."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from nexus.models import ApiToken
from pools import services
from pools.models import Target
from tests.nexus.factories import make_pool, make_target, make_user
from tests.support.browser import PASSWORD, arrive, committed, sign_in
from tests.support.live import LiveServer, running_nexus
from tests.support.ports import free_port
from tests.support.screenshots import screenshot
from tests.support.simulator import Simulator, running_simulators
from tests.support.traffic import chat_body, send

pytestmark = pytest.mark.e2e

# Streams of about 7.2 s on the slow engine, so that a drain finds some in flight: the page,
# which shows them, is up to a second behind, and the drain reaches the gateway and the page a
# second or two later; streams of 1.5 s, then of 3.6 s on a slower machine, had ended by then.
SLOW = {"ttft_ms": 50, "tpot_ms": 300, "concurrency": 4}
FAST = {"ttft_ms": 20, "tpot_ms": 10, "concurrency": 8}
STREAM_TOKENS = 24
# Background traffic: a few clients in a loop, bounded in requests and time.
CLIENTS = 6
MAX_REQUESTS = 3000
MAX_TRAFFIC_S = 120


class World:
    def __init__(self, nexus: LiveServer, secret: str, engines: dict[str, Simulator]) -> None:
        self.nexus = nexus
        self.secret = secret
        self.engines = engines


@pytest.fixture
def world(transactional_db: None, tmp_path: Path) -> Iterator[World]:
    make_user("operator", password=PASSWORD, staff=True)
    with running_simulators(fast=FAST, slow=SLOW, backup=FAST) as engines:
        # Least busy: the slow engine gets its share, so that a drain finds streams on it.
        chat = make_pool("chat", name="Chat models", strategy="least_busy")
        make_target(chat, "gpu-a", base_url=engines["fast"].base_url, model_id="demo-8b",
                    capacity_weight=8)  # fmt: skip
        make_target(chat, "gpu-b", base_url=engines["slow"].base_url, model_id="demo-8b",
                    capacity_weight=4, position=1)  # fmt: skip
        # A pool whose first tier cannot be reached: its requests are retried on the second.
        fallback = make_pool("fallback", name="Fallback")
        make_target(fallback, "unreachable", base_url=f"http://127.0.0.1:{free_port()}/v1",
                    model_id="demo-8b")  # fmt: skip
        make_target(fallback, "backup", base_url=engines["backup"].base_url, model_id="demo-8b",
                    priority=2, position=1)  # fmt: skip
        _, secret = ApiToken.issue("load-generator")
        with running_nexus(tmp_path) as nexus:
            yield World(nexus, secret, engines)


def background_traffic(world: World, stop: threading.Event) -> list[threading.Thread]:
    """Start CLIENTS loops of streamed chat requests to the chat pool until `stop` (bounded)."""
    url = f"{world.nexus.url}/v1/chat/completions"
    sent = iter(range(MAX_REQUESTS))
    lock = threading.Lock()
    until = time.monotonic() + MAX_TRAFFIC_S

    def loop() -> None:
        while not stop.is_set() and time.monotonic() < until:
            with lock:
                if next(sent, None) is None:
                    return
            body = chat_body("chat", stream=True, max_tokens=STREAM_TOKENS)
            send(url, world.secret, body, timeout_s=30)

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    return threads


def test_a_retried_decision_in_the_stream_leads_to_its_attempts_and_replay(
    world: World, page: Page
) -> None:
    answer = send(f"{world.nexus.url}/v1/chat/completions", world.secret, chat_body("fallback"))
    assert (answer.status, answer.attempts) == (200, 2)

    sign_in(page, world.nexus, "/live/", username="operator")
    expect(page.locator("[data-live-status]")).to_have_text("Live")
    row = page.locator(f'#live-decisions tr[data-request-id="{answer.request_id}"]')
    expect(row).to_contain_text("retry after 1 failed", timeout=10_000)
    screenshot(page, "live-overview")
    # A press that a push lands in still clicks: the push waits for the release (without that,
    # the button went down on one link and came up on its replacement, and nothing happened).
    page.evaluate(
        """() => document.addEventListener("htmx:oobBeforeSwap", (event) => {
            if (event.detail.target.id === "live-now") window.pushesSeen += 1;
        })"""
    )
    row.get_by_role("link").hover()
    page.mouse.down()
    page.evaluate("window.pushesSeen = 0")  # a push from here on lands in the press
    page.wait_for_function("window.pushesSeen > 0")
    page.mouse.up()

    arrive(page, f"{world.nexus.url}/history/{answer.request_id}/")
    first, second = page.locator("#attempt-1"), page.locator("#attempt-2")
    expect(first).to_contain_text("Attempt 1: unreachable")
    expect(
        first.locator('tr[data-candidate="unreachable"] [data-factor="utilization"]')
    ).to_be_visible()
    expect(second).to_contain_text("Attempt 2: backup")
    expect(
        second.locator('tr[data-candidate="backup"] [data-factor="utilization"]')
    ).to_be_visible()
    expect(second).to_contain_text("unreachable: already tried")
    screenshot(page, "history-detail-retried")

    page.get_by_role("link", name="Replay").click()
    replay = page.locator("#replay")
    expect(replay.locator(".replay-then")).to_contain_text("unreachable")
    expect(replay.locator(".replay-now")).to_contain_text("Now")
    expect(replay).to_contain_text("Replay against today's configuration")
    replay.scroll_into_view_if_needed()
    screenshot(page, "history-detail-replay")

    page.goto(f"{world.nexus.url}/history/")
    expect(page.locator(f'tr[data-request-id="{answer.request_id}"]')).to_contain_text("backup")
    screenshot(page, "history-list")


def test_traffic_moves_the_live_page_and_a_drained_target_shows_draining_then_drained(
    world: World, page: Page
) -> None:
    sign_in(page, world.nexus, "/live/chat/", username="operator")
    expect(page.locator("[data-live-status]")).to_have_text("Live")
    page.evaluate("window.loadedOnce = true")
    chart_before = page.locator("#live-requests-data").get_attribute("data-chart-data")
    stop = threading.Event()
    threads = background_traffic(world, stop)
    try:
        # Numbers and charts change without a reload.
        expect(page.locator('[data-figure="requests"]')).not_to_have_text("0 req/s", timeout=20_000)
        expect(page.locator('[data-figure="gateways"]')).to_have_text("1")
        expect(page.locator('[data-figure="ttft-p50"]')).not_to_have_text("—")
        page.wait_for_function(
            "before => document.querySelector('#live-requests-data').dataset.chartData !== before",
            arg=chart_before,
        )
        columns = json.loads(
            page.locator("#live-requests-data").get_attribute("data-chart-data") or ""
        )
        assert any(value for value in columns["columns"][1])
        expect(page.locator("#live-decisions tbody tr").first).to_be_visible()
        screenshot(page, "live-pool-traffic")

        # The slow target has streams in flight when it is drained: draining, then drained.
        slow = page.locator('#live-targets tr[data-target="gpu-b"]')
        expect(slow).not_to_contain_text("0 of 4", timeout=10_000)
        committed(lambda: services.drain_target(Target.objects.get(name="gpu-b")))
        expect(slow.locator(".badge")).to_have_attribute("data-state", "draining", timeout=5_000)
        screenshot(page, "live-pool-draining")
        expect(slow.locator(".badge")).to_have_attribute("data-state", "drained", timeout=15_000)
        expect(slow).to_contain_text("0 of 4")
        screenshot(page, "live-pool-drained")
        assert page.evaluate("window.loadedOnce") is True
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=35)
