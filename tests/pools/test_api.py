"""The pools and targets admin API: who may do what, and what it never reveals."""

from __future__ import annotations

import re

import pytest
from rest_framework.test import APIClient

from nexus.models import ApiToken, Project, Role
from nexus.scopes import TokenKind
from pools.api.serializers import SLUG_IMMUTABLE
from pools.models import SLUG_TAKEN, Pool, Target
from tests.nexus.factories import make_pool, make_target, make_user
from tests.support.personas import add_member, signed_in

pytestmark = pytest.mark.django_db

PROVIDER_KEY = "sk-provider-0123456789abcdef"


def token_client(**scope: object) -> APIClient:
    """Return a client that calls with an admin token issued by a staff user."""
    _, secret = ApiToken.issue(
        "automation", kind=TokenKind.ADMIN, created_by=make_user("robot", staff=True), **scope
    )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def test_an_owner_creates_a_pool_and_gets_its_model_name(owner: APIClient) -> None:
    response = owner.post(
        "/api/v1/pools/", {"slug": "chat", "name": "Chat", "strategy": "least_busy"}, format="json"
    )

    assert response.status_code == 201
    assert response.json()["model_name"] == "@pool/chat"
    assert response.json()["targets"] == []
    assert Pool.objects.get(slug="chat").strategy == "least_busy"


def test_a_pool_has_upstream_timeouts_and_an_ejection_cap_with_defaults(owner: APIClient) -> None:
    created = owner.post("/api/v1/pools/", {"slug": "chat", "name": "Chat"}, format="json")

    response = owner.patch(
        "/api/v1/pools/chat/",
        {"first_byte_timeout_s": 5, "stream_idle_timeout_s": 0, "max_ejection_percent": 101},
        format="json",
    )

    defaults = {key: created.json()[key] for key in (
        "first_byte_timeout_s", "first_token_timeout_s", "stream_idle_timeout_s",
        "max_ejection_percent",
    )}  # fmt: skip
    assert defaults == {
        "first_byte_timeout_s": 60.0,
        "first_token_timeout_s": 120.0,
        "stream_idle_timeout_s": 60.0,
        "max_ejection_percent": 50,
    }
    assert response.status_code == 400
    assert set(response.json()) == {"stream_idle_timeout_s", "max_ejection_percent"}


def test_a_pool_is_looked_up_by_slug_with_its_targets_embedded(teammate: APIClient) -> None:
    pool = make_pool("chat")
    make_target(pool, "backup", priority=2)
    make_target(pool, "primary", priority=1)

    response = teammate.get("/api/v1/pools/chat/")

    assert response.status_code == 200
    assert [target["name"] for target in response.json()["targets"]] == ["primary", "backup"]
    assert "pool" not in response.json()["targets"][0]


def test_a_pools_slug_cannot_change(owner: APIClient) -> None:
    make_pool("chat")

    response = owner.patch("/api/v1/pools/chat/", {"slug": "talk"}, format="json")

    assert response.status_code == 400
    assert response.json() == {"slug": [SLUG_IMMUTABLE]}
    assert Pool.objects.get().slug == "chat"


def test_a_taken_slug_is_refused_saying_that_apps_call_each_pool_by_its_own(
    owner: APIClient,
) -> None:
    make_pool("chat")

    response = owner.post("/api/v1/pools/", {"slug": "chat", "name": "Chat"}, format="json")

    assert response.status_code == 400
    assert response.json() == {"slug": [SLUG_TAKEN]}
    assert Pool.objects.count() == 1


def test_a_pool_may_be_replaced_with_its_own_slug(owner: APIClient) -> None:
    make_pool("chat")

    response = owner.put("/api/v1/pools/chat/", {"slug": "chat", "name": "Talk"}, format="json")

    assert response.status_code == 200
    assert Pool.objects.get().name == "Talk"


def test_a_teammate_reads_pools_but_cannot_change_them(teammate: APIClient) -> None:
    make_pool("chat")

    assert teammate.get("/api/v1/pools/").json()["count"] == 1
    assert teammate.post("/api/v1/pools/", {"slug": "x", "name": "X"}).status_code == 403
    assert teammate.delete("/api/v1/pools/chat/").status_code == 403
    assert Pool.objects.count() == 1


def test_an_outsider_sees_nothing(outsider: APIClient) -> None:
    make_pool("chat")

    response = outsider.get("/api/v1/pools/")

    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert response.json() == {"detail": "Authentication credentials were not provided."}


def test_an_owner_deletes_a_pool_with_its_targets(owner: APIClient) -> None:
    make_target(make_pool("chat"), "a")

    assert owner.delete("/api/v1/pools/chat/").status_code == 204
    assert Target.objects.count() == 0


