"""The Django admin: every model is browsable, and no secret is ever rendered."""

from __future__ import annotations

import pytest
from django.test import Client

from nexus.models import ApiToken, ConfigVersion, default_project_pk, hash_token
from pools.models import Pool, Target, TargetState
from tests.nexus.factories import make_pool, make_target, make_user

pytestmark = pytest.mark.django_db

PROVIDER_KEY = "sk-provider-0123456789abcdef"


@pytest.fixture
def owner() -> Client:
    client = Client()
    client.force_login(make_user("owner", superuser=True))
    return client


def target_form(pool: Pool, **fields: str) -> dict[str, str]:
    """Return the Target admin form's data for a chat target in the pool."""
    return {
        "pool": str(pool.pk),
        "name": "openai",
        "base_url": "https://api.example.com/v1",
        "model_id": "gpt-4o-mini",
        "priority": "1",
        "capacity_weight": "4",
        "kinds": "chat",
        "enabled": "on",
        "position": "0",
        **fields,
    }


@pytest.mark.parametrize(
    "url",
    [
        "/admin/nexus/apitoken/",
        "/admin/nexus/configversion/",
        "/admin/pools/pool/",
        "/admin/pools/target/",
        "/admin/nexus/apitoken/add/",
        "/admin/pools/pool/add/",
        "/admin/pools/target/add/",
    ],
)
def test_every_admin_page_renders(owner: Client, url: str) -> None:
    make_target(make_pool("chat"), "a", credential=PROVIDER_KEY)
    ApiToken.issue("ci")
    ConfigVersion.bump()

    response = owner.get(url)

    assert response.status_code == 200
    assert PROVIDER_KEY not in response.content.decode()


def test_the_configuration_version_is_read_only(owner: Client) -> None:
    ConfigVersion.bump()

    assert owner.get("/admin/nexus/configversion/add/").status_code == 403
    assert owner.post("/admin/nexus/configversion/1/delete/", {"post": "yes"}).status_code == 403
    assert ConfigVersion.current() >= 1


def test_adding_a_token_issues_it_and_shows_the_secret_once(owner: Client) -> None:
    make_pool("chat")

    added = owner.post(
        "/admin/nexus/apitoken/add/",
        {"name": "ci", "kind": "client", "pools": ["chat"]},
        follow=True,
    )
    token = ApiToken.objects.get()
    shown = [m.message for m in added.context["messages"] if "not be shown again" in m.message]
    secret = shown[0].split("<code>")[1].split("</code>")[0]
    again = [
        owner.get("/admin/nexus/apitoken/"),
        owner.get(f"/admin/nexus/apitoken/{token.pk}/change/"),
    ]

    assert len(shown) == 1
    assert token.token_hash == hash_token(secret)
    assert (token.name, token.all_pools, token.pools, token.created_by.username) == (
        "ci",
        False,
        ["chat"],
        "owner",
    )
    for response in again:
        assert response.status_code == 200
        assert secret not in response.content.decode()
        assert token.token_hash not in response.content.decode()


def test_a_token_without_pools_covers_all_pools(owner: Client) -> None:
    owner.post("/admin/nexus/apitoken/add/", {"name": "ci", "kind": "client"})

    assert ApiToken.objects.get().all_pools is True


def test_a_tokens_limits_change_in_the_admin_and_reach_the_gateways(owner: Client) -> None:
    token, _ = ApiToken.issue("app")
    before = ConfigVersion.current()
    form = {"name": "app", "kind": "client", "access": "", "project": "", "expires_at": ""}

    answer = owner.post(
        f"/admin/nexus/apitoken/{token.pk}/change/",
        form | {"requests_per_minute": "60", "tokens_per_minute": "", "max_concurrent": "2"},
    )

    assert answer.status_code == 302, answer.content.decode()[:2000]
    token.refresh_from_db()
    assert (token.requests_per_minute, token.tokens_per_minute, token.max_concurrent) == (
        60,
        None,
        2,
    )
    assert ConfigVersion.current() > before


def test_the_revoke_action_revokes_tokens(owner: Client) -> None:
    token, _ = ApiToken.issue("ci")

    owner.post("/admin/nexus/apitoken/", {"action": "revoke", "_selected_action": [str(token.pk)]})

    token.refresh_from_db()
    assert token.is_revoked


