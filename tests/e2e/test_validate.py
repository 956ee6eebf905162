"""Validate in a real Chromium against a real daphne, a Celery worker and an agent as the
node: the launcher's settings run as a trial replica; its log and probes stream into a popup,
which ends "Finished" with the verdict; the trial replica is stopped either way."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from serving import folders
from serving.models import ModelFolder, Service, Trial, models_root
from tests.nexus.factories import make_user
from tests.nodes.fleet import trusted_node
from tests.serving.test_trials import BROKEN, SERVING
from tests.support.agent import running_agent
from tests.support.browser import PASSWORD, committed, sign_in
from tests.support.live import LiveServer, running_nexus
from tests.support.screenshots import screenshot
from tests.support.worker import running_worker

pytestmark = pytest.mark.e2e

TIMEOUT_MS = 45_000


@pytest.fixture
def agent_node(transactional_db: None, tmp_path: Path, data_dir: Path) -> Iterator[str]:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
    with running_agent(
        tmp_path, name="node-a", args=["--allow-dir", str(models_root())], env={"PATH": path}
    ) as agent:
        trusted_node("node-a", agent)
        yield agent.credential


@pytest.fixture
def nexus(agent_node: str, tmp_path: Path, data_dir: Path) -> Iterator[LiveServer]:
    make_user("owner", password=PASSWORD, staff=True)
    for name, definition in (("broken", BROKEN), ("site", SERVING)):
        folder = folders.create_folder(ModelFolder(name=name))
        folders.write_file(folder, "model-definition.yaml", [definition.encode()])
    shared = {"NEXUS_DATA_DIR": str(data_dir)}
    with ExitStack() as stack:
        server = stack.enter_context(running_nexus(tmp_path, NEXUS_LEDGER="memory", **shared))
        stack.enter_context(running_worker(tmp_path, **shared))
        yield server


def test_validate_a_broken_definition_then_a_working_one(nexus: LiveServer, page: Page) -> None:
    sign_in(page, nexus, "/serving/services/new/")
    page.get_by_label("Service name").fill("chat")
    page.get_by_label("Runtime variant").select_option("custom")
    page.get_by_label("the folder's model definition").check()
    page.get_by_label("Model folder").select_option("broken")
    expect(page.locator("#launch-check")).to_contain_text("Ready to start.")

    page.get_by_role("button", name="Validate").click()
    popup = page.get_by_role("dialog", name="Validate")
    expect(popup).to_be_visible()
    expect(popup).to_contain_text("Finished:", timeout=TIMEOUT_MS)
    expect(popup).to_contain_text("Failed")
    expect(popup).to_contain_text("the process exited with code 3")
    expect(popup).to_contain_text("cannot load the model: no weights")
    expect(popup).to_contain_text("The trial replica was stopped.")
    screenshot(page, "serving-launcher-validate-failed")
    popup.get_by_role("button", name="Close").click()

    page.get_by_label("Model folder").select_option("site")
    expect(page.locator("#launch-check")).to_contain_text("Ready to start.")
    page.get_by_role("button", name="Validate").click()
    expect(popup).to_contain_text("Finished:", timeout=TIMEOUT_MS)
    expect(popup).to_contain_text("✓ passed: HTTP 200")
    expect(popup).to_contain_text("/ answered HTTP 200")

    # Nothing of a service was made; both trials ended.
    assert committed(Service.objects.count) == 0
    assert committed(lambda: sorted(Trial.objects.values_list("state", flat=True))) == [
        "failed",
        "passed",
    ]
