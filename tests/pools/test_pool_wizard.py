"""The create-pool wizard: one screen per step of the document, its draft in the session, each
step's errors next to their fields, Validate and Dry run before anything exists, and Create
through the same service functions as the API."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils.html import escape

from nexus.models import DEFAULT_PROJECT, ConfigVersion, Project
from nodes.models import NodeModel
from pools import wizard
from pools.models import SLUG_TAKEN, IdentityConfirmation, Pool, Target
from tests.deployments.factories import make_node
from tests.nexus.factories import make_pool, make_user
from tests.support.personas import default_viewer, make_cast
from tests.support.simulator import running_simulator

pytestmark = pytest.mark.django_db

PROVIDER_KEY = "sk-wizard-provider-key-never-shown"
NAME = {"name": "Chat", "slug": "chat", "project": DEFAULT_PROJECT, "description": ""}


@pytest.fixture
def operator() -> Client:
    client = Client()
    client.force_login(make_user("operator", staff=True))
    return client


def start(client: Client) -> str:
    """Open Add pool; return the new draft's id."""
    response = client.get("/pools/new/")
    assert response.status_code == 302
    draft_id = response["Location"].split("/")[3]
    assert response["Location"] == f"/pools/new/{draft_id}/nodes/"
    return draft_id


def url(draft_id: str, step: str) -> str:
    return f"/pools/new/{draft_id}/{step}/"


def field_group(page: str, name: str) -> str:
    """Return the markup of one field's group (label, input, errors, help)."""
    return page.split(f'for="id_{name}"', 1)[1].split('<div class="field', 1)[0]


def provider(**fields: str) -> dict[str, str]:
    return {"source": "provider", "name": "openai", "base_url": "https://api.example.com/v1",
            "model_id": "gpt-4o-mini", "kinds": ["chat"], "credential": PROVIDER_KEY,
            **fields}  # fmt: skip


def draft_with_a_provider(client: Client) -> str:
    """Walk a draft to the check step: named, Exact replicas, one provider target."""
    draft_id = start(client)
    client.post(url(draft_id, "name"), NAME)
    client.post(url(draft_id, "compatibility"), {"compatibility_mode": "exact_replicas"})
    assert client.post(f"/pools/new/{draft_id}/targets/add/", provider()).status_code == 302
    return draft_id


def test_add_pool_opens_the_first_step_of_a_new_draft(operator: Client) -> None:
    draft_id = start(operator)

    page = operator.get(url(draft_id, "nodes")).content.decode()

    assert '<li aria-current="step"><strong>1. Nodes</strong>' in page
    assert "9. Call it" in page
    assert start(operator) != draft_id  # another tab, another draft


def test_a_viewer_may_not_create_a_pool() -> None:
    teammate = Client()
    teammate.force_login(default_viewer("teammate"))

    assert teammate.get("/pools/new/").status_code == 403


def test_a_bad_slug_is_refused_next_to_its_field(operator: Client) -> None:
    draft_id = start(operator)

    response = operator.post(url(draft_id, "name"), {**NAME, "slug": "not a slug!"})

    assert response.status_code == 400
    assert "Enter a valid “slug”" in field_group(response.content.decode(), "slug")


def test_a_taken_slug_is_refused_as_typed_and_on_next(operator: Client) -> None:
    make_pool("chat")
    draft_id = start(operator)

    typed = operator.post(url(draft_id, "name"), NAME, headers={"HX-Request": "true"})
    free = operator.post(
        url(draft_id, "name"), {**NAME, "slug": "chat-2"}, headers={"HX-Request": "true"}
    )
    response = operator.post(url(draft_id, "name"), NAME)

    assert typed.content.decode().lstrip().startswith('<p id="slug-check" class="error"')
    assert escape(SLUG_TAKEN) in typed.content.decode()
    assert "<code>@pool/chat-2</code> is free." in free.content.decode()
    assert response.status_code == 400
    assert escape(SLUG_TAKEN) in field_group(response.content.decode(), "slug")


def test_the_slug_check_sits_under_the_slug_and_a_refusal_on_next_is_said_once(
    operator: Client,
) -> None:
    make_pool("chat")
    draft_id = start(operator)

    page = operator.get(url(draft_id, "name")).content.decode()
    refused = operator.post(url(draft_id, "name"), NAME).content.decode()

    assert 'id="slug-check"' in field_group(page, "slug")
    assert refused.count(escape(SLUG_TAKEN)) == 1


def test_back_keeps_what_was_entered(operator: Client) -> None:
    draft_id = start(operator)
    operator.post(url(draft_id, "name"), {**NAME, "description": "Support bot"})

    response = operator.post(url(draft_id, "compatibility"), {"back": "1"})
    page = operator.get(url(draft_id, "name")).content.decode()

    assert response["Location"] == url(draft_id, "name")
    assert 'value="chat"' in page
    assert "Support bot</textarea>" in page


def test_the_targets_step_needs_a_target(operator: Client) -> None:
    draft_id = start(operator)

    response = operator.post(url(draft_id, "targets"), {})

    assert response.status_code == 400
    assert "Add at least one target" in response.content.decode()


