"""A real Chromium for the page tests: one browser per test, and a page in a fresh context whose
size a module may change by overriding the `viewport` fixture."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, ViewportSize, sync_playwright

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


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
def viewport() -> ViewportSize:
    """Return the window size pages are shown at; a module overrides this to change it."""
    return {"width": 1280, "height": 800}


@pytest.fixture
def page(browser: Browser, viewport: ViewportSize) -> Iterator[Page]:
    context = browser.new_context(viewport=viewport)
    yield context.new_page()
    context.close()
