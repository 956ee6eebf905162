"""The pools page in a real Chromium against a real daphne: sign in, read, watch a pool appear."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from nexus.models import DEFAULT_PROJECT, Project, Role
from tests.nexus.factories import make_pool, make_target, make_user
from tests.support.browser import PASSWORD, committed, sign_in
from tests.support.live import LiveServer, running_nexus
from tests.support.personas import add_member
from tests.support.screenshots import screenshot

pytestmark = pytest.mark.e2e

PROVIDER_KEY = "sk-provider-0123456789abcdef"


def default_project() -> Project:
    return Project.objects.get_or_create(name=DEFAULT_PROJECT)[0]


@pytest.fixture
def nexus(transactional_db: None, tmp_path: Path) -> Iterator[LiveServer]:
    # A viewer of the default project, where the pools are; pushes reach staff's pages only.
    add_member(default_project(), make_user("teammate", password=PASSWORD), Role.VIEWER)
    make_user("operator", password=PASSWORD, staff=True)
    pool = make_pool("chat", name="Chat models", strategy="least_busy")
    make_target(pool, "gpu-a", model_id="qwen2.5-7b", capacity_weight=8)
    make_target(pool, "openai", model_id="gpt-4o-mini", credential=PROVIDER_KEY, priority=2)
    with running_nexus(tmp_path) as server:
        yield server


def test_the_pages_scripts_and_styles_are_served_by_nexus_itself(
    nexus: LiveServer, page: Page
) -> None:
    sign_in(page, nexus, "/pools/", username="teammate")

    assets = page.eval_on_selector_all(
        "script[src], link[rel=stylesheet]", "nodes => nodes.map(n => n.src || n.href)"
    )

    assert [url.removeprefix(nexus.url) for url in assets] == [
        "/static/nexus/nexus.css",
        "/static/django_htmx/htmx-2.min.js",
        "/static/vendor/htmx-ext-ws/ws.js",
        "/static/nexus/nexus.js",
    ]
    for url in assets:
        assert page.request.get(url).status == 200, f"{url} is not served by Nexus itself"


def test_a_teammate_signs_in_and_sees_each_pool_with_its_targets(
    nexus: LiveServer, page: Page
) -> None:
    sign_in(page, nexus, "/pools/", username="teammate")

    chat = page.locator("#pool-chat")
    expect(chat.get_by_role("heading", name="Chat models")).to_be_visible()
    expect(chat.locator(".model-name code")).to_have_text("@pool/chat")
    expect(chat.locator("tbody tr")).to_have_count(2)
    expect(chat.locator("tbody tr").first).to_contain_text("gpu-a")
    expect(chat.locator("tbody tr").nth(1)).to_contain_text("stored")
    assert PROVIDER_KEY not in page.content()


def test_refresh_swaps_the_table_without_reloading_the_page(nexus: LiveServer, page: Page) -> None:
    sign_in(page, nexus, "/pools/", username="teammate")
    page.evaluate("window.loadedOnce = true")

    with page.expect_response(lambda r: r.request.headers.get("hx-request") == "true"):
        page.get_by_role("link", name="Refresh").click()

    expect(page.locator("#pool-chat tbody tr")).to_have_count(2)
    assert page.evaluate("window.loadedOnce") is True


def test_a_pool_created_elsewhere_appears_without_a_reload_for_staff(
    nexus: LiveServer, page: Page
) -> None:
    sign_in(page, nexus, "/pools/", username="operator")
    expect(page.locator("[data-live-status]")).to_have_text("Live")
    page.evaluate("window.loadedOnce = true")

    committed(lambda: make_target(make_pool("embed", name="Embeddings"), "bge-small"))

    embed = page.locator("#pool-embed")
    expect(embed.get_by_role("heading", name="Embeddings")).to_be_visible(timeout=10_000)
    expect(embed.locator("tbody tr")).to_contain_text("bge-small")
    assert page.evaluate("window.loadedOnce") is True
    screenshot(page, "pools-list-live")
