"""Try traffic and a failure drill from the pool's pages in a real Chromium, run by a real Celery
worker through a real daphne gateway to real engines: the distribution shows live, and the
drill ends with its verdict, kept on the pool page."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings
from playwright.sync_api import Page, expect

from nexus.models import ApiToken
from tests.nexus.factories import make_pool, make_target, make_user
from tests.support.browser import PASSWORD, committed, follow, sign_in
from tests.support.live import LiveServer, running_nexus
from tests.support.screenshots import screenshot
from tests.support.simulator import running_simulators
from tests.support.worker import running_worker

pytestmark = pytest.mark.e2e


@pytest.fixture
def nexus(transactional_db: None, tmp_path: Path) -> Iterator[LiveServer]:
    # A prefix of this test's own: its tasks go to its own worker, never to another test's.
    prefix = f"test-traffic-{uuid.uuid4().hex[:12]}"
    make_user("operator", password=PASSWORD, staff=True)
    with running_simulators(
        fast={"model": "demo-8b", "ttft_ms": 5, "tpot_ms": 2, "concurrency": 8},
        slow={"model": "demo-8b", "ttft_ms": 30, "tpot_ms": 5, "concurrency": 4},
    ) as engines:
        pool = make_pool("traffic", name="Traffic", strategy="round_robin")
        for name, engine in engines.items():
            make_target(pool, name, base_url=engine.base_url, model_id="demo-8b",
                        capacity_weight=engine_concurrency(name))  # fmt: skip
        try:
            with (
                running_nexus(tmp_path, NEXUS_REDIS_PREFIX=prefix) as server,
                running_worker(
                    tmp_path, NEXUS_REDIS_PREFIX=prefix, NEXUS_CONTROLLER_URL=server.url
                ),
            ):
                yield server
        finally:
            client = redis.Redis.from_url(settings.REDIS_URL)
            keys = list(client.scan_iter(f"{prefix}*"))
            if keys:
                client.delete(*keys)
            client.close()


def engine_concurrency(name: str) -> int:
    return {"fast": 8, "slow": 4}[name]


def test_try_traffic_shows_the_distribution_and_a_drill_its_verdict(
    nexus: LiveServer, page: Page
) -> None:
    sign_in(page, nexus, "/pools/traffic/", username="operator")

    follow(page, page.get_by_role("link", name="Try traffic"))
    expect(page.locator(".warning")).to_contain_text("This makes real inference calls")
    page.get_by_label("Requests").fill("20")
    page.get_by_label("Concurrency").fill("4")
    page.get_by_role("button", name="Send the requests").click()

    card = page.locator("#run-live")
    expect(card).to_have_attribute("data-status", "succeeded", timeout=30_000)
    phase = card.locator('[data-phase="traffic"]')
    expect(phase.locator('[data-fact="sent"]')).to_have_text("20")
    expect(phase.locator('[data-fact="ok"]')).to_have_text("20")
    # Round robin spreads them about evenly; every one of the 20 is counted on a target.
    expect(phase.locator(".bar-label")).to_have_text(["fast", "slow"])
    shares = phase.locator(".bar-value").all_text_contents()
    assert sum(int(text.rpartition("· ")[2]) for text in shares) == 20, shares
    screenshot(page, "pools-try-traffic")
    assert committed(lambda: ApiToken.objects.get(name__startswith="Try traffic").revoked_at)

    follow(page, page.get_by_role("link", name="Traffic"))
    follow(page, page.get_by_role("link", name="Failure drill"))
    page.get_by_label("Target").select_option(label="fast")
    page.get_by_label("Requests per phase").fill("12")
    page.get_by_role("button", name="Start the drill").click()

    expect(page.locator("#run-live")).to_have_attribute("data-status", "succeeded", timeout=60_000)
    expect(page.locator("#drill-verdict")).to_have_text(
        re.compile(
            r"Verdict: avoided: 0 of 12 requests went to fast while draining; "
            r"recovered: \d+ % share after resume \(before: \d+ %\)"
        )
    )
    drain = page.locator('[data-phase="drain"]')
    expect(drain.locator(".bar-label")).to_have_text(["slow"])
    screenshot(page, "pools-drill-verdict")

    follow(page, page.get_by_role("link", name="Traffic"))
    expect(page.locator("#drills")).to_contain_text("avoided: 0 of 12 requests went to fast")
    expect(page.locator("#pool-live tr[data-target='fast'] td.status")).to_have_text("✓ Active")
