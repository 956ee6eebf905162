"""The Nodes pages in a real Chromium, daphne and agent: add a node, compare, confirm."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, ViewportSize, expect

from nodes.models import Node
from tests.nexus.factories import make_user
from tests.nodes.fleet import SIM_MODEL, agent_args, serve_simulator
from tests.support.agent import RunningAgent, running_agent
from tests.support.browser import PASSWORD, committed, sign_in
from tests.support.live import LiveServer, running_nexus

pytestmark = pytest.mark.e2e

SCREENSHOTS = Path("/tmp")


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[RunningAgent]:
    with running_agent(tmp_path, name="gpu-box", args=agent_args()) as running:
        serve_simulator(running)
        yield running


@pytest.fixture
def nexus(transactional_db: None, tmp_path: Path) -> Iterator[LiveServer]:
    make_user("owner", staff=True, password=PASSWORD)
    with running_nexus(tmp_path) as server:
        yield server


@pytest.fixture
def viewport() -> ViewportSize:
    """Return a window taller than the default one."""
    return {"width": 1280, "height": 900}


def test_an_owner_adds_an_agent_compares_its_fingerprint_and_sees_its_models(
    nexus: LiveServer, agent: RunningAgent, page: Page
) -> None:
    sign_in(page, nexus, "/nodes/")
    expect(page.get_by_text("No nodes yet.")).to_be_visible()

    page.get_by_role("link", name="Add node").click()
    page.get_by_label("Name").fill("gpu-box")
    page.get_by_label("Address").fill(agent.url)
    page.get_by_label("Credential").fill(agent.credential)
    page.get_by_role("button", name="Add node").click()

    expect(page).to_have_url(f"{nexus.url}/nodes/gpu-box/confirm/")
    expect(page.locator("[data-fingerprint]")).to_have_text(agent.fingerprint)
    assert agent.credential not in page.content()
    page.screenshot(path=SCREENSHOTS / "nexus-node-confirm.png")

    page.get_by_role("button", name="Confirm").click()

    expect(page).to_have_url(f"{nexus.url}/nodes/gpu-box/")
    expect(page.get_by_text("Node gpu-box is trusted.")).to_be_visible()
    inventory = page.locator("#node-inventory tbody tr")
    expect(inventory).to_have_count(1)
    expect(inventory.first).to_contain_text(SIM_MODEL)
    expect(inventory.first).to_contain_text("simulator")
    page.screenshot(path=SCREENSHOTS / "nexus-node-detail.png", full_page=True)

    page.evaluate("window.loadedOnce = true")
    with page.expect_response(lambda r: r.request.headers.get("hx-request") == "true"):
        page.get_by_role("button", name="Refresh now").click()
    expect(page.locator("#node-inventory tbody tr")).to_have_count(1)
    assert page.evaluate("window.loadedOnce") is True

    page.get_by_role("link", name="Nodes", exact=True).first.click()
    row = page.locator("#node-gpu-box")
    expect(row).to_contain_text("Trusted")
    expect(row).to_contain_text("Online")
    page.screenshot(path=SCREENSHOTS / "nexus-nodes-page.png")


def test_a_wrong_credential_is_explained_on_the_form(
    nexus: LiveServer, agent: RunningAgent, page: Page
) -> None:
    sign_in(page, nexus, "/nodes/")
    page.goto(f"{nexus.url}/nodes/add/")
    page.get_by_label("Name").fill("gpu-box")
    page.get_by_label("Address").fill(agent.url)
    page.get_by_label("Credential").fill("not-the-credential")
    page.get_by_role("button", name="Add node").click()

    expect(page.get_by_role("alert")).to_have_text(
        f"The agent at {agent.url} refused the node credential."
    )
    assert committed(Node.objects.count) == 0