def test_a_bad_url_is_refused_next_to_its_field(operator: Client) -> None:
    draft_id = start(operator)

    response = operator.post(
        f"/pools/new/{draft_id}/targets/add/", provider(base_url="not a url at all")
    )
    page = response.content.decode()

    assert response.status_code == 400
    assert "Enter a valid URL." in field_group(page, "base_url")
    # The key typed with it is not sent back; the field says so.
    assert PROVIDER_KEY not in page
    assert "Type it again" in field_group(page, "credential")
    assert wizard.load_draft(operator.session, draft_id)["targets"] == []  # type: ignore[index]


def test_a_provider_needs_its_key(operator: Client) -> None:
    draft_id = start(operator)

    response = operator.post(f"/pools/new/{draft_id}/targets/add/", provider(credential=""))

    assert response.status_code == 400
    assert "A provider endpoint needs its key." in field_group(
        response.content.decode(), "credential"
    )


def test_a_provider_key_is_kept_encrypted_and_only_ever_reads_set(operator: Client) -> None:
    draft_id = draft_with_a_provider(operator)

    pages = [operator.get(url(draft_id, step)).content.decode() for step in wizard.STEP_SLUGS]
    stored = wizard.load_draft(operator.session, draft_id)

    assert stored is not None
    assert PROVIDER_KEY not in str(stored)
    assert stored["targets"][0]["credential_encrypted"]
    assert all(PROVIDER_KEY not in page for page in pages)
    assert "<td>set</td>" in pages[wizard.STEP_SLUGS.index("summary")]


def test_a_chosen_nodes_model_becomes_a_target_through_its_agent(operator: Client) -> None:
    node = make_node("gpu-1")
    NodeModel.objects.create(node=node, model_id="qwen", runtime="vllm", seen_at=datetime.now(UTC))
    draft_id = start(operator)
    operator.post(url(draft_id, "nodes"), {"nodes": [node.pk]})

    page = operator.get(url(draft_id, "targets")).content.decode()
    operator.post(
        f"/pools/new/{draft_id}/targets/add/",
        {"source": "node", "node_model": f"{node.pk}:qwen", "kinds": ["chat"]},
    )

    assert "qwen on gpu-1 (vllm)" in page
    target = wizard.load_draft(operator.session, draft_id)["targets"][0]  # type: ignore[index]
    assert (target["name"], target["node"], target["base_url"], target["model_id"]) == (
        "gpu-1",
        node.pk,
        "http://gpu-1.lan:7100/v1",
        "qwen",
    )


def test_exact_replicas_without_proof_need_the_explicit_confirmation(operator: Client) -> None:
    draft_id = draft_with_a_provider(operator)

    refused = operator.post(url(draft_id, "check"), {})
    page = refused.content.decode()

    assert refused.status_code == 400
    assert "No content digest for openai" in page
    assert "Identity cannot be proven: confirm it" in field_group(page, "confirm_identity")
    accepted = operator.post(url(draft_id, "check"), {"confirm_identity": "on"})
    assert accepted["Location"] == url(draft_id, "summary")


def test_the_summary_refuses_to_create_what_is_missing(operator: Client) -> None:
    draft_id = start(operator)

    response = operator.post(url(draft_id, "summary"), {})
    page = response.content.decode()

    assert response.status_code == 400
    assert "Add at least one target" in page
    assert "Slug: This field is required." in page
    assert not Pool.objects.exists()


def test_a_dry_run_of_the_draft_leaves_nothing_behind(operator: Client) -> None:
    draft_id = draft_with_a_provider(operator)
    version = ConfigVersion.current()

    page = operator.get(f"/pools/new/{draft_id}/dry-run/?kind=chat").content.decode()
    fragment = operator.get(
        f"/pools/new/{draft_id}/dry-run/?kind=chat", headers={"HX-Request": "true"}
    ).content.decode()

    assert "Would go to <strong data-chosen>openai</strong> (tier 1)." in page
    assert '<li aria-current="step"><strong>7. Validate and dry run</strong>' in page
    assert fragment.lstrip().startswith('<div id="dry-run-result"')
    assert "Would go to <strong data-chosen>openai</strong> (tier 1)." in fragment
    assert not Pool.objects.exists()
    assert not Target.objects.exists()
    assert ConfigVersion.current() == version


def test_create_makes_the_pool_its_targets_and_the_confirmation(operator: Client) -> None:
    draft_id = draft_with_a_provider(operator)
    operator.post(url(draft_id, "weights"), {"priority_0": "2", "capacity_0": "16"})
    operator.post(url(draft_id, "check"), {"confirm_identity": "on"})

    response = operator.post(url(draft_id, "summary"), {}, follow=True)
    page = response.content.decode()

    assert response.redirect_chain == [("/pools/chat/created/", 302)]
    assert "@pool/chat" in page
    assert 'data-copy="@pool/chat"' in page
    assert "client.chat.completions.create" in page
    assert PROVIDER_KEY not in page
    target = Target.objects.get(pool__slug="chat")
    assert (target.name, target.priority, target.capacity_weight, target.get_credential()) == (
        "openai",
        2,
        16,
        PROVIDER_KEY,
    )
    confirmation = IdentityConfirmation.objects.get(pool__slug="chat")
    assert confirmation.confirmed_by_name == "operator"
    assert [entry["name"] for entry in confirmation.targets] == ["openai"]
    assert wizard.load_draft(operator.session, draft_id) is None
    assert operator.get(url(draft_id, "summary")).status_code == 404


