"""Editing a pool in its own pages in a real Chromium: a capacity weight edited in place changes
the next dry run; a provider target is added with its key (never shown again); a target is
removed after confirming; the settings are edited. (Creating one: test_pool_wizard.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from pools.models import Pool, Target
from tests.nexus.factories import make_pool, make_target, make_user
from tests.support.browser import PASSWORD, committed, follow, sign_in
from tests.support.live import LiveServer, running_nexus
from tests.support.screenshots import screenshot

pytestmark = pytest.mark.e2e

PROVIDER_KEY = "sk-provider-typed-in-the-browser"


@pytest.fixture
def nexus(transactional_db: None, tmp_path: Path) -> Iterator[LiveServer]:
    make_user("operator", password=PASSWORD, staff=True)
    # Equivalent generation: the provider target added below serves another model, which an
    # Exact-replicas pool refuses at save time.
    pool = make_pool(
        "edit", name="Editing", strategy="smart", compatibility_mode="equivalent_generation"
    )
    make_target(pool, "a", model_id="demo-8b", capacity_weight=8)
    make_target(pool, "b", model_id="demo-8b", capacity_weight=4)
    make_target(pool, "backup", model_id="demo-8b", capacity_weight=4, priority=2)
    with running_nexus(tmp_path) as server:
        yield server


def test_an_inline_weight_edit_changes_the_next_dry_run(nexus: LiveServer, page: Page) -> None:
    sign_in(page, nexus, "/pools/edit/", username="operator")
    dry_run = page.locator("#dry-run")
    chosen = dry_run.locator("[data-chosen]")

    dry_run.get_by_role("button", name="Dry run").click()
    expect(chosen).to_have_text("a")
    expect(dry_run.locator('table[data-tier="2"] tr[data-target="backup"]')).to_be_visible()

    page.get_by_label("Capacity weight of b", exact=True).fill("16")
    page.get_by_role("button", name="Save b", exact=True).click()
    expect(page.locator("#toasts")).to_contain_text("b saved.")
    assert committed(lambda: Target.objects.get(name="b").capacity_weight) == 16

    dry_run.get_by_role("button", name="Dry run").click()
    expect(chosen).to_have_text("b")
    expect(page.locator("#live-target-" + str(committed(lambda: Target.objects.get(name="b").pk))
                        ).locator("td.num").first).to_have_text("0 / 16")  # fmt: skip
    screenshot(page, "pools-detail-dry-run")


def test_an_operator_adds_a_provider_target_and_removes_another(
    nexus: LiveServer, page: Page
) -> None:
    sign_in(page, nexus, "/pools/edit/", username="operator")

    follow(page, page.get_by_role("link", name="Add target"))
    page.get_by_label("Name").fill("openai")
    page.get_by_label("Base URL").fill("https://api.openai.com/v1")
    page.get_by_label("Model id").fill("gpt-4o-mini")
    page.get_by_label("Embeddings").uncheck()
    page.get_by_label("Priority").fill("3")
    # A provider says nothing of its concurrency: the operator sets it.
    page.get_by_label("Capacity weight").fill("16")
    page.get_by_label("API key").fill(PROVIDER_KEY)
    screenshot(page, "pools-target-add")
    page.get_by_role("button", name="Add target").click()

    expect(page.locator("#toasts")).to_contain_text("openai added to Editing.")
    expect(page.locator("#pool-live")).to_contain_text("openai")
    expect(page.locator("#pool-live")).to_contain_text("key stored")
    assert PROVIDER_KEY not in page.content()
    added = committed(lambda: Target.objects.get(name="openai"))
    assert (added.kinds, added.priority, added.capacity_weight, added.get_credential()) == (
        ["chat", "completions"], 3, 16, PROVIDER_KEY,
    )  # fmt: skip

    page.get_by_role("link", name="Remove backup").click()
    dialog = page.locator("dialog[open]")
    expect(dialog).to_contain_text("requests in flight to it finish")
    dialog.get_by_role("button", name="Remove target").click()
    expect(page.locator("#toasts")).to_contain_text("backup removed from Editing.")
    assert not committed(lambda: Target.objects.filter(name="backup").exists())


def test_an_operator_edits_the_pool_settings(nexus: LiveServer, page: Page) -> None:
    sign_in(page, nexus, "/pools/edit/", username="operator")

    follow(page, page.get_by_role("link", name="Edit settings"))
    page.get_by_label("Strategy").select_option("least_busy")
    page.get_by_label("Queue length").fill("12")
    screenshot(page, "pools-settings")
    page.get_by_role("button", name="Save settings").click()

    expect(page.locator("#toasts")).to_contain_text("Editing's settings saved.")
    expect(page.locator(".settings")).to_contain_text("Least busy")
    pool = committed(lambda: Pool.objects.get(slug="edit"))
    assert (pool.strategy, pool.max_queue) == ("least_busy", 12)
