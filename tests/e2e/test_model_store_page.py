"""The model store and the chat test (issue 16, done-when 1), in a real Chromium against a real
daphne, a Celery worker with beat (reconciler, probes) and an agent as the node: search, sort
and page size; a card's drawer with its README; a one-click deploy that lands on the endpoint
once it answers; Start chat, a streamed answer through the gateway, Stop; the page's token
revoked when the page closes; a card whose deploy asks in a modal. Marked `llama`: the real
SmolLM2 model deployed from its card answers in the chat."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect
from pytest_django.fixtures import Settings

from nexus.models import ApiToken
from serving import tokens
from serving.chat import CHAT_TOKEN_PREFIX
from serving.models import ModelFolder, ResourcePreset, Service
from serving.store_seed import (
    SIMULATOR_LARGE_FOLDER,
    SIMULATOR_SMALL_FOLDER,
    SMOLLM2_FOLDER,
    write_seeds,
)
from tests.nexus.factories import make_user
from tests.support.browser import PASSWORD, arrive, committed, sign_in
from tests.support.live import LiveServer
from tests.support.real_model import require_real_model
from tests.support.screenshots import screenshot
from tests.support.serving_stack import serving_stack
from tests.support.waiting import wait_until

# A whole stack per test (daphne, a worker, an agent, replicas): about a minute alone, more
# beside other tests on two cores, so past the e2e tier's 180 s limit.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

READY_TIMEOUT_MS = 90_000
# The llama.cpp variant's first probe is due 15 s after the start (its 5 s initial delay, then one
# 10 s interval); loading a model may take longer under load.
LLAMA_READY_TIMEOUT_MS = 180_000
GIB = 1 << 30


def only_presets() -> None:
    """Two small presets: the 70B and SmolLM2 cards fit one of them (one click), the 8B card
    both (a modal)."""
    ResourcePreset.objects.all().delete()
    ResourcePreset.objects.create(name="tiny", cpu=0.5, memory_bytes=512 << 20)
    ResourcePreset.objects.create(name="small", cpu=1.0, memory_bytes=GIB)


@pytest.fixture
def nexus(transactional_db: None, tmp_path: Path, settings: Settings) -> Iterator[LiveServer]:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    settings.DATA_DIR = data_dir
    make_user("owner", password=PASSWORD, staff=True)
    write_seeds()
    only_presets()
    with serving_stack(tmp_path, data_dir) as server:
        yield server


def card_titles(page: Page) -> list[str]:
    return page.locator("#store-cards .store-card-title").all_inner_texts()


def issue_pasted_token() -> str:
    """Return the secret of a token issued on the service's page, as a user would paste it."""
    service = Service.objects.get(name="simulator-70b")
    expires_at = timezone.now() + timedelta(hours=1)
    return tokens.issue_service_token(service, name="pasted", expires_at=expires_at)[1]


def page_tokens() -> list[ApiToken]:
    return list(ApiToken.objects.filter(name__startswith=CHAT_TOKEN_PREFIX))