@pytest.fixture
def keyed_engine() -> Iterator[str]:
    with running_simulator(
        model="demo-8b", ttft_ms=0, tpot_ms=0, concurrency=6, api_key=PROVIDER_KEY
    ) as engine:
        yield engine.base_url


def test_a_runtime_target_is_prefilled_and_validated_with_its_key_before_creation(
    operator: Client, keyed_engine: str
) -> None:
    draft_id = draft_with_a_provider(operator)
    # The provider serves another model: in this Exact-replicas draft it goes first.
    operator.post(f"/pools/new/{draft_id}/targets/0/remove/")
    operator.post(
        f"/pools/new/{draft_id}/targets/add/",
        provider(name="runtime", source="runtime", base_url=keyed_engine, model_id="demo-8b"),
    )

    page = operator.get(f"/pools/new/{draft_id}/validate/?run=1").content.decode()
    weights = operator.get(url(draft_id, "weights")).content.decode()

    # Its capacity prefilled from what its runtime says it runs at once, as Add target does.
    assert 'name="capacity_0" value="6"' in weights
    assert "Prefilled from the simulator&#x27;s --concurrency." in weights
    assert "The credential is accepted." in page
    assert "Serves demo-8b." in page
    assert "No content digest for runtime" in page
    assert PROVIDER_KEY not in page
    assert not Pool.objects.exists()


def test_a_project_owner_creates_pools_in_their_project_but_adds_no_node() -> None:
    acme = Project.objects.create(name="acme")
    Project.objects.create(name="rival")
    cast = make_cast(acme)
    owner = Client()
    owner.force_login(cast.owner)
    outsider = Client()
    outsider.force_login(cast.outsider)
    draft_id = start(owner)

    name_step = owner.get(url(draft_id, "name")).content.decode()
    nodes_step = owner.get(url(draft_id, "nodes")).content.decode()
    node_add = owner.post(f"/pools/new/{draft_id}/nodes/add/", {"name": "gpu-1"})

    assert '<option value="acme">acme</option>' in name_step
    assert "rival" not in name_step
    assert "No trusted node yet: go on without one, or ask staff to add one." in nodes_step
    assert 'id="add-node"' not in nodes_step
    assert node_add.status_code == 403
    assert outsider.get("/pools/new/").status_code == 403
    # A draft lives in its own user's session: another user's is not found.
    assert Client().get(url(draft_id, "name")).status_code == 302  # to sign in
    assert browser_of(cast.staff).get(url(draft_id, "name")).status_code == 404


def browser_of(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_staff_start_a_pool_on_a_fresh_installation_without_any_project(operator: Client) -> None:
    Project.objects.all().delete()

    assert operator.get("/pools/new/").status_code == 302
    assert Project.objects.filter(name=DEFAULT_PROJECT).exists()


def test_an_exact_replicas_draft_refuses_a_target_of_another_model_next_to_its_field(
    operator: Client,
) -> None:
    draft_id = draft_with_a_provider(operator)

    response = operator.post(
        f"/pools/new/{draft_id}/targets/add/",
        provider(name="other", model_id="gpt-4o", credential="sk-other"),
    )

    assert response.status_code == 400
    assert "other serves gpt-4o, the pool&#x27;s targets serve gpt-4o-mini" in field_group(
        response.content.decode(), "model_id"
    )
    assert [
        entry["name"] for entry in wizard.load_draft(operator.session, draft_id)["targets"]
    ] == ["openai"]


def test_choosing_exact_replicas_over_targets_of_two_models_is_refused_until_they_agree(
    operator: Client,
) -> None:
    draft_id = start(operator)
    operator.post(url(draft_id, "name"), NAME)
    operator.post(url(draft_id, "compatibility"), {"compatibility_mode": "equivalent_generation"})
    operator.post(f"/pools/new/{draft_id}/targets/add/", provider())
    operator.post(
        f"/pools/new/{draft_id}/targets/add/",
        provider(name="other", model_id="gpt-4o", credential="sk-other"),
    )

    response = operator.post(
        url(draft_id, "compatibility"), {"compatibility_mode": "exact_replicas"}
    )
    summary = operator.get(url(draft_id, "summary")).content.decode()

    assert response.status_code == 400
    assert "The targets serve different models" in response.content.decode()
    assert "The targets serve different models" in summary
    assert operator.post(url(draft_id, "summary"), {}).status_code == 400
    assert not Pool.objects.filter(slug="chat").exists()
