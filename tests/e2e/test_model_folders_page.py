"""Model folder pages in a real Chromium against a real daphne: create, upload, view, delete."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.nexus.factories import make_user
from tests.support.browser import PASSWORD, arrive, sign_in
from tests.support.live import LiveServer, running_nexus
from tests.support.screenshots import screenshot

pytestmark = pytest.mark.e2e

MODEL_DEFINITION = """models:
  - name: llama
    model_path: /models
    service:
      start_command: python -m vllm.entrypoints.openai.api_server --port 8000
      port: 8000
      health_check:
        path: /health
"""


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """The server's own data dir, so that its model folders start empty and vanish afterwards."""
    path = tmp_path / "data"
    path.mkdir()
    return path


@pytest.fixture
def nexus(transactional_db: None, tmp_path: Path, data_dir: Path) -> Iterator[LiveServer]:
    make_user("owner", password=PASSWORD, staff=True)
    with running_nexus(tmp_path, NEXUS_DATA_DIR=str(data_dir)) as server:
        yield server


def test_an_owner_creates_a_folder_uploads_views_and_deletes_a_model_definition(
    nexus: LiveServer, page: Page, data_dir: Path, tmp_path: Path
) -> None:
    definition = tmp_path / "model-definition.yaml"
    definition.write_text(MODEL_DEFINITION)
    sign_in(page, nexus, "/serving/models/")
    expect(page.get_by_text("No model folders yet.")).to_be_visible()

    # Create: htmx swaps in the table with the new folder, without reloading the page.
    page.evaluate("window.loadedOnce = true")
    page.get_by_label("Name").fill("llama-3.1-8b")
    page.get_by_label("Description").fill("Meta's 8B instruct")
    page.get_by_role("button", name="Create folder").click()
    row = page.locator("#model-folder-llama-3\\.1-8b")
    expect(row).to_contain_text("Meta's 8B instruct")
    expect(page.get_by_role("status")).to_contain_text("Created model folder llama-3.1-8b.")
    assert page.evaluate("window.loadedOnce") is True
    assert (data_dir / "models" / "llama-3.1-8b").is_dir()

    # Upload: the file is listed, and the folder now has a model definition.
    row.get_by_role("link", name="llama-3.1-8b").click()
    arrive(page, f"{nexus.url}/serving/models/llama-3.1-8b/")
    page.get_by_label("File").set_input_files(definition)
    page.get_by_role("button", name="Upload").click()
    expect(page.locator("#toasts")).to_contain_text("Uploaded model-definition.yaml")
    files = page.locator("#files-table")
    expect(files.locator("tbody tr")).to_have_count(1)
    expect(files.locator("tbody tr")).to_contain_text("model-definition.yaml")
    expect(files.locator(".facts")).to_contain_text("Model definition model-definition.yaml")
    screenshot(page, "serving-folder-uploaded")

    # View: the text as uploaded.
    files.get_by_role("link", name="model-definition.yaml").click()
    arrive(page, re.compile(r"/serving/models/llama-3\.1-8b/files/model-definition"))
    assert page.locator("pre").inner_text() == MODEL_DEFINITION
    page.go_back()

    # Delete the file: confirmed, then the table is swapped in without it.
    page.once("dialog", lambda dialog: dialog.accept())
    files.get_by_role("button", name="Delete model-definition.yaml").click()
    expect(files).to_contain_text("Deleted model-definition.yaml.")
    expect(files).to_contain_text("No files yet")
    assert list((data_dir / "models" / "llama-3.1-8b").iterdir()) == []

    # Delete the folder: a confirmation dialog that counts the files, then the list without it.
    page.get_by_role("link", name="Delete folder").click()
    expect(page.get_by_role("heading", name="Delete model folder llama-3.1-8b?")).to_be_visible()
    page.get_by_role("button", name="Delete folder").click()
    arrive(page, f"{nexus.url}/serving/models/")
    expect(page.locator("#toasts")).to_contain_text("Deleted model folder llama-3.1-8b")
    expect(page.get_by_text("No model folders yet.")).to_be_visible()
    assert list((data_dir / "models").iterdir()) == []
