"""The service launcher in a real Chromium against a real daphne: problems appear while typing,
before anything is submitted; fixed, the parsed command shows; submitted, the service page opens."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest
from django.db import connection
from playwright.sync_api import Browser, Locator, Page, expect, sync_playwright
from pytest_django.fixtures import Settings

from serving import folders
from serving.models import ModelFolder, Service
from tests.nexus.factories import make_user
from tests.support.live import LiveServer, running_nexus

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PASSWORD = "a long enough password"
# A model with a service but no start_command: the definition cannot run.
BROKEN_DEFINITION = (
    b"models:\n  - name: x\n    model_path: /models\n    service:\n      port: 8000\n"
)
SCREENSHOT = Path("/tmp/nexus-service-launcher.png")
DETAIL_SCREENSHOT = Path("/tmp/nexus-service-detail.png")
T = TypeVar("T")


def committed(work: Callable[[], T]) -> T:
    """Run database work in its own thread and connection.

    Playwright's sync API keeps an event loop running in the test's thread, where Django refuses
    synchronous database calls.
    """

    def run() -> T:
        try:
            return work()
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=1) as executor:
        return executor.submit(run).result()


@pytest.fixture
def data_dir(tmp_path: Path, settings: Settings) -> Path:
    """The server's data dir, which this process writes model folders into too."""
    path = tmp_path / "data"
    path.mkdir()
    settings.DATA_DIR = path
    return path


@pytest.fixture
def nexus(transactional_db: None, tmp_path: Path, data_dir: Path) -> Iterator[LiveServer]:
    make_user("owner", password=PASSWORD, staff=True)
    folders.create_folder(ModelFolder(name="llama"))
    broken = folders.create_folder(ModelFolder(name="broken"))
    folders.write_file(broken, "model-definition.yaml", [BROKEN_DEFINITION])
    with running_nexus(tmp_path, NEXUS_DATA_DIR=str(data_dir)) as server:
        yield server


@pytest.fixture
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium)."
        )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    yield context.new_page()
    context.close()


def fact(check: Locator, name: str) -> Locator:
    """Return the value the check shows for a fact, by its term."""
    return check.locator(f"dt:text-is('{name}') + dd")


def sign_in(page: Page, nexus: LiveServer) -> None:
    page.goto(f"{nexus.url}/serving/services/new/")
    expect(page).to_have_url(f"{nexus.url}/login/?next=/serving/services/new/")
    page.get_by_label("Username").fill("owner")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(f"{nexus.url}/serving/services/new/")


def test_the_launcher_checks_as_one_types_and_starts_the_service(
    nexus: LiveServer, page: Page
) -> None:
    sign_in(page, nexus)
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
    expect(check).to_contain_text("Ready to start.")
    expect(fact(check, "Runtime")).to_have_text("vllm (under custom)")
    expect(fact(check, "Port")).to_have_text("8000")
    expect(fact(check, "Tensor parallel")).to_have_text("2")
    expect(fact(check, "Model path")).to_contain_text("/models/llama")
    page.screenshot(path=SCREENSHOT, full_page=True)

    # Submitted: the service exists and its page opens.
    page.get_by_role("button", name="Start service").click()
    expect(page).to_have_url(re.compile(r"/serving/services/chat/$"))
    expect(page.locator(".messages")).to_contain_text("Started service chat.")
    expect(page.locator("#service-readiness")).to_have_text("0 of 1 replica ready")
    expect(page.locator("#revisions")).to_contain_text("vllm serve /models/llama --tp 2")
    page.screenshot(path=DETAIL_SCREENSHOT, full_page=True)
    spec = committed(lambda: Service.objects.get().latest_revision.spec)
    assert (spec["argv"], spec["port"]) == (["vllm", "serve", "/models/llama", "--tp", "2"], 8000)
