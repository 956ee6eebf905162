"""The deployment page in a real Chromium: its progress bar moves live, and retry brings back a
node whose agent crashed mid-download. Real daphne, Celery worker, agent and file server."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from deployments import services
from deployments.models import Deployment, DeploymentNode
from nodes import services as node_services
from tests.nexus.factories import make_user
from tests.support.agent import RunningAgent, running_agent
from tests.support.browser import PASSWORD, committed, sign_in
from tests.support.fileserver import serving_file
from tests.support.live import LiveServer, running_nexus
from tests.support.screenshots import screenshot
from tests.support.worker import running_worker

pytestmark = pytest.mark.e2e

MIB = 1024 * 1024


@dataclass
class World:
    nexus: LiveServer
    agent: RunningAgent
    deployment: Deployment
    row: DeploymentNode


@pytest.fixture
def world(transactional_db: None, tmp_path: Path) -> Iterator[World]:
    """A deployment of a 3 MiB model, sent at 1 MiB/s, to one node; its job queued, no worker."""
    content = os.urandom(3 * MIB)
    make_user("owner", staff=True, password=PASSWORD)
    with (
        running_agent(tmp_path) as agent,
        serving_file(content, name="demo.bin", rate_bytes_per_s=MIB) as files,
        running_nexus(tmp_path) as nexus,
    ):
        node = node_services.add_node("node-a", agent.url, agent.credential)
        node = node_services.confirm_node(node, agent.fingerprint)
        deployment = services.create_deployment(
            name="Demo on node-a",
            nodes=[node],
            runtime="simulator",
            model_source="http",
            model_location=files.url,
            model_sha256=hashlib.sha256(content).hexdigest(),
            model_name="demo-1b",
        )
        yield World(nexus, agent, deployment, deployment.nodes.get())


def progress_value(page: Page, selector: str) -> float:
    return float(page.eval_on_selector(selector, "bar => bar.value"))


def test_the_progress_bar_moves_live_and_retry_brings_back_a_crashed_node(
    world: World, page: Page, tmp_path: Path
) -> None:
    sign_in(page, world.nexus, f"/deployments/{world.deployment.pk}/")
    expect(page.locator("[data-live-status]")).to_have_text("Live")
    page.evaluate("window.loadedOnce = true")
    row = page.locator(f"#deployment-node-{world.row.pk}")
    bar = f"#deployment-node-{world.row.pk} progress"
    expect(row).to_have_attribute("data-state", "pending")

    with running_worker(tmp_path):
        expect(row).to_contain_text("downloading", timeout=20_000)
        page.wait_for_function(f"document.querySelector('{bar}').value > 0", timeout=10_000)
        first = progress_value(page, bar)
        page.wait_for_function(f"document.querySelector('{bar}').value > {first}", timeout=10_000)
        expect(row.locator(".bytes")).to_contain_text(" of 3 MiB")
        world.agent.kill()

        expect(row).to_have_attribute("data-state", "failed", timeout=20_000)
        expect(row.locator(".error")).to_contain_text(
            "node node-a stopped answering while downloading: connection refused"
        )
        expect(page.locator("#deployment-summary .badge")).to_have_text("✕ Failed")
        retry = page.get_by_role("button", name="Retry failed nodes")
        expect(retry).to_be_visible()
        screenshot(page, "deployments-detail-failed")

        world.agent.start()
        retry.click()  # a plain post, then the page again (POST, redirect, GET)
        expect(page.locator(".toast")).to_contain_text("Retrying the failed nodes: node-a.")
        expect(row).to_contain_text("attempt 2")
        expect(retry).to_be_hidden()
        page.evaluate("window.loadedOnce = true")
        expect(row).to_have_attribute("data-state", "succeeded", timeout=30_000)

    expect(page.locator("#deployment-summary .badge")).to_have_text("✓ Succeeded")
    expect(page.get_by_role("button", name="Retry failed nodes")).to_have_count(0)
    assert progress_value(page, bar) == 100.0
    assert page.evaluate("window.loadedOnce") is True
    assert committed(lambda: DeploymentNode.objects.get(pk=world.row.pk).attempt) == 2
    screenshot(page, "deployments-detail-succeeded")


def test_the_form_keeps_what_was_typed_beside_the_reason_it_was_refused(
    world: World, page: Page
) -> None:
    sign_in(page, world.nexus, "/deployments/new/")

    page.get_by_label("Name").fill("custom on node-a")
    page.get_by_label("node-a").check()
    page.get_by_label("Runtime", exact=True).select_option("custom")
    page.get_by_label("Custom command").fill("my-server ${MODEL_PATH}")
    page.get_by_label("An HTTP(S) URL").check()
    page.get_by_label("Model location").fill("http://files.lan/demo.bin")
    page.get_by_label("Model id").fill("demo-1b")
    page.get_by_role("button", name="Deploy").click()

    expect(page.locator("#id_runtime_argv_error")).to_have_text(
        "A custom runtime's command must contain ${PORT}, where it listens."
    )
    expect(page.get_by_label("Custom command")).to_have_attribute("aria-invalid", "true")
    expect(page.get_by_label("Name")).to_have_value("custom on node-a")
    expect(page.get_by_label("Custom command")).to_have_value("my-server ${MODEL_PATH}")
    expect(page.get_by_label("node-a")).to_be_checked()
    assert committed(lambda: Deployment.objects.count()) == 1
    screenshot(page, "deployments-new-refused")
