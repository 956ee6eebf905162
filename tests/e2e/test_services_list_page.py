"""The services list in a real Chromium against a real daphne: filtered by name; a service
deleted from its row's confirmation turns destroying there, then destroyed live as the
reconciler finishes it, and is found under Destroyed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from serving import live, reconciler
from serving.models import Service, ServiceLifecycle
from tests.nexus.factories import make_user
from tests.serving.test_services_api import make_service
from tests.support.browser import PASSWORD, committed, follow, sign_in
from tests.support.live import LiveServer, running_nexus
from tests.support.screenshots import screenshot

pytestmark = pytest.mark.e2e


@pytest.fixture
def nexus(transactional_db: None, tmp_path: Path, data_dir: Path) -> Iterator[LiveServer]:
    owner = make_user("owner", password=PASSWORD, staff=True)
    for name, replicas in (("chat-small", 1), ("chat-large", 2), ("embed", 3)):
        service = make_service(name, desired_replicas=replicas)
        Service.objects.filter(pk=service.pk).update(owner=owner)
    with running_nexus(tmp_path, NEXUS_DATA_DIR=str(data_dir)) as server:
        yield server


def test_filter_by_name_delete_from_the_list_and_find_it_under_destroyed(
    nexus: LiveServer, page: Page
) -> None:
    sign_in(page, nexus, "/serving/services/")
    rows = page.locator("table.services tbody tr")
    expect(rows).to_have_count(3)
    expect(page.locator("[data-live-status]")).to_have_attribute("data-live-status", "open")
    screenshot(page, "serving-services-list")

    page.get_by_label("Filter by").select_option("name")
    page.get_by_label("Value").fill("chat")
    page.get_by_role("button", name="Filter").click()
    expect(rows).to_have_count(2)
    expect(rows.first).to_contain_text("chat-large")
    expect(rows.first).to_contain_text("0 of 2 replicas ready")

    # Delete from the row: the dialog says what happens, then the row turns destroying.
    row = page.locator("tr", has=page.get_by_role("link", name="chat-small", exact=True))
    row.get_by_role("link", name="Delete chat-small").click()
    dialog = page.get_by_role("dialog", name="Delete service chat-small?")
    expect(dialog).to_contain_text("0 live routes stop taking requests")
    screenshot(page, "serving-services-delete-confirm")
    dialog.get_by_role("button", name="Delete service").click()
    expect(page.locator("#toasts")).to_contain_text("Destroying chat-small")
    row = page.locator("tr", has=page.get_by_role("link", name="chat-small", exact=True))
    expect(row.locator(".badge")).to_contain_text("Destroying")
    expect(page.get_by_label("Value")).to_have_value("")

    # The reconciler finishes it: the open page hears of it without a reload.
    expect(page.locator("[data-live-status]")).to_have_attribute("data-live-status", "open")
    deleted = committed(lambda: Service.objects.get(name="chat-small"))
    assert committed(lambda: reconciler.reconcile(deleted)) == "destroyed"
    expect(row.locator(".badge")).to_contain_text("Destroyed")
    assert committed(lambda: Service.objects.get(pk=deleted.pk).lifecycle) == (
        ServiceLifecycle.DESTROYED
    )

    follow(page, page.get_by_role("link", name="Destroyed", exact=True))
    page.get_by_label("Value").fill("small")
    page.get_by_role("button", name="Filter").click()
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("chat-small")
    screenshot(page, "serving-services-destroyed")


def test_a_push_onto_a_row_with_its_delete_dialog_open_waits_until_the_dialog_closes(
    nexus: LiveServer, page: Page
) -> None:
    sign_in(page, nexus, "/serving/services/")
    expect(page.locator("[data-live-status]")).to_have_attribute("data-live-status", "open")
    service = committed(lambda: Service.objects.get(name="chat-small"))
    row_id = f"service-{service.pk}"
    row = page.locator(f"#{row_id}")
    page.evaluate(
        """(rowId) => {
            window.pushesSeen = 0;
            document.addEventListener("htmx:oobBeforeSwap", (event) => {
                if (event.detail.target.id === rowId) window.pushesSeen += 1;
            });
        }""",
        row_id,
    )
    row.get_by_role("link", name="Delete chat-small").click()
    dialog = page.get_by_role("dialog", name="Delete service chat-small?")
    expect(dialog).to_be_visible()

    # When the service changes and its row is pushed while the dialog is open
    committed(lambda: Service.objects.filter(pk=service.pk).update(desired_replicas=4))
    committed(lambda: live.service_changed(service.pk))
    page.wait_for_function("window.pushesSeen > 0")

    # Then the dialog stays, over the row as it was, and still answers
    expect(dialog).to_be_visible()
    expect(row.locator("td.num")).to_have_text("1")
    dialog.get_by_role("button", name="Cancel").click()
    # And once it closes, the row is the pushed one
    expect(dialog).to_be_hidden()
    expect(row.locator("td.num")).to_have_text("4")
    row.get_by_role("link", name="Delete chat-small").click()
    expect(dialog).to_be_visible()