def test_find_deploy_in_one_click_chat_and_deploy_through_the_modal(
    nexus: LiveServer, page: Page
) -> None:
    sign_in(page, nexus, "/store/")
    expect(page.locator("#store-cards .store-card")).to_have_count(4)
    screenshot(page, "store-gallery-seeded")

    # Search, sort, page size, Refresh.
    page.get_by_label("Search models").fill("simulat")
    expect(page.locator("#store-cards .store-card")).to_have_count(2)
    page.get_by_label("Sort").select_option("-name")
    expect(page.locator("#store-cards .store-card-title").first).to_have_text(
        "Simulated 8B chat model"
    )
    page.get_by_label("Search models").fill("nothing like it")
    expect(page.locator("#store-cards")).to_contain_text("No models found.")
    page.get_by_label("Search models").fill("")
    page.get_by_label("Sort").select_option("name")
    committed(
        lambda: [
            ModelFolder.objects.create(name=f"extra-{n:02}", project="model-store")
            for n in range(8)
        ]
    )
    page.get_by_role("link", name="Refresh").click()
    expect(page.locator("#store-cards .store-card")).to_have_count(10)
    expect(page.locator(".pager")).to_contain_text("1–10 of 12 models")
    page.get_by_label("Per page").select_option("20")
    expect(page.locator("#store-cards .store-card")).to_have_count(12)
    # A folder without the definition files is dimmed, and says why.
    expect(page.locator("#card-extra-00")).to_have_css("opacity", "0.5")
    expect(page.locator("#card-extra-00")).to_contain_text("are both needed to deploy")
    screenshot(page, "store-gallery-dimmed")

    # The drawer: detail and README; one preset and one group, so Deploy asks nothing.
    page.locator(f"#card-{SIMULATOR_LARGE_FOLDER} a").click()
    drawer = page.locator("#model-card")
    expect(drawer.get_by_role("heading", name="Simulated 70B chat model", level=1)).to_be_visible()
    expect(drawer).to_contain_text("Min resources")
    expect(drawer).to_contain_text("1 CPU, 1 GiB")
    expect(drawer.get_by_role("link", name=SIMULATOR_LARGE_FOLDER)).to_have_attribute(
        "href", f"/serving/models/{SIMULATOR_LARGE_FOLDER}/"
    )
    screenshot(page, "store-drawer-readme")
    drawer.get_by_role("button", name="Deploy").click()
    expect(drawer).to_contain_text("Deploying simulator-70b")
    arrive(page, re.compile(r"/serving/services/simulator-70b/$"), timeout=READY_TIMEOUT_MS)
    expect(page.locator("#service-readiness")).to_have_text("1 of 1 replica ready")

    # Start chat: the service preselected, a token of the page's own, a streamed answer.
    page.get_by_role("link", name="Start chat").click()
    arrive(page, re.compile(r"/chat/\?service=\d+$"))
    expect(page.locator("#chat-connection")).to_contain_text("Connected with a token")
    tokens = committed(page_tokens)
    assert [t.services for t in tokens] == [["simulator-70b"]]
    page.get_by_label("Message").fill("Hello there")
    page.get_by_role("button", name="Send").click()
    # Token by token: text shows while the reply is still being written.
    streaming = page.locator(".chat-assistant[aria-busy=true] .chat-text")
    expect(streaming).not_to_have_text("")
    reply = page.locator(".chat-assistant .chat-text").last
    expect(page.locator(".chat-assistant[aria-busy=true]")).to_have_count(0, timeout=30_000)
    expect(reply).not_to_have_text("")
    expect(page.locator("#chat-answered-by")).to_have_text(
        re.compile(r"^route-\d+$")
    )  # the replica
    expect(page.locator("#chat-ttft")).to_have_text(re.compile(r"\d+(\.\d)? (ms|s)$"))
    expect(page.locator("#chat-speed")).to_have_text(re.compile(r"tok/s$"))
    screenshot(page, "chat-streamed-answer")

    # Stop cuts a reply short; what was written stays.
    page.get_by_label("Message").fill("And again")
    page.get_by_role("button", name="Send").click()
    expect(streaming).not_to_have_text("")
    page.get_by_role("button", name="Stop").click()
    expect(page.locator(".chat-note").last).to_have_text("Stopped.")

    # The settings: what the page chose; and any endpoint, with a token pasted in.
    page.locator("#chat-settings summary").click()
    expect(page.get_by_label("Base URL")).to_have_value(f"{nexus.url}/v1")
    expect(page.get_by_label("Model", exact=True)).to_have_value("@pool/simulator-70b")
    pasted = committed(issue_pasted_token)
    page.get_by_label("Talk to").select_option("")
    # Choosing another target revokes the page's token.
    wait_until(
        lambda: committed(lambda: all(t.is_revoked for t in page_tokens())),
        timeout_s=10,
        what="the page's token revoked when another target was chosen",
    )
    page.get_by_label("Base URL").fill(f"{nexus.url}/v1")
    page.get_by_label("Model", exact=True).fill("@pool/simulator-70b")
    page.get_by_label("Token", exact=True).fill(pasted)
    page.get_by_label("Message").fill("Through the settings")
    page.get_by_role("button", name="Send").click()
    expect(page.locator(".chat-assistant[aria-busy=true]")).to_have_count(0, timeout=30_000)
    expect(page.locator(".chat-assistant .chat-text").last).not_to_have_text("")
    expect(page.locator(".chat-note")).to_have_count(0)

    # Closing the page revokes its token.
    page.get_by_label("Talk to").select_option(label="simulator-70b (private)")
    expect(page.locator("#chat-connection")).to_contain_text("Connected with a token")
    assert len(committed(page_tokens)) == 2
    chat_page = page
    page = chat_page.context.new_page()
    chat_page.close(run_before_unload=True)
    wait_until(
        lambda: committed(lambda: all(t.is_revoked for t in page_tokens())),
        timeout_s=10,
        what="the chat page's token revoked on close",
    )

    # A card with several presets across two runtime variants: the modal asks.
    page.goto(f"{nexus.url}/store/?q=8B")
    page.locator(f"#card-{SIMULATOR_SMALL_FOLDER} a").click()
    page.locator("#model-card").get_by_role("link", name="Deploy").click()
    modal = page.locator(f"#deploy-modal-{SIMULATOR_SMALL_FOLDER}")
    expect(modal).to_be_visible()
    expect(modal.locator("optgroup")).to_have_count(2)
    modal.get_by_label("Preset").select_option("simulator:tiny")
    screenshot(page, "store-deploy-modal")
    modal.get_by_role("button", name="Deploy").click()
    arrive(page, re.compile(r"/serving/services/simulator-8b/$"))
    expect(page.locator("#toasts")).to_contain_text("Deployed Simulated 8B chat model")


@pytest.fixture
def real_model() -> Path:
    """SmolLM2's .gguf (asked for before the stack starts: without it the test is skipped)."""
    return require_real_model()


@pytest.mark.llama
def test_the_real_llama_cpp_model_deploys_from_its_card_and_answers_in_the_chat(
    real_model: Path, nexus: LiveServer, page: Page
) -> None:
    sign_in(page, nexus, "/store/")
    page.locator(f"#card-{SMOLLM2_FOLDER} a").click()
    drawer = page.locator("#model-card")
    expect(drawer).to_contain_text("llama.cpp: 1 CPU, 1 GiB")
    drawer.get_by_role("button", name="Deploy").click()
    arrive(
        page, re.compile(rf"/serving/services/{SMOLLM2_FOLDER}/$"), timeout=LLAMA_READY_TIMEOUT_MS
    )

    page.get_by_role("link", name="Start chat").click()
    expect(page.locator("#chat-connection")).to_contain_text("Connected with a token")
    # A model this small sometimes ends its turn at once: a few tries, each a new conversation.
    for _ in range(3):
        page.get_by_role("button", name="New conversation").click()
        page.get_by_label("Message").fill("Say hello in five words.")
        page.get_by_role("button", name="Send").click()
        expect(page.locator(".chat-assistant[aria-busy=true]")).to_have_count(0, timeout=60_000)
        if page.locator(".chat-assistant .chat-text").last.inner_text().strip():
            break
    expect(page.locator(".chat-assistant .chat-text").last).to_have_text(re.compile(r"\S"))
    expect(page.locator("#chat-ttft")).not_to_have_text("—")
    screenshot(page, "chat-real-model-answer")
