"""The service launcher in a real Chromium against a real daphne: problems appear while typing,
before anything is submitted; fixed, the parsed command shows; submitted, the service page opens."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Locator, Page, Route, ViewportSize, expect

from serving import folders
from serving.models import ModelFolder, Service
from tests.nexus.factories import make_user
from tests.support.browser import PASSWORD, arrive, committed, sign_in
from tests.support.live import LiveServer, running_nexus
from tests.support.screenshots import screenshot

pytestmark = pytest.mark.e2e

# A model with a service but no start_command: the definition cannot run.
BROKEN_DEFINITION = (
    b"models:\n  - name: x\n    model_path: /models\n    service:\n      port: 8000\n"
)


@pytest.fixture
def nexus(transactional_db: None, tmp_path: Path, data_dir: Path) -> Iterator[LiveServer]:
    make_user("owner", password=PASSWORD, staff=True)
    folders.create_folder(ModelFolder(name="llama"))
    broken = folders.create_folder(ModelFolder(name="broken"))
    folders.write_file(broken, "model-definition.yaml", [BROKEN_DEFINITION])
    with running_nexus(tmp_path, NEXUS_DATA_DIR=str(data_dir)) as server:
        yield server


@pytest.fixture
def viewport() -> ViewportSize:
    """Return a window taller than the default one."""
    return {"width": 1280, "height": 1000}


def fact(check: Locator, name: str) -> Locator:
    """Return the value the check shows for a fact, by its term."""
    return check.locator(f"dt:text-is('{name}') + dd")


def test_the_launcher_checks_as_one_types_and_starts_the_service(
    nexus: LiveServer, page: Page
) -> None:
    sign_in(page, nexus, "/serving/services/new/")
    launcher_url = page.url
    check = page.locator("#launch-check")
    page.get_by_label("Service name").fill("chat")

    # A folder whose model definition is broken: the problem shows without submitting.
    page.get_by_label("Runtime variant").select_option("custom")
    page.get_by_label("the folder's model definition").check()
    page.get_by_label("Model folder").select_option("broken")
    expect(check).to_contain_text(
        "model-definition.yaml: models[0].service.start_command: required"
    )

    # A broken command typed by hand: its problem replaces the definition's as one types.
    page.get_by_label("Model folder").select_option("llama")
    page.get_by_label("a command line").check()
    command = page.get_by_label("Command line", exact=True)
    command.press_sequentially("vllm serve '/models/llama --tp 2")
    expect(check).to_contain_text("command: unbalanced quote: a quote is opened and never closed")
    assert page.url == launcher_url
    assert committed(Service.objects.count) == 0

    # Fixed: the command is read into its runtime, port, parallelism and model path.
    command.fill("")
    command.press_sequentially("vllm serve /models/llama --tp 2")
    # On its server's default port, 8000, which is Nexus's own: refused at the command.
    expect(page.locator("#error-command")).to_contain_text("port 8000 is Nexus's own")
    command.press_sequentially(" --port 8001")
    expect(check).to_contain_text("Ready to start.")
    expect(fact(check, "Runtime")).to_have_text("vllm (under custom)")
    expect(fact(check, "Port")).to_have_text("8001")
    expect(fact(check, "Tensor parallel")).to_have_text("2")
    expect(fact(check, "Model path")).to_contain_text("/models/llama")
    screenshot(page, "serving-launcher-ready")

    # Past the field's own limit (max 64): the check still runs and says so, never stale.
    replicas = page.get_by_label("Replicas")
    replicas.select_text()
    replicas.press_sequentially("100")
    expect(check).to_contain_text("1 problem")
    expect(page.locator("#error-desired_replicas")).not_to_be_empty()
    replicas.select_text()
    replicas.press_sequentially("1")
    expect(check).to_contain_text("Ready to start.")

    # Submitted: the service exists and its page opens.
    page.get_by_role("button", name="Start service").click()
    arrive(page, re.compile(r"/serving/services/chat/$"))
    expect(page.locator("#toasts")).to_contain_text("Started service chat.")
    expect(page.locator("#service-readiness")).to_have_text("0 of 1 replica ready")
    expect(page.locator("#revisions")).to_contain_text(
        "vllm serve /models/llama --tp 2 --port 8001"
    )
    screenshot(page, "serving-service-started")
    spec = committed(lambda: Service.objects.get().latest_revision.spec)
    argv = ["vllm", "serve", "/models/llama", "--tp", "2", "--port", "8001"]
    assert (spec["argv"], spec["port"]) == (argv, 8001)


def wait_for_requests(page: Page, held: list[Route], count: int) -> None:
    """Wait (5 s at most) until the page has sent `count` of the held requests."""
    deadline = time.monotonic() + 5
    while len(held) < count and time.monotonic() < deadline:
        page.wait_for_timeout(50)
    assert len(held) >= count, f"{len(held)} of {count} checks sent"


def test_a_check_still_in_flight_gives_way_to_the_newest_input(
    nexus: LiveServer, page: Page
) -> None:
    sign_in(page, nexus, "/serving/services/new/")
    page.get_by_label("Service name").fill("chat")
    page.get_by_label("Runtime variant").select_option("custom")
    page.get_by_label("Model folder").select_option("llama")
    page.get_by_label("a command line").check()
    command = page.get_by_label("Command line", exact=True)
    expect(command).to_be_visible()

    # Given the server holding every check (a loaded machine answering slowly)
    held: list[Route] = []
    page.route("**/serving/services/new/check/", lambda route: held.append(route))
    # When a check is in flight and the operator types on
    command.press_sequentially("vllm serve '/models/llama")
    wait_for_requests(page, held, 1)
    replicas = page.get_by_label("Replicas")
    replicas.select_text()
    replicas.press_sequentially("2")
    # Then the newest input's check is sent all the same (htmx's default dropped it),
    wait_for_requests(page, held, 2)
    page.unroute("**/serving/services/new/check/")
    for route in held:
        with contextlib.suppress(PlaywrightError):  # the replaced one was aborted
            route.continue_()
    # and the verdict shown is the newest input's.
    expect(page.locator("#launch-check")).to_contain_text("command: unbalanced quote")
