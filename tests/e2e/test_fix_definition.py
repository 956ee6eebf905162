"""The reference's remedy in a real Chromium against a real daphne, a Celery worker with beat
and an agent as the node: a model definition whose server cannot start fails its route, with the
error on the page as it happens; the file fixed in the folder, "Clear errors and retry" runs
the fixed definition (a new revision) and the service becomes ready."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from serving import folders, services
from serving.models import ModelFolder, Service
from tests.nexus.factories import make_user
from tests.support.browser import PASSWORD, committed, sign_in
from tests.support.live import LiveServer
from tests.support.screenshots import screenshot
from tests.support.serving_stack import serving_stack

pytestmark = pytest.mark.e2e

TIMEOUT_MS = 60_000
HEALTH = """\
      port: 8000
      health_check:
        path: /
        interval: 0.5
        max_retries: 2
        max_wait_time: 1.0
        initial_delay: 0
"""
# The server cannot start: it says why and exits 1.
BROKEN = f"""\
models:
  - name: site
    model_path: /models
    service:
      start_command:
        - python
        - -c
        - "import sys; print('cannot load the model: no weights', file=sys.stderr); sys.exit(1)"
        - ${{PORT}}
{HEALTH}"""
FIXED = f"""\
models:
  - name: site
    model_path: /models
    service:
      start_command: [python, -m, http.server, "${{PORT}}", --bind, 127.0.0.1, --directory, /models]
{HEALTH}"""


@pytest.fixture
def nexus(transactional_db: None, tmp_path: Path, data_dir: Path) -> Iterator[LiveServer]:
    make_user("owner", password=PASSWORD, staff=True)
    site = folders.create_folder(ModelFolder(name="site"))
    folders.write_file(site, "model-definition.yaml", [BROKEN.encode()])
    folders.write_file(site, "index.html", [b"<p>hello</p>\n"])
    services.create_service(name="site", model_folder=site, runtime_variant="custom")
    with serving_stack(tmp_path, data_dir) as server:
        yield server


def test_a_fixed_definition_runs_after_clear_errors_and_retry(
    nexus: LiveServer, page: Page
) -> None:
    sign_in(page, nexus, "/serving/services/site/")
    retry = page.locator("#routes-running").get_by_role("button", name="Clear errors and retry")
    # The failure arrives over the page's websocket, with the server's own words in its log.
    expect(retry.first).to_be_visible(timeout=TIMEOUT_MS)
    expect(page.locator("#routes-running")).to_contain_text("the process exited with code 1")
    screenshot(page, "serving-service-failed")

    def fix() -> None:
        folder = ModelFolder.objects.get(name="site")
        folders.write_file(folder, "model-definition.yaml", [FIXED.encode()])

    committed(fix)
    toasts = page.locator("#toasts")
    for _ in range(3):
        retry.first.click()
        expect(toasts).to_contain_text(re.compile("retrying it now|was not retried"))
        if "retrying it now" in toasts.inner_text():
            break
        # The reconciler replaced the failed route between the page's push and the click (the
        # refusal names the route that replaced it): clear the replacement, once it shows.
        toasts.get_by_role("button", name="Dismiss").first.click()
        expect(retry.first).to_be_visible(timeout=TIMEOUT_MS)
    expect(toasts).to_contain_text("retrying it now")
    expect(page.locator("#service-banner")).to_contain_text("Ready.", timeout=TIMEOUT_MS)
    latest = committed(lambda: Service.objects.get(name="site").latest_revision)
    assert latest.number == 2
    assert latest.spec["argv"][:3] == ["python", "-m", "http.server"]
