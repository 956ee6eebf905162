"""The launcher's vLLM parameter tabs in a real Chromium: fields typed into the tabs show up as
the server's flags in the command the check shows; a bad value is flagged next to its field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Locator, Page, expect

from serving import folders
from serving.models import ModelFolder
from tests.nexus.factories import make_user
from tests.support.browser import PASSWORD, sign_in
from tests.support.live import LiveServer, running_nexus
from tests.support.screenshots import screenshot

pytestmark = pytest.mark.e2e


@pytest.fixture
def nexus(transactional_db: None, tmp_path: Path, data_dir: Path) -> Iterator[LiveServer]:
    make_user("owner", password=PASSWORD, staff=True)
    folders.create_folder(ModelFolder(name="llama"))
    with running_nexus(tmp_path, NEXUS_DATA_DIR=str(data_dir)) as server:
        yield server


def typed(field: Locator, text: str) -> None:
    """Type into a field key by key, as a person does (the live check listens to keys)."""
    field.fill("")
    field.press_sequentially(text)


def test_the_vllm_tabs_turn_fields_into_the_shown_command(nexus: LiveServer, page: Page) -> None:
    sign_in(page, nexus, "/serving/services/new/")
    typed(page.get_by_label("Service name"), "chat")
    # vLLM is the launcher's first choice: its tabs are there at once.
    expect(page.get_by_label("Runtime variant")).to_have_value("vllm")
    check = page.locator("#launch-check")
    command = page.locator("#launch-command")
    tabs = page.get_by_role("tablist", name="vLLM parameters")
    expect(tabs.get_by_role("tab")).to_have_text(
        ["Model Loading", "Resource Memory", "Serving Performance", "Multimodal", "Tool Reasoning"]
    )

    # Model Loading is shown first; the other tabs' fields are hidden until chosen.
    expect(page.get_by_role("tab", name="Model Loading")).to_have_attribute("aria-selected", "true")
    expect(page.get_by_label("Max Running Sequences")).to_be_hidden()
    page.locator("#id_param_dtype").select_option("bfloat16")
    typed(page.get_by_label("Max Model Length"), "8192")
    page.get_by_role("tab", name="Serving Performance").click()
    expect(page.get_by_label("Max Model Length")).to_be_hidden()
    typed(page.get_by_label("Max Running Sequences"), "64")
    page.get_by_label("Prefix Caching").select_option("false")
    page.get_by_role("tab", name="Tool Reasoning").click()
    typed(page.get_by_label("Tool-Call Parser"), "hermes")

    expect(check).to_contain_text("Ready to start.")
    expect(command).to_have_text(
        "vllm serve /models --host 127.0.0.1 --port '${PORT}' --served-model-name llama"
        " --dtype bfloat16 --max-model-len 8192 --max-num-seqs 64 --no-enable-prefix-caching"
        " --tool-call-parser hermes"
    )
    page.get_by_role("tab", name="Serving Performance").click()
    screenshot(page, "serving-launcher-vllm-tabs")

    # A bad value: flagged next to its field, in its tab, and nothing would start.
    typed(page.get_by_label("Max Running Sequences"), "many")
    error = page.locator("#error-param_max_num_seqs")
    expect(error).to_have_text("must be an integer of at least 1, not 'many'")
    expect(error).to_be_visible()
    expect(check).to_contain_text(
        "runtime_parameters.max_num_seqs: must be an integer of at least 1, not 'many'"
    )
    expect(page.locator("#launch-command")).to_have_count(0)
    screenshot(page, "serving-launcher-vllm-tabs-bad-value")

    # Fixed: the flag is gone from the field and back in the command.
    typed(page.get_by_label("Max Running Sequences"), "32")
    expect(error).to_be_hidden()
    expect(page.locator("#launch-command")).to_contain_text("--max-num-seqs 32")


def test_multi_node_shows_what_the_workers_run(nexus: LiveServer, page: Page) -> None:
    sign_in(page, nexus, "/serving/services/new/")
    typed(page.get_by_label("Service name"), "big")
    page.get_by_label("Runtime variant").select_option("sglang")
    page.get_by_label("Multi Node").check()
    typed(page.get_by_label("Nodes per replica"), "3")
    check = page.locator("#launch-check")

    expect(check).to_contain_text("Ready to start.")
    expect(page.locator("#launch-command")).to_contain_text(
        "--nnodes 3 --node-rank '${NODE_RANK}' --dist-init-addr '${MAIN_HOST}:${DIST_PORT}'"
    )
    expect(check.locator("dt:text-is('Nodes per replica') + dd")).to_contain_text(
        "3: the main runs the command above; 2 workers run"
    )
    screenshot(page, "serving-launcher-multi-node")

    # A runtime that runs on one node only says so next to the size.
    page.get_by_label("Runtime variant").select_option("llama-cpp")
    typed(page.get_by_label("Nodes per replica"), "2")
    expect(page.locator("#error-cluster_size")).to_have_text(
        "llama.cpp runs on a single node; multi-node runtimes: vllm, sglang, simulator"
    )
