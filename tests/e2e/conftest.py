"""A real Chromium for the page tests: one browser per pytest worker, and for each test a page in
a fresh context (its own cookies and storage) whose size a module may change by overriding the
`viewport` fixture.

The browser and Playwright's driver are the worker's, not the test's: starting them took about
2 s of a page test and 1.4 s of CPU, 45 times a run. A context is what keeps tests apart.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import playwright
import pytest
from playwright.sync_api import Browser, Page, Playwright, ViewportSize, sync_playwright

CHROMIUM = Path("/usr/bin/chromium")
# Chromium loads the omnibox popup's two WebUI pages in a renderer of their own for every window
# (each test's context is one), about 0.6 s of CPU a page test, for a popup no test opens.
NEXUS_DISABLED_FEATURES = ("WebUIOmniboxPopup", "WebUIOmniboxAimPopup")


def playwright_disabled_features() -> list[str]:
    """Return the Chromium features Playwright's driver disables (its chromiumSwitches).

    Chromium keeps only the last --disable-features it is given, so ours must repeat these.
    """
    bundle = Path(playwright.__file__).parent / "driver/package/lib/coreBundle.js"
    found = re.search(r"disabledFeatures = \[(.*?)\]\.filter\(Boolean\)", bundle.read_text(), re.S)
    if found is None:
        raise RuntimeError(f"{bundle}: Playwright's disabledFeatures list was not found")
    return re.findall(r'"(\w+)"', found.group(1))


def chromium_args() -> list[str]:
    disabled = [*playwright_disabled_features(), *NEXUS_DISABLED_FEATURES]
    return [
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--disable-features={','.join(disabled)}",
    ]


class WorkerBrowser:
    """Playwright and one Chromium, kept for every page test on the worker.

    Playwright's sync API marks its event loop as the thread's running loop after each call,
    for as long as Playwright runs: kept for the worker, that would break every later test that
    runs a loop of its own (`asyncio.run`, pytest-asyncio, `async_to_sync`). So a page test
    marks it while it runs (`lend`), and the loop is unmarked between page tests, as it was when
    each test started and stopped Playwright.
    """

    def __init__(self, playwright: Playwright) -> None:
        self.playwright = playwright
        self._loop: asyncio.AbstractEventLoop = playwright._loop
        self.browser = self._launch()

    def lend(self) -> Browser:
        asyncio._set_running_loop(self._loop)
        if not self.browser.is_connected():  # a test crashed it: the next test gets a new one
            self.browser = self._launch()
        return self.browser

    def give_back(self) -> None:
        asyncio._set_running_loop(None)

    def _launch(self) -> Browser:
        return self.playwright.chromium.launch(executable_path=str(CHROMIUM), args=chromium_args())


@pytest.fixture(scope="session")
def worker_browser() -> Iterator[WorkerBrowser]:
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium)."
        )
    with sync_playwright() as playwright:
        shared = WorkerBrowser(playwright)
        shared.give_back()
        yield shared
        shared.lend().close()


@pytest.fixture
def browser(worker_browser: WorkerBrowser) -> Iterator[Browser]:
    yield worker_browser.lend()
    worker_browser.give_back()


@pytest.fixture
def viewport() -> ViewportSize:
    """Return the window size pages are shown at; a module overrides this to change it."""
    return {"width": 1280, "height": 800}


@pytest.fixture
def page(browser: Browser, viewport: ViewportSize) -> Iterator[Page]:
    context = browser.new_context(viewport=viewport)
    yield context.new_page()
    context.close()
