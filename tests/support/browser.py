"""Helpers for tests that drive Nexus's pages in a real Chromium (the fixtures are in
tests/e2e/conftest.py): signing in, and database work the live server must see."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from re import Pattern
from typing import TypeVar

from django.db import connection
from playwright.sync_api import Locator, Page, expect

from tests.support.live import LiveServer

PASSWORD = "a long enough password"
T = TypeVar("T")


def committed(work: Callable[[], T]) -> T:
    """Run database work in its own thread and connection.

    Playwright's sync API keeps an event loop running in the test's thread, where Django refuses
    synchronous database calls; writes made here are committed at once for the server to see.
    """

    def run() -> T:
        try:
            return work()
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=1) as executor:
        return executor.submit(run).result()


def arrive(page: Page, url: str | Pattern[str], *, timeout: float | None = None) -> None:
    """Wait until the page is at url and has loaded, its deferred scripts (htmx, nexus.js) run.

    The URL changes when the new document commits, before its scripts run: a click made then
    finds tabs, htmx attributes and dialogs without their behaviour (a CI run clicked a tab
    before nexus.js had run, and every panel stayed shown).
    """
    expect(page).to_have_url(url, timeout=timeout)
    page.wait_for_load_state("load")


def follow(page: Page, link: Locator) -> None:
    """Click a link to another page and wait until that page has loaded (see `arrive`)."""
    with page.expect_navigation():
        link.click()


def sign_in(page: Page, nexus: LiveServer, path: str, *, username: str = "owner") -> None:
    """Open path, sign in on the login page it redirects to, and land back on path."""
    page.goto(f"{nexus.url}{path}")
    arrive(page, f"{nexus.url}/login/?next={path}")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    arrive(page, f"{nexus.url}{path}")
