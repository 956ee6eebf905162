"""The Nodes pages in a real Chromium, daphne and agents: add a node, compare, confirm; watch a
node go offline live, with why and when it was last seen."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, ViewportSize, expect

from nodes import services
from nodes.models import Node
from tests.nexus.factories import make_user
from tests.nodes.fleet import SIM_MODEL, agent_args, serve_simulator, trusted_node
from tests.support.agent import RunningAgent, running_agent
from tests.support.browser import PASSWORD, arrive, committed, follow, sign_in
from tests.support.live import LiveServer, running_nexus
from tests.support.screenshots import screenshot

pytestmark = pytest.mark.e2e


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
    expect(page.get_by_text("No nodes yet")).to_be_visible()
    screenshot(page, "nodes-list-empty")

    # The empty state's next step.
    follow(page, page.locator("#nodes-table").get_by_role("link", name="Add node"))
    page.get_by_label("Name").fill("gpu-box")
    page.get_by_label("Address").fill(agent.url)
    page.get_by_label("Credential").fill(agent.credential)
    page.get_by_role("button", name="Add node").click()

    arrive(page, f"{nexus.url}/nodes/gpu-box/confirm/")
    expect(page.locator("[data-fingerprint]")).to_have_text(agent.fingerprint)
    assert agent.credential not in page.content()
    screenshot(page, "nodes-confirm-fingerprint")

    page.get_by_role("button", name="Confirm").click()

    arrive(page, f"{nexus.url}/nodes/gpu-box/")
    expect(page.get_by_text("Node gpu-box is trusted.")).to_be_visible()
    inventory = page.locator("#node-inventory tbody tr")
    expect(inventory).to_have_count(1)
    expect(inventory.first).to_contain_text(SIM_MODEL)
    expect(inventory.first).to_contain_text("simulator")
    screenshot(page, "nodes-detail-trusted")

    page.evaluate("window.loadedOnce = true")
    with page.expect_response(lambda r: r.request.headers.get("hx-request") == "true"):
        page.get_by_role("button", name="Refresh now").click()
    expect(page.locator("#node-inventory tbody tr")).to_have_count(1)
    assert page.evaluate("window.loadedOnce") is True

    follow(page, page.get_by_role("link", name="Nodes", exact=True).first)
    row = page.locator("#node-gpu-box")
    expect(row.locator(".badge")).to_have_text("✓ Online")


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


def test_a_node_that_stops_answering_turns_offline_on_the_open_page_with_why_and_last_seen(
    nexus: LiveServer, agent: RunningAgent, tmp_path: Path, page: Page
) -> None:
    (tmp_path / "old").mkdir()
    with running_agent(tmp_path / "old", name="old-box", args=agent_args()) as old:
        committed(lambda: trusted_node("gpu-box", agent))
        committed(lambda: trusted_node("old-box", old))
        sign_in(page, nexus, "/nodes/")
        expect(page.locator("[data-live-status]")).to_have_text("Live")
        page.evaluate("window.loadedOnce = true")
        row = page.locator("#node-old-box")
        expect(row.locator(".badge")).to_have_text("✓ Online")

        old.kill()
        committed(services.refresh_nodes)

        badge = row.locator(".badge")
        expect(badge).to_have_text("✕ Offline (since just now, connection refused)", timeout=5_000)
        expect(badge).to_have_attribute(
            "title", "Does not answer: no traffic and no work., connection refused"
        )
        expect(row.locator("time")).to_have_attribute(
            "title", re.compile(r"^\d{4}-\d\d-\d\d .* UTC$")
        )
        expect(page.locator("#node-gpu-box .badge")).to_have_text("✓ Online")
        assert page.evaluate("window.loadedOnce") is True
        screenshot(page, "nodes-list-offline")
