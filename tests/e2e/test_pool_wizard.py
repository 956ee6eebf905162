"""The create-pool wizard in a real Chromium, daphne, an agent and two engines: a node added and
its fingerprint confirmed on the first step, an Exact-replicas pool of the node's model and a
provider endpoint with its own key (never shown again), the identity confirmed explicitly, and
the `openai` SDK calling the new pool through the gateway."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from nexus.models import ApiToken
from pools.models import IdentityConfirmation, Target
from tests.nexus.factories import make_user
from tests.nodes.fleet import SIM_MODEL, agent_args, serve_simulator
from tests.support.agent import RunningAgent, running_agent
from tests.support.browser import PASSWORD, arrive, committed, follow, sign_in
from tests.support.live import LiveServer, running_nexus
from tests.support.screenshots import screenshot
from tests.support.simulator import running_simulator

pytestmark = pytest.mark.e2e

PROVIDER_KEY = "sk-provider-typed-into-the-wizard"


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[RunningAgent]:
    with running_agent(tmp_path, name="gpu-box", args=agent_args()) as running:
        serve_simulator(running)
        yield running


@pytest.fixture
def nexus(transactional_db: None, tmp_path: Path) -> Iterator[LiveServer]:
    make_user("operator", password=PASSWORD, staff=True)
    with running_nexus(tmp_path) as server:
        yield server


def next_step(page: Page, title: str) -> None:
    page.get_by_role("button", name="Next").click()
    expect(page.locator('[aria-current="step"]')).to_have_text(title)


def test_an_operator_creates_an_exact_replicas_pool_step_by_step_and_calls_it(
    nexus: LiveServer, agent: RunningAgent, page: Page
) -> None:
    with running_simulator(
        model=SIM_MODEL, ttft_ms=0, tpot_ms=0, concurrency=6, api_key=PROVIDER_KEY
    ) as provider:
        sign_in(page, nexus, "/pools/", username="operator")
        follow(page, page.get_by_role("link", name="Add pool").first)

        # 1. Nodes: one added here, its fingerprint compared and confirmed.
        expect(page.locator('[aria-current="step"]')).to_have_text("1. Nodes")
        add_node = page.locator("#add-node")
        add_node.get_by_label("Name").fill("gpu-box")
        add_node.get_by_label("Address").fill(agent.url)
        add_node.get_by_label("Credential").fill(agent.credential)
        add_node.get_by_role("button", name="Add node").click()
        expect(page.locator("[data-fingerprint]")).to_have_text(agent.fingerprint)
        assert agent.credential not in page.content()
        screenshot(page, "pools-wizard-nodes-fingerprint")
        page.get_by_role("button", name="Confirm fingerprint").click()
        expect(page.locator("#toasts")).to_contain_text("Node gpu-box is trusted")
        page.locator("#toasts").get_by_role("button", name="Dismiss").click()
        expect(page.get_by_role("checkbox", name=re.compile(r"^gpu-box · online"))).to_be_checked()
        screenshot(page, "pools-wizard-nodes")
        next_step(page, "2. Name and slug")

        # 2. Name and slug, the slug checked as it is typed.
        page.get_by_label("Name").fill("Replicas")
        page.get_by_label("Slug").fill("replicas")
        expect(page.locator("#slug-check")).to_have_text("@pool/replicas is free.")
        screenshot(page, "pools-wizard-name")
        next_step(page, "3. Compatibility")

        # 3. Compatibility, each mode with its caveat.
        page.get_by_role("radio", name=re.compile(r"^Exact replicas")).check()
        screenshot(page, "pools-wizard-compatibility")
        next_step(page, "4. Targets")

        # 4. Targets: the node's model, and a provider endpoint with its own key.
        add = page.locator("#add-target")
        add.get_by_role("radio", name="A model on a chosen node").check()
        add.get_by_label("Model on a node").select_option(
            label=f"{SIM_MODEL} on gpu-box (simulator)"
        )
        add.get_by_role("button", name="Add target").click()
        add.get_by_role("radio", name="A provider endpoint, with its own key").check()
        add.get_by_label("Name").fill("provider")
        add.get_by_label("Base URL").fill(provider.base_url)
        add.get_by_label("Model id").fill(SIM_MODEL)
        add.get_by_label("API key").fill(PROVIDER_KEY)
        add.get_by_role("button", name="Add target").click()
        rows = page.locator("#draft-targets tbody tr")
        expect(rows).to_have_count(2)
        expect(page.locator('#draft-targets tr[data-target="provider"]')).to_contain_text("set")
        assert PROVIDER_KEY not in page.content()
        screenshot(page, "pools-wizard-targets")
        next_step(page, "5. Strategy")

        # 5. Strategy: Smart, recommended, is chosen already.
        expect(
            page.get_by_role("radio", name=re.compile(r"^Smart \(recommended\)"))
        ).to_be_checked()
        screenshot(page, "pools-wizard-strategy")
        next_step(page, "6. Priority and capacity")

        # 6. Priority and capacity: a provider tells nothing, so the operator sets it.
        page.get_by_label("Capacity weight of provider").fill("6")
        page.get_by_label("Priority of provider").fill("1")
        screenshot(page, "pools-wizard-weights")
        next_step(page, "7. Validate and dry run")

        # 7. Validate and Dry run on the draft; the identity confirmed explicitly.
        report = page.locator("#validate-report")
        expect(report).to_contain_text("No content digest for gpu-box, provider")
        expect(report.locator('[data-target="provider"]')).to_contain_text(
            "The credential is accepted."
        )
        page.get_by_role("button", name="Next").click()
        expect(page.locator("#identity .errorlist")).to_contain_text(
            "Identity cannot be proven: confirm it"
        )
        page.get_by_role("checkbox", name=re.compile(r"^I confirm these 2 targets")).check()
        # The refusal was about the unticked box: ticking it hides it.
        expect(page.locator("#identity .errorlist")).to_be_hidden()
        expect(page.locator("#validate-report")).to_be_visible()
        page.locator("#dry-run").get_by_role("button", name="Dry run").click()
        expect(page.locator("#dry-run [data-chosen]")).to_be_visible()
        screenshot(page, "pools-wizard-check")
        next_step(page, "8. Summary")

        # 8. Summary, the key only as "set"; Create.
        summary = page.locator("#summary")
        expect(summary).to_contain_text("@pool/replicas")
        expect(summary).to_contain_text("confirmed by you")
        assert PROVIDER_KEY not in page.content()
        screenshot(page, "pools-wizard-summary")
        page.get_by_role("button", name="Create pool").click()

        # 9. How to call it.
        arrive(page, f"{nexus.url}/pools/replicas/created/")
        expect(page.locator(".model-name code")).to_have_text("@pool/replicas")
        assert PROVIDER_KEY not in page.content()
        _, secret = committed(
            lambda: ApiToken.issue(
                "sdk", pools=["replicas"], created_by=User.objects.get(username="operator")
            )
        )
        page.reload()
        expect(page.locator("[data-token-chooser] option")).to_have_count(2)
        screenshot(page, "pools-wizard-created")
        follow(page, page.get_by_role("link", name="Open the pool"))
        expect(page.locator("#pool-live")).to_contain_text("key stored")
        assert PROVIDER_KEY not in page.content()

        targets = committed(
            lambda: {t.name: (t.node_id is not None, t.get_credential()) for t in
                     Target.objects.filter(pool__slug="replicas")}
        )  # fmt: skip
        assert targets == {"gpu-box": (True, ""), "provider": (False, PROVIDER_KEY)}
        confirmed = committed(lambda: IdentityConfirmation.objects.get(pool__slug="replicas"))
        assert confirmed.confirmed_by_name == "operator"

        client = openai.OpenAI(base_url=f"{nexus.url}/v1", api_key=secret, max_retries=0)
        answers = [
            client.chat.completions.create(
                model="@pool/replicas",
                messages=[{"role": "user", "content": "Hello"}],
                max_tokens=4,
            )
            for _ in range(4)
        ]
    assert all(answer.choices[0].message.content for answer in answers)
    assert {answer.model for answer in answers} == {SIM_MODEL}
