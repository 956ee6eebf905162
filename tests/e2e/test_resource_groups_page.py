"""The resource groups page in a real Chromium against a real daphne: staff create a group of
chosen nodes, then change which nodes it spans."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from serving.models import ResourceGroup
from tests.deployments.factories import make_node
from tests.nexus.factories import make_user
from tests.support.browser import PASSWORD, committed, follow, sign_in
from tests.support.live import LiveServer, running_nexus
from tests.support.screenshots import screenshot

pytestmark = pytest.mark.e2e


@pytest.fixture
def nexus(transactional_db: None, tmp_path: Path) -> Iterator[LiveServer]:
    make_user("owner", password=PASSWORD, staff=True)
    for name in ("gpu-a", "gpu-b", "cpu-a"):
        make_node(name)
    with running_nexus(tmp_path) as server:
        yield server


def test_staff_create_a_group_and_change_its_nodes(nexus: LiveServer, page: Page) -> None:
    sign_in(page, nexus, "/serving/resource-groups/")
    expect(page.locator("#resource-group-default")).to_contain_text("Every trusted node")

    page.get_by_label("Name").fill("gpu")
    page.get_by_label("Description").fill("The GPU machines.")
    page.get_by_label("gpu-a").check()
    page.get_by_role("button", name="Create group").click()
    expect(page.locator("#toasts")).to_contain_text("Created resource group gpu.")
    expect(page.locator("#resource-group-gpu")).to_contain_text("gpu-a")
    screenshot(page, "serving-resource-groups-list")

    follow(page, page.get_by_role("link", name="Edit gpu"))
    expect(page.get_by_label("Name")).to_be_disabled()
    page.get_by_label("gpu-b").check()
    screenshot(page, "serving-resource-groups-edit")
    page.get_by_role("button", name="Save").click()
    expect(page.locator("#resource-group-gpu")).to_contain_text("gpu-a, gpu-b")
    nodes = committed(
        lambda: sorted(ResourceGroup.objects.get(name="gpu").nodes.values_list("name", flat=True))
    )
    assert nodes == ["gpu-a", "gpu-b"]
