"""A service's page in a real Chromium against a real daphne: it says the service is preparing;
a token generated with an expiry date is shown once, copied, answered by /serve/, then revoked
from the tokens card and refused there; a route's drawer and its raw errors open beside the
list; a change made elsewhere arrives over the page's websocket."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.utils import timezone
from playwright.sync_api import Browser, Page, expect

from serving import live as serving_live
from serving.models import Route, RouteState, Service
from serving.pool_sync import sync_service_pool
from tests.nexus.factories import make_user
from tests.serving.test_services_api import make_service
from tests.support.browser import PASSWORD, committed, sign_in
from tests.support.http import LOOPBACK
from tests.support.live import LiveServer, running_nexus
from tests.support.screenshots import screenshot

pytestmark = pytest.mark.e2e


@pytest.fixture
def nexus(transactional_db: None, tmp_path: Path, data_dir: Path) -> Iterator[LiveServer]:
    owner = make_user("owner", password=PASSWORD, staff=True)
    service = make_service("chat", desired_replicas=2, environ={"VLLM_TP_SIZE": "1"})
    Service.objects.filter(pk=service.pk).update(owner=owner)
    # As the reconciler's first tick does: /serve/chat/ exists, with no replica ready yet.
    sync_service_pool(service)
    Route.objects.create(
        service=service,
        revision=service.latest_revision,
        state=RouteState.FAILED_TO_START,
        errors=[
            {
                "at": "2026-01-01T00:00:00Z",
                "message": "exited with 1",
                "exit_code": 1,
                "log_tail": "ValueError: no model at /models\n",
            }
        ],
    )
    with running_nexus(tmp_path, NEXUS_DATA_DIR=str(data_dir)) as server:
        yield server


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A page that may use the clipboard, as a person's browser lets a page copy."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.grant_permissions(["clipboard-read", "clipboard-write"])
    yield context.new_page()
    context.close()


def serve(nexus: LiveServer, secret: str) -> httpx.Response:
    return LOOPBACK.post(
        f"{nexus.url}/serve/chat/v1/chat/completions",
        headers={"Authorization": f"Bearer {secret}"},
        json={"model": "chat", "messages": [{"role": "user", "content": "hi"}]},
        timeout=10,
    )


def test_generate_copy_and_revoke_a_token_and_see_the_route_and_live_changes(
    nexus: LiveServer, page: Page
) -> None:
    sign_in(page, nexus, "/serving/services/chat/")
    expect(page.locator("#service-banner")).to_contain_text("Preparing.")
    expect(page.locator("#service-info")).to_contain_text("VLLM_TP_SIZE=1")
    expect(page.locator("[data-live-status]")).to_have_attribute("data-live-status", "open")
    screenshot(page, "serving-service-preparing")

    # The error indicator opens the raw errors; the route's drawer shows its log's tail.
    route = page.locator("#routes-running tbody tr").first
    route.get_by_role("link", name="1 error").click()
    errors = page.get_by_role("dialog", name="errors")
    expect(errors).to_contain_text('"exit_code": 1')
    errors.get_by_role("button", name="Close").click()
    # Its number is the row's id: 1 on a fresh database, any on one other tests used first.
    route.get_by_role("link", name=re.compile(r"^Route \d+$")).click()
    drawer = page.locator("#route")
    expect(drawer).to_contain_text("ValueError: no model at /models")
    screenshot(page, "serving-service-route-drawer")
    drawer.get_by_role("button", name="Close Route").click()

    # Generated with the last day it works; the secret is shown once and copied.
    last_day = timezone.localdate() + timedelta(days=14)
    page.get_by_label("Token name").fill("app")
    page.get_by_label("Valid until").fill(last_day.isoformat())
    page.get_by_role("button", name="Generate token").click()
    secret = page.locator("#issued-secret").inner_text()
    page.get_by_role("button", name="Copy the token").click()
    expect(page.get_by_role("button", name="Copy the token")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == secret
    row = page.locator("#tokens-table tr", has_text="app")
    expect(row.locator(".badge")).to_contain_text("Valid")
    expect(row).to_contain_text(f"{last_day + timedelta(days=1)} 00:00 UTC")
    screenshot(page, "serving-service-token-generated")
    # Accepted: it gets past the token check (no replica is ready, so no answer yet).
    accepted = serve(nexus, secret)
    assert accepted.status_code == 503, accepted.text

    row.get_by_role("button", name="Revoke app").click()
    expect(page.locator("#toasts")).to_contain_text("Revoked token app.")
    expect(page.locator("#tokens-table tr", has_text="app").locator(".badge")).to_contain_text(
        "Revoked"
    )
    refused = serve(nexus, secret)
    assert refused.status_code == 401
    assert refused.json()["error"]["message"] == "This token was revoked."

    # Ready elsewhere: the open page hears of it without a reload.
    def one_ready() -> None:
        service = Service.objects.get(name="chat")
        Route.objects.create(
            service=service, revision=service.latest_revision, state=RouteState.HEALTHY
        )
        serving_live.service_changed(service.pk)

    committed(one_ready)
    expect(page.locator("#service-banner")).to_contain_text(
        "Ready, degraded. 1 of 2 replicas ready"
    )
    expect(page.locator("#routes-running tbody tr")).to_have_count(2)
    page.get_by_label("Traffic").select_option("taking")
    expect(page.locator("#routes-running tbody tr:visible")).to_have_count(1)
    screenshot(page, "serving-service-filtered-routes")
