"""A Custom service made in the launcher from a pasted command, in a real Chromium against a real
daphne, a Celery worker with beat (the reconciler and the probes) and an agent as its node: the
command's health path set in the form, the service becomes ready on its own; edited, its next
revision rolls out while the page says so."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, ViewportSize, expect

from serving import folders
from serving.models import ModelFolder, Service
from tests.nexus.factories import make_user
from tests.support.browser import PASSWORD, arrive, committed, sign_in
from tests.support.live import LiveServer
from tests.support.screenshots import screenshot
from tests.support.serving_stack import serving_stack

pytestmark = pytest.mark.e2e

# The reference's own example, served from the model folder, on the port the agent allocates.
COMMAND = "python -m http.server ${PORT} --directory /models"
READY_TIMEOUT_MS = 60_000


@pytest.fixture
def nexus(transactional_db: None, tmp_path: Path, data_dir: Path) -> Iterator[LiveServer]:
    make_user("owner", password=PASSWORD, staff=True)
    site = folders.create_folder(ModelFolder(name="site"))
    folders.write_file(site, "index.html", [b"<p>hello from the model folder</p>\n"])
    with serving_stack(tmp_path, data_dir) as server:
        yield server


@pytest.fixture
def viewport() -> ViewportSize:
    return {"width": 1280, "height": 800}


def test_a_pasted_http_server_with_its_health_path_set_in_the_form_becomes_ready(
    nexus: LiveServer, page: Page
) -> None:
    sign_in(page, nexus, "/serving/services/new/")
    check = page.locator("#launch-check")
    page.get_by_label("Service name").fill("files")
    page.get_by_label("Model folder").select_option("site")
    page.get_by_label("Runtime variant").select_option("custom")
    page.get_by_label("a command line").check()
    page.get_by_label("Command line", exact=True).press_sequentially(COMMAND)
    expect(check).to_contain_text("Ready to start.")
    expect(check.locator("dt:text-is('Health check') + dd")).to_contain_text("/health")

    page.get_by_label("Health path").press_sequentially("/")
    page.get_by_label("Probe interval (s)").press_sequentially("1")
    page.get_by_label("Initial delay (s)").press_sequentially("0")
    expect(check.locator("dt:text-is('Health check') + dd")).to_contain_text(
        "/ every 1.0 s, first after 0.0 s"
    )
    screenshot(page, "serving-launcher-custom-command")
    page.get_by_role("button", name="Start service").click()

    arrive(page, re.compile(r"/serving/services/files/$"))
    expect(page.locator("#service-readiness")).to_have_text(
        "1 of 1 replica ready", timeout=READY_TIMEOUT_MS
    )
    # The revision is marked running at the reconciler's next tick, a moment after its replica
    # passed its probe: the picture shows the settled page.
    expect(page.get_by_text("Revision 1 is rolling out")).to_have_count(0)
    screenshot(page, "serving-service-ready")
    revision = committed(lambda: Service.objects.get(name="files").latest_revision)
    assert revision.command_settings == {"health_path": "/", "interval": 1.0, "initial_delay": 0.0}

    # Edit: the launcher opens filled in; a new variable makes revision 2, which rolls out.
    page.get_by_role("link", name="Edit").click()
    arrive(page, re.compile(r"/serving/services/files/edit/$"))
    expect(page.get_by_label("Command line", exact=True)).to_have_value(COMMAND)
    expect(page.get_by_label("Health path")).to_have_value("/")
    expect(page.get_by_label("Probe interval (s)")).to_have_value("1.0")
    page.get_by_label("More variables").press_sequentially("GREETING=hello")
    expect(check).to_contain_text("GREETING=hello")
    screenshot(page, "serving-service-edit")
    page.get_by_role("button", name="Update").click()

    arrive(page, re.compile(r"/serving/services/files/$"))
    expect(page.locator("#toasts")).to_contain_text("Updated files: revision 2 rolls out.")
    notice = page.get_by_text("The next revision is being applied: revision 2 is rolling out")
    expect(notice).to_be_visible()
    # Gone once revision 2 runs (the cards arrive over the page's websocket).
    expect(notice).to_have_count(0, timeout=READY_TIMEOUT_MS)
    expect(page.locator("#service-readiness")).to_have_text("1 of 1 replica ready")
    expect(page.locator("#revisions")).to_contain_text("GREETING=hello")
