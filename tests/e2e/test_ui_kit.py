"""The console kit's style guide in a real Chromium against a real daphne: every component works
as a user drives it, and the browser writes numbers exactly as the server does."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from playwright.sync_api import Browser, Page, expect

from nexus.models import ApiToken
from nexus.ui import badges, format
from tests.nexus.factories import make_user
from tests.support.browser import PASSWORD, arrive, committed, sign_in
from tests.support.live import LiveServer, running_nexus
from tests.support.screenshots import screenshot

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def nexus(
    committed_db: None, django_db_blocker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    """One Nexus for the module: its tests only read what is made here (the suite empties the
    database after the module)."""
    with django_db_blocker.unblock():
        owner = make_user("owner", staff=True, password=PASSWORD)
        make_user("teammate", password=PASSWORD)
        ApiToken.issue("ci", created_by=owner)
    with running_nexus(tmp_path_factory.mktemp("ui-kit")) as server:
        yield server


@pytest.fixture(autouse=True)
def database(django_db_blocker) -> Iterator[None]:
    """The tests read the module's rows (`committed`, in a thread of its own)."""
    with django_db_blocker.unblock():
        yield


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A page that may use the clipboard, as a person's browser lets a page copy."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.grant_permissions(["clipboard-read", "clipboard-write"])
    yield context.new_page()
    context.close()


def test_the_style_guide_shows_every_badge_state_in_its_tone(nexus: LiveServer, page: Page) -> None:
    sign_in(page, nexus, "/ui/kit/")

    for kind, states in badges.CATALOGUE.items():
        row = page.locator(f'.kit-row[data-kind="{kind}"] .badge')
        expect(row).to_have_count(len(states))
        for index, (state, look) in enumerate(states.items()):
            badge = row.nth(index)
            expect(badge).to_have_text(f"{look.icon} {look.label}")
            expect(badge).to_have_attribute("data-tone", str(look.tone))
            expect(badge).to_have_attribute("data-state", state)
            expect(badge).to_have_attribute("title", look.reason)
    examples = page.locator("#kit-badge-examples .badge")
    expect(examples.nth(0)).to_have_text("◐ Draining (3 in flight)")
    expect(examples.nth(1)).to_have_text("✕ Ejected (trial in 12 s, 3 connect errors)")
    expect(examples.nth(2)).to_have_text("✕ Node offline (since 3 min ago, connection refused)")
    expect(examples.nth(3)).to_have_text("◐ Running (downloading, 42 %)")
    expect(examples.nth(6)).to_have_text("○ Drained")


def test_the_live_part_arrives_on_connect_and_on_every_push(nexus: LiveServer, page: Page) -> None:
    sign_in(page, nexus, "/ui/kit/")
    indicator = page.locator("[data-live-status]")
    expect(indicator).to_have_text("Live")
    expect(indicator).to_be_visible()
    first = page.locator("#kit-live time").first.get_attribute("datetime")
    page.evaluate("window.loadedOnce = true")

    with page.expect_response(lambda r: r.url.endswith("/ui/kit/push/")) as pushed:
        page.get_by_role("button", name="Push an update").click()

    assert pushed.value.status == 204  # the page's CSRF token went with the htmx post
    expect(page.locator("#kit-live time").first).not_to_have_attribute("datetime", first or "")
    assert page.evaluate("window.loadedOnce") is True