def test_a_target_credential_is_write_only(owner: Client) -> None:
    pool = make_pool("chat")

    owner.post("/admin/pools/target/add/", target_form(pool, credential=PROVIDER_KEY))
    target = Target.objects.get()
    page = owner.get(f"/admin/pools/target/{target.pk}/change/").content.decode()

    assert target.get_credential() == PROVIDER_KEY
    assert PROVIDER_KEY not in page
    assert target.credential_encrypted not in page
    assert 'type="password"' in page


def test_a_blank_credential_keeps_the_stored_one(owner: Client) -> None:
    target = make_target(make_pool("chat"), "openai", credential=PROVIDER_KEY)

    owner.post(f"/admin/pools/target/{target.pk}/change/", target_form(target.pool, priority="2"))

    target.refresh_from_db()
    assert (target.priority, target.get_credential()) == (2, PROVIDER_KEY)


def test_the_remove_box_removes_the_credential(owner: Client) -> None:
    target = make_target(make_pool("chat"), "openai", credential=PROVIDER_KEY)

    owner.post(
        f"/admin/pools/target/{target.pk}/change/",
        target_form(target.pool, remove_credential="on"),
    )

    target.refresh_from_db()
    assert target.has_credential is False


def test_a_pool_page_shows_targets_inline_without_their_secret(owner: Client) -> None:
    pool = make_pool("chat")
    target = make_target(pool, "openai", credential=PROVIDER_KEY)

    page = owner.get(f"/admin/pools/pool/{pool.pk}/change/").content.decode()

    assert 'name="slug"' not in page
    assert 'name="targets-0-credential"' in page
    assert PROVIDER_KEY not in page
    assert target.credential_encrypted not in page


def test_a_pool_is_added_with_an_inline_target_and_its_credential(owner: Client) -> None:
    owner.post(
        "/admin/pools/pool/add/",
        {
            "name": "Chat",
            "slug": "chat",
            "project": str(default_project_pk()),
            "compatibility_mode": "exact_replicas",
            "strategy": "smart",
            "max_queue": "100",
            "max_queue_wait_s": "30",
            "max_attempts": "2",
            "first_byte_timeout_s": "60",
            "first_token_timeout_s": "120",
            "stream_idle_timeout_s": "60",
            "max_ejection_percent": "50",
            "continuity_enabled": "on",
            "continuity_threshold": "0.25",
            "history_retention_days": "14",
            "history_max_rows": "100000",
            "targets-TOTAL_FORMS": "1",
            "targets-INITIAL_FORMS": "0",
            "targets-0-name": "openai",
            "targets-0-base_url": "api.example.com/v1",
            "targets-0-model_id": "gpt-4o-mini",
            "targets-0-priority": "1",
            "targets-0-capacity_weight": "4",
            "targets-0-kinds": ["chat", "embeddings"],
            "targets-0-enabled": "on",
            "targets-0-position": "0",
            "targets-0-credential": PROVIDER_KEY,
        },
    )

    target = Target.objects.get()
    assert (target.pool.slug, target.base_url, target.kinds) == (
        "chat",
        "https://api.example.com/v1",
        ["chat", "embeddings"],
    )
    assert target.get_credential() == PROVIDER_KEY


# The actions reach the target's address (a closed loopback port).
@pytest.mark.live
def test_the_drain_and_resume_actions_change_a_targets_state(owner: Client) -> None:
    pool = make_pool("chat")
    target = make_target(pool, "gone", base_url="http://127.0.0.1:9/v1")
    url = "/admin/pools/target/"

    drained = owner.post(url, {"action": "drain", "_selected_action": [str(target.pk)]})
    target.refresh_from_db()
    state_after_drain = target.state
    resumed = owner.post(
        url, {"action": "resume", "_selected_action": [str(target.pk)]}, follow=True
    )
    target.refresh_from_db()

    assert drained.status_code == 302
    assert state_after_drain == TargetState.DRAINING
    # Nothing answers on port 9: it stays out of service, and the page says why.
    assert target.state == TargetState.DRAINING
    shown = [str(message) for message in resumed.context["messages"]]
    assert any(m.startswith("gone does not answer at http://127.0.0.1:9/v1/models") for m in shown)
