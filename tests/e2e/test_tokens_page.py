"""The tokens page in a real Chromium against a real daphne and engine (done-when 4 of issue 10):
issue a token, call the pool with the snippet the page shows, see its usage appear, revoke it,
and see the next call refused."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.nexus.factories import make_pool, make_target, make_user
from tests.support.browser import PASSWORD, follow, sign_in
from tests.support.live import LiveServer, running_nexus
from tests.support.screenshots import screenshot
from tests.support.simulator import running_simulator

pytestmark = pytest.mark.e2e


@pytest.fixture
def nexus(transactional_db: None, tmp_path: Path) -> Iterator[LiveServer]:
    make_user("owner", staff=True, password=PASSWORD)
    with running_simulator(model="demo-8b", ttft_ms=0, tpot_ms=1) as engine:
        pool = make_pool("chat", name="Chat models")
        make_target(pool, "gpu-a", base_url=engine.base_url, model_id="demo-8b")
        with running_nexus(tmp_path) as server:
            yield server


def run_snippet(snippet: str) -> str:
    """Run the curl snippet exactly as the page shows it; return what it printed."""
    done = subprocess.run(
        ["bash", "-c", snippet], capture_output=True, text=True, timeout=30, check=True
    )
    return done.stdout


def test_issue_call_with_the_snippet_see_usage_revoke_and_be_refused(
    nexus: LiveServer, page: Page
) -> None:
    sign_in(page, nexus, "/tokens/")
    expect(page.get_by_text("No tokens yet")).to_be_visible()

    follow(page, page.locator("#tokens-table").get_by_role("link", name="Issue token"))
    page.get_by_label("Name").fill("support-bot")
    page.get_by_label("chat").check()
    page.get_by_label("Requests per minute").fill("60")
    page.get_by_label("Tokens per minute").fill("10000")
    screenshot(page, "tokens-new-form")
    page.get_by_role("button", name="Issue token").click()

    expect(page.get_by_role("heading", name="Token support-bot issued")).to_be_visible()
    secret = page.locator("[data-secret]").inner_text()
    curl = page.locator("#issued-snippets code[data-language=sh]").inner_text()
    assert secret in curl and f"{nexus.url}/v1/chat/completions" in curl
    assert '"model": "@pool/chat"' in curl
    screenshot(page, "tokens-issued-secret")

    answer = run_snippet(curl)
    assert "data: [DONE]" in answer, answer

    # The usage is written with the history's next batch: reload until it shows.
    page.goto(f"{nexus.url}/tokens/")
    row = page.locator('tr[data-token="support-bot"]')
    deadline = time.monotonic() + 15
    while "1 request" not in row.locator("[data-usage=day]").inner_text():
        assert time.monotonic() < deadline, "the usage never appeared"
        time.sleep(0.5)
        page.reload()
    expect(row.locator("[data-usage=day]")).to_contain_text("tokens")
    expect(row.locator("[data-limits]")).to_have_text("60 req/min10,000 tok/min")
    expect(row).to_contain_text("Valid")
    expect(row).to_contain_text("@pool/chat")
    assert secret not in page.content()
    screenshot(page, "tokens-list-usage")

    row.get_by_role("link", name="Revoke").click()
    dialog = page.locator("dialog[open]")
    expect(dialog).to_contain_text("is refused from now on")
    dialog.get_by_role("button", name="Revoke token").click()
    row = page.locator('tr[data-token="support-bot"]')
    expect(row).to_contain_text("Revoked")

    # Every gateway follows the revocation within about a second.
    deadline = time.monotonic() + 10
    while "This token was revoked." not in (refused := run_snippet(curl)):
        assert time.monotonic() < deadline, f"the revoked token still works: {refused}"
        time.sleep(0.3)
    assert "data: [DONE]" not in refused
    screenshot(page, "tokens-list-revoked")