def test_copy_announces_and_the_token_chooser_fills_the_snippets(
    nexus: LiveServer, page: Page
) -> None:
    sign_in(page, nexus, "/ui/kit/")
    prefix = committed(lambda: ApiToken.objects.get(name="ci").prefix)

    page.get_by_role("button", name="Copy the model name").click()

    expect(page.get_by_role("button", name="Copy the model name")).to_have_text("Copied")
    expect(page.locator("#announcer")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == "@pool/chat"

    snippets = page.locator("#kit-snippets")
    curl = snippets.locator("code").first
    expect(curl).to_contain_text(f"curl -N {nexus.url}/v1/chat/completions")
    expect(curl).to_contain_text('"model": "@pool/chat"')
    expect(curl).to_contain_text("Bearer $NEXUS_TOKEN")
    snippets.get_by_label("Token").select_option(f"{prefix}…")
    expect(curl).to_contain_text(f"Bearer {prefix}…")
    snippets.get_by_role("tab", name="Python (openai)").click()
    python = snippets.get_by_role("tabpanel")
    expect(python).to_contain_text(f'OpenAI(base_url="{nexus.url}/v1", api_key="{prefix}…")')
    python.get_by_role("button", name="Copy").click()
    assert page.evaluate("navigator.clipboard.readText()").startswith("from openai import OpenAI")


def test_tabs_follow_clicks_and_arrow_keys(nexus: LiveServer, page: Page) -> None:
    sign_in(page, nexus, "/ui/kit/")
    tabs = page.locator("#kit-params")

    tabs.get_by_role("tab", name="SGLang").click()
    expect(tabs.get_by_role("tabpanel")).to_have_text("The SGLANG_* variables.")
    page.keyboard.press("ArrowRight")

    expect(tabs.get_by_role("tab", name="llama.cpp")).to_be_focused()
    expect(tabs.get_by_role("tab", name="llama.cpp")).to_have_attribute("aria-selected", "true")
    expect(tabs.get_by_role("tabpanel")).to_have_text("Slots (--parallel), context size.")


def test_the_drawer_opens_beside_the_page_and_escape_closes_it(
    nexus: LiveServer, page: Page
) -> None:
    sign_in(page, nexus, "/ui/kit/")

    page.get_by_role("link", name="Open the detail drawer").click()

    drawer = page.get_by_role("dialog", name="Route 12")
    expect(drawer).to_be_visible()
    expect(drawer).to_contain_text("! Degraded")
    arrive(page, f"{nexus.url}/ui/kit/")
    page.keyboard.press("Escape")
    expect(drawer).to_be_hidden()


def test_a_destructive_action_confirms_in_a_dialog_then_toasts(
    nexus: LiveServer, page: Page
) -> None:
    sign_in(page, nexus, "/ui/kit/")
    opener = page.locator("#kit-overlays").get_by_role("button", name="Delete the sample…")

    opener.click()
    dialog = page.get_by_role("dialog", name="Delete the sample service?")
    expect(dialog).to_contain_text("1 live route stops; 12 finished routes are kept in history.")
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_be_hidden()
    opener.click()
    dialog.get_by_role("button", name="Delete service").click()

    toast = page.locator(".toast")
    expect(toast).to_have_text("Confirmed: nothing was deleted, this is the UI kit. ✕")
    expect(toast).to_have_attribute("data-level", "success")
    arrive(page, f"{nexus.url}/ui/kit/")


def test_a_refused_form_keeps_its_values_beside_their_errors_but_no_secret(
    nexus: LiveServer, page: Page
) -> None:
    sign_in(page, nexus, "/ui/kit/")
    form = page.locator("#kit-form")

    form.get_by_label("Name").fill("taken")
    form.get_by_label("Replicas").fill("99")
    form.get_by_label("Provider key").fill("sk-typed-secret")
    form.get_by_role("button", name="Save sample").click()

    expect(form.get_by_label("Name")).to_have_value("taken")
    expect(form.get_by_label("Replicas")).to_have_value("99")
    expect(form.get_by_label("Provider key")).to_have_value("")
    expect(form.locator("#id_name_error")).to_have_text("A pool named taken exists.")
    expect(form.get_by_label("Replicas")).to_have_attribute("aria-invalid", "true")
    expect(form.locator("#id_replicas_error")).to_have_text(
        "Ensure this value is less than or equal to 64."
    )
    expect(form.locator(".secret-again")).to_have_text(
        "Type it again: a secret is never sent back to the page."
    )
    assert "sk-typed-secret" not in page.content()


def test_charts_share_one_window_and_draw_their_legends(nexus: LiveServer, page: Page) -> None:
    sign_in(page, nexus, "/ui/kit/")
    charts = page.locator("#kit-charts")

    expect(charts.locator("figure[data-chart] canvas")).to_have_count(2)
    expect(charts.locator("#kit-requests figcaption")).to_have_text("Requests req/s")
    expect(charts.locator("#kit-requests .u-legend")).to_contain_text("fast")
    expect(charts.locator("#kit-requests .u-legend")).to_contain_text("slow")
    expect(charts.locator("#kit-ttft .u-legend")).to_contain_text("p95")
    windows = page.evaluate(
        "[...NexusCharts.plots.values()].map(({plot}) => plot.scales.x.max - plot.scales.x.min)"
    )
    assert windows == [900, 900]
    charts.locator("select[data-chart-window]").select_option("300")
    windows = page.evaluate(
        "[...NexusCharts.plots.values()].map(({plot}) => plot.scales.x.max - plot.scales.x.min)"
    )
    assert windows == [300, 300]
    bars = charts.locator(".bar-chart .bar-value")
    expect(bars).to_have_text(["60 % · 84", "29 % · 41", "11 % · 15"])


def test_the_browser_writes_numbers_as_the_server_does(nexus: LiveServer, page: Page) -> None:
    sign_in(page, nexus, "/ui/kit/")
    now = datetime(2025, 1, 2, 13, 4, 5, tzinfo=UTC)
    durations = [0, 0.0004, 0.0025, 0.038, 0.9996, 1, 1.25, 9.96, 42.5, 60, 185, 3600, 5700, 90061]
    rates = [0, 0.25, 2.5, 9.99, 17.2, 958.3, 12400]
    sizes = [0, 512, 1536, 268435456, 1610612736, 1073741823, 5 * 1024**4]
    ratios = [0, 0.005, 0.095, 0.3125, 1]
    moments = [now, now - timedelta(seconds=42), now - timedelta(seconds=119),
               now - timedelta(hours=2, minutes=5), now - timedelta(days=3),
               now - timedelta(days=45), now + timedelta(seconds=12)]  # fmt: skip
    python = {
        "duration": [format.duration(s) for s in durations],
        "rate": [format.rate(r, "tok") for r in rates],
        "binarySize": [format.binary_size(b) for b in sizes],
        "percent": [format.percent(r) for r in ratios],
        "ago": [format.ago(m, now) for m in moments],
    }

    # nexus.js is deferred: it may still be running when the sign-in lands on the page.
    page.wait_for_function("() => window.Nexus !== undefined")
    browser = page.evaluate(
        """([durations, rates, sizes, ratios, moments, now]) => ({
            duration: durations.map(Nexus.format.duration),
            rate: rates.map((r) => Nexus.format.rate(r, "tok")),
            binarySize: sizes.map(Nexus.format.binarySize),
            percent: ratios.map((r) => Nexus.format.percent(r)),
            ago: moments.map((m) => Nexus.format.ago(Date.parse(m), Date.parse(now))),
        })""",
        [durations, rates, sizes, ratios, [m.isoformat() for m in moments], now.isoformat()],
    )

    assert browser == python


def test_the_style_guide_is_for_staff_only(nexus: LiveServer, page: Page) -> None:
    sign_in(page, nexus, "/pools/", username="teammate")

    response = page.goto(f"{nexus.url}/ui/kit/")

    assert response is not None and response.status == 403
    page.goto(f"{nexus.url}/pools/")
    expect(page.get_by_role("link", name="UI kit")).to_have_count(0)


def test_a_wide_table_scrolls_inside_its_card_and_the_page_fits_the_window(
    nexus: LiveServer, page: Page
) -> None:
    sign_in(page, nexus, "/ui/kit/")
    expect(page.locator("[data-live-status]")).to_have_text("Live")
    expect(page.locator("#kit-charts canvas")).to_have_count(2)

    path = screenshot(page, "ui-kit")

    assert path.stat().st_size > 0
    card = page.locator("#kit-wide")
    assert card.evaluate("card => card.scrollWidth > card.clientWidth")