def test_a_target_credential_is_stored_encrypted_and_never_returned(owner: APIClient) -> None:
    make_pool("chat")

    created = owner.post(
        "/api/v1/targets/",
        {
            "pool": "chat",
            "name": "openai",
            "base_url": "https://api.example.com/v1",
            "model_id": "gpt-4o-mini",
            "credential": PROVIDER_KEY,
        },
        format="json",
    )
    target = Target.objects.get()
    responses = [
        created,
        owner.get(f"/api/v1/targets/{target.pk}/"),
        owner.get("/api/v1/targets/"),
        owner.get("/api/v1/pools/chat/"),
        owner.get("/api/v1/pools/"),
    ]

    assert created.status_code == 201
    assert created.json()["has_credential"] is True
    assert "credential" not in created.json()
    assert target.credential_encrypted != PROVIDER_KEY
    assert PROVIDER_KEY not in target.credential_encrypted
    assert target.get_credential() == PROVIDER_KEY
    for response in responses:
        assert response.status_code in (200, 201)
        assert PROVIDER_KEY not in response.content.decode()
        assert target.credential_encrypted not in response.content.decode()


def test_a_target_keeps_its_credential_unless_one_is_sent(owner: APIClient) -> None:
    target = make_target(make_pool("chat"), "openai", credential=PROVIDER_KEY)

    response = owner.patch(f"/api/v1/targets/{target.pk}/", {"priority": 2}, format="json")

    assert response.json()["has_credential"] is True
    target.refresh_from_db()
    assert target.get_credential() == PROVIDER_KEY


def test_an_empty_credential_removes_it(owner: APIClient) -> None:
    target = make_target(make_pool("chat"), "openai", credential=PROVIDER_KEY)

    response = owner.patch(f"/api/v1/targets/{target.pk}/", {"credential": ""}, format="json")

    assert response.json()["has_credential"] is False
    target.refresh_from_db()
    assert target.credential_encrypted == ""


def test_targets_are_filtered_by_pool(teammate: APIClient) -> None:
    make_target(make_pool("chat"), "a")
    make_target(make_pool("embed"), "b")

    response = teammate.get("/api/v1/targets/", {"pool": "embed"})

    assert [(t["pool"], t["name"]) for t in response.json()["results"]] == [("embed", "b")]


def test_a_target_must_serve_known_request_kinds(owner: APIClient) -> None:
    make_pool("chat")

    response = owner.post(
        "/api/v1/targets/",
        {
            "pool": "chat",
            "name": "a",
            "base_url": "http://a.lan/v1",
            "model_id": "m",
            "kinds": ["images"],
        },
        format="json",
    )

    assert response.status_code == 400
    assert response.json() == {"kinds": {"0": ['"images" is not a valid choice.']}}


def test_a_target_name_is_unique_within_its_pool(owner: APIClient) -> None:
    make_target(make_pool("chat"), "a")

    response = owner.post(
        "/api/v1/targets/",
        {"pool": "chat", "name": "a", "base_url": "http://a.lan/v1", "model_id": "m"},
        format="json",
    )

    assert response.status_code == 400
    assert response.json() == {
        "non_field_errors": ["The fields pool, name must make a unique set."]
    }


def test_a_target_needs_an_existing_pool(owner: APIClient) -> None:
    response = owner.post(
        "/api/v1/targets/",
        {"pool": "nope", "name": "a", "base_url": "http://a.lan/v1", "model_id": "m"},
        format="json",
    )

    assert response.status_code == 400
    assert response.json() == {"pool": ["Object with slug=nope does not exist."]}


def test_an_admin_token_holder_reads_pools() -> None:
    make_pool("chat")

    response = token_client().get("/api/v1/pools/")

    assert response.status_code == 200
    assert [pool["slug"] for pool in response.json()["results"]] == ["chat"]


def test_a_member_sees_only_their_projects_pools() -> None:
    ours, theirs = Project.objects.create(name="ours"), Project.objects.create(name="theirs")
    make_target(make_pool("chat", project=ours), "a")
    other = make_target(make_pool("embed", project=theirs), "b")
    member = make_user("member")
    add_member(ours, member, Role.MEMBER)
    client = signed_in(member)

    assert [p["slug"] for p in client.get("/api/v1/pools/").json()["results"]] == ["chat"]
    assert [t["name"] for t in client.get("/api/v1/targets/").json()["results"]] == ["a"]
    assert client.get("/api/v1/pools/embed/").status_code == 404
    assert client.patch(f"/api/v1/targets/{other.pk}/", {"priority": 3}).status_code == 404
    moved = client.post(
        "/api/v1/targets/",
        {"pool": "embed", "name": "c", "base_url": "http://c.lan/v1", "model_id": "m"},
        format="json",
    )
    assert moved.json() == {"pool": ["Object with slug=embed does not exist."]}


def test_the_schema_and_its_docs_are_served_without_a_cdn(teammate: APIClient) -> None:
    schema = teammate.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    docs = teammate.get("/api/docs/")

    assert schema.status_code == 200
    assert {"/api/v1/pools/", "/api/v1/targets/", "/api/v1/tokens/{id}/revoke/"} <= set(
        schema.json()["paths"]
    )
    assert docs.status_code == 200
    page = docs.content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/" in page
    # Every script, style and icon comes from Nexus itself. (Not "no 'cdn' in the page": the
    # page carries a random CSRF token, which once spelled it.)
    sources = re.findall(r'(?:src|href)="([^"]*)"', page)
    assert sources and all(source.startswith("/") for source in sources), sources
