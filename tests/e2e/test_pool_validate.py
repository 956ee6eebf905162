"""Validate in a real Chromium against a real engine: a target set above its engine's
--concurrency is warned; an Exact-replicas pool whose identity cannot be proven is confirmed
explicitly, and who confirmed which targets shows on the pool page."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from pools.models import IdentityConfirmation
from tests.nexus.factories import make_pool, make_target, make_user
from tests.support.browser import PASSWORD, committed, follow, sign_in
from tests.support.live import LiveServer, running_nexus
from tests.support.screenshots import screenshot
from tests.support.simulator import running_simulator

pytestmark = pytest.mark.e2e


@pytest.fixture
def nexus(transactional_db: None, tmp_path: Path) -> Iterator[LiveServer]:
    make_user("operator", password=PASSWORD, staff=True)
    with running_simulator(model="demo-8b", ttft_ms=0, tpot_ms=0, concurrency=4) as engine:
        pool = make_pool("check", name="Checked", compatibility_mode="exact_replicas")
        make_target(pool, "small", base_url=engine.base_url, model_id="demo-8b", capacity_weight=8)
        make_target(
            pool, "provider", base_url=engine.base_url, model_id="demo-8b", credential="sk-p"
        )
        with running_nexus(tmp_path) as server:
            yield server


def test_validate_warns_of_capacity_and_asks_to_confirm_the_identity(
    nexus: LiveServer, page: Page
) -> None:
    sign_in(page, nexus, "/pools/check/", username="operator")
    follow(page, page.get_by_role("link", name="Validate"))
    page.get_by_role("button", name="Validate").click()

    small = page.locator('ul[data-target="small"]')
    expect(small.locator('[data-check="capacity"]')).to_contain_text(
        "Capacity 8 is above the 4 its engine runs at once (the simulator's --concurrency): "
        "requests beyond 4 would wait inside the runtime where Nexus cannot move them."
    )
    expect(small.locator('[data-check="capacity"]')).to_have_attribute("data-severity", "warn")
    identity = page.locator('#validate-report > ul.checks [data-check="identity"]')
    expect(identity).to_contain_text("No content digest for small, provider")
    screenshot(page, "pools-validate-warnings")

    page.get_by_role("button", name="Confirm these 2 targets serve one model").click()

    expect(page.locator("#toasts")).to_contain_text("Confirmed: the 2 targets of Checked")
    expect(identity).to_have_attribute("data-severity", "ok")
    expect(page.locator("#identity-confirmation")).to_contain_text("Identity confirmed by operator")
    stored = committed(lambda: IdentityConfirmation.objects.get())
    assert [entry["name"] for entry in stored.targets] == ["small", "provider"]

    follow(page, page.get_by_role("link", name="Checked"))
    expect(page.locator("#identity-confirmation")).to_contain_text("small (demo-8b), provider")
