"""The tokens admin API: a secret is shown once, then only its effects are visible."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from nexus.models import ApiToken, Project, Role, hash_token
from nexus.scopes import AdminAccess, TokenKind
from tests.nexus.factories import make_pool, make_user
from tests.support.personas import add_member, signed_in

pytestmark = pytest.mark.django_db


def bearer(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def test_an_owner_issues_a_token_and_sees_its_secret_once(owner: APIClient) -> None:
    make_pool("chat")

    created = owner.post("/api/v1/tokens/", {"name": "ci", "pools": ["chat"]}, format="json")
    secret = created.json()["token"]
    token = ApiToken.objects.get()
    detail = owner.get(f"/api/v1/tokens/{token.pk}/")
    listed = owner.get("/api/v1/tokens/")

    assert created.status_code == 201
    assert secret.startswith("nx-")
    assert token.token_hash == hash_token(secret)
    assert created.json() | {"token": "-"} == {
        "id": token.pk,
        "name": "ci",
        "kind": "client",
        "access": "",
        "project": "default",
        "prefix": secret[:10],
        "all_pools": False,
        "pools": ["chat"],
        "expires_at": None,
        "created_by": "owner",
        "created_at": created.json()["created_at"],
        "last_used_at": None,
        "revoked_at": None,
        "revoked": False,
        "expired": False,
        "requests_per_minute": None,
        "tokens_per_minute": None,
        "max_concurrent": None,
        "token": "-",
    }
    assert "token" not in detail.json()
    assert "token" not in listed.json()["results"][0]
    for response in (detail, listed):
        assert secret not in response.content.decode()
        assert token.token_hash not in response.content.decode()


def test_a_token_is_issued_with_its_limits(owner: APIClient) -> None:
    limits = {"requests_per_minute": 60, "tokens_per_minute": 10_000, "max_concurrent": 4}

    created = owner.post("/api/v1/tokens/", {"name": "limited", **limits}, format="json")
    refused = owner.post("/api/v1/tokens/", {"name": "x", "max_concurrent": -1}, format="json")

    assert created.status_code == 201
    token = ApiToken.objects.get()
    assert (token.requests_per_minute, token.tokens_per_minute, token.max_concurrent) == (
        60,
        10_000,
        4,
    )
    assert {name: created.json()[name] for name in limits} == limits
    assert refused.status_code == 400 and "max_concurrent" in refused.json()


def test_an_issued_admin_token_authenticates_api_calls(owner: APIClient) -> None:
    issued = owner.post(
        "/api/v1/tokens/", {"name": "ci", "kind": "admin", "access": "write"}, format="json"
    )

    response = bearer(issued.json()["token"]).get("/api/v1/pools/")

    assert (issued.json()["kind"], issued.json()["access"], issued.json()["all_pools"]) == (
        "admin",
        "write",
        False,
    )
    assert response.status_code == 200


def test_an_admin_token_is_read_only_unless_issued_for_writes(owner: APIClient) -> None:
    issued = owner.post("/api/v1/tokens/", {"name": "ci", "kind": "admin"}, format="json")
    reader = bearer(issued.json()["token"])

    assert issued.json()["access"] == "read"
    assert reader.get("/api/v1/tokens/").status_code == 200
    refused = reader.post("/api/v1/tokens/", {"name": "more"}, format="json")
    assert refused.status_code == 403
    assert refused.json() == {
        "detail": "This admin token may only read; changes need an admin token with write access."
    }


def test_a_client_token_names_no_admin_access_and_an_admin_token_no_pool(
    owner: APIClient,
) -> None:
    make_pool("chat")

    client = owner.post("/api/v1/tokens/", {"name": "a", "access": "write"}, format="json")
    admin = owner.post(
        "/api/v1/tokens/", {"name": "b", "kind": "admin", "pools": ["chat"]}, format="json"
    )

    assert client.json() == {"access": ["A client token has no admin access."]}
    assert admin.json() == {"pools": ["An admin token names no pool."]}


def test_a_token_without_pools_may_call_all_of_them(owner: APIClient) -> None:
    response = owner.post("/api/v1/tokens/", {"name": "ci", "pools": []}, format="json")

    assert (response.json()["all_pools"], response.json()["pools"]) == (True, [])


def test_a_token_names_only_existing_pools(owner: APIClient) -> None:
    make_pool("chat")

    response = owner.post(
        "/api/v1/tokens/", {"name": "ci", "pools": ["chat", "nope"]}, format="json"
    )

    assert response.status_code == 400
    assert response.json() == {"pools": {"1": ["No pool has the slug nope."]}}
    assert ApiToken.objects.count() == 0


def test_a_token_cannot_expire_in_the_past(owner: APIClient) -> None:
    yesterday = (timezone.now() - timedelta(days=1)).isoformat()

    response = owner.post("/api/v1/tokens/", {"name": "ci", "expires_at": yesterday}, format="json")

    assert response.status_code == 400
    assert response.json() == {"expires_at": ["Choose a time in the future."]}


def test_a_revoked_token_is_rejected(owner: APIClient) -> None:
    token, secret = ApiToken.issue("ci", kind=TokenKind.ADMIN, created_by=make_user("robot"))

    revoked = owner.post(f"/api/v1/tokens/{token.pk}/revoke/")
    response = bearer(secret).get("/api/v1/pools/")

    assert revoked.status_code == 200
    assert revoked.json()["revoked"] is True
    assert response.status_code == 401
    assert response.json() == {"detail": "Invalid token."}


def test_revoking_twice_keeps_the_first_time(owner: APIClient) -> None:
    token, _ = ApiToken.issue("ci")
    first = owner.post(f"/api/v1/tokens/{token.pk}/revoke/").json()["revoked_at"]

    second = owner.post(f"/api/v1/tokens/{token.pk}/revoke/").json()["revoked_at"]

    assert second == first


def test_an_expired_token_is_rejected() -> None:
    _, secret = ApiToken.issue(
        "ci",
        kind=TokenKind.ADMIN,
        expires_at=timezone.now() - timedelta(seconds=1),
        created_by=make_user("robot"),
    )

    response = bearer(secret).get("/api/v1/pools/")

    assert response.status_code == 401
    assert response.json() == {"detail": "Token expired."}


def test_an_unknown_token_is_rejected() -> None:
    response = bearer("nx-not-a-token").get("/api/v1/pools/")

    assert response.status_code == 401
    assert response.json() == {"detail": "Invalid token."}


def test_a_teammate_lists_tokens_but_cannot_issue_or_revoke(teammate: APIClient) -> None:
    token, _ = ApiToken.issue("ci", project=Project.objects.get(name="default"))

    assert [t["name"] for t in teammate.get("/api/v1/tokens/").json()["results"]] == ["ci"]
    assert teammate.post("/api/v1/tokens/", {"name": "mine"}).status_code == 403
    assert teammate.post(f"/api/v1/tokens/{token.pk}/revoke/").status_code == 403
    assert ApiToken.objects.usable().count() == 1


def test_an_outsider_cannot_list_tokens() -> None:
    ApiToken.issue("ci")

    assert APIClient().get("/api/v1/tokens/").status_code == 401


def test_a_client_token_cannot_manage_tokens() -> None:
    make_pool("chat")
    _, secret = ApiToken.issue("ci", created_by=make_user("robot", staff=True))

    listed = bearer(secret).get("/api/v1/tokens/")
    issued = bearer(secret).post("/api/v1/tokens/", {"name": "wider"}, format="json")

    assert listed.status_code == 403
    assert issued.json() == {
        "detail": "A client token calls inference only (/v1 and /serve/<name>/); the admin API "
        "takes a signed-in session or an admin token."
    }
    assert ApiToken.objects.count() == 1


def test_a_staff_admin_write_token_issues_tokens_as_its_user() -> None:
    _, secret = ApiToken.issue(
        "automation",
        kind=TokenKind.ADMIN,
        access=AdminAccess.WRITE,
        created_by=make_user("robot", staff=True),
    )

    response = bearer(secret).post("/api/v1/tokens/", {"name": "child"}, format="json")

    assert response.status_code == 201
    assert ApiToken.objects.get(name="child").created_by.username == "robot"


def test_a_member_issues_client_tokens_for_their_projects_pools_only() -> None:
    ours, theirs = Project.objects.create(name="ours"), Project.objects.create(name="theirs")
    make_pool("chat", project=ours)
    make_pool("secret", project=theirs)
    member = make_user("member")
    add_member(ours, member, Role.MEMBER)
    client = signed_in(member)

    everything = client.post("/api/v1/tokens/", {"name": "a", "project": "ours"}, format="json")
    foreign = client.post(
        "/api/v1/tokens/", {"name": "b", "project": "ours", "pools": ["secret"]}, format="json"
    )
    elsewhere = client.post(
        "/api/v1/tokens/", {"name": "c", "project": "theirs", "pools": ["secret"]}, format="json"
    )
    mine = client.post(
        "/api/v1/tokens/", {"name": "d", "project": "ours", "pools": ["chat"]}, format="json"
    )

    assert everything.json() == {
        "pools": ["Name the pools of the project that the token may call."]
    }
    assert foreign.json() == {"pools": ["Not pools of the project ours: secret."]}
    assert elsewhere.json() == {"project": ["Object with name=theirs does not exist."]}
    assert (mine.status_code, mine.json()["pools"]) == (201, ["chat"])


def test_an_admin_token_stops_with_its_users_account() -> None:
    robot = make_user("robot", staff=True)
    _, secret = ApiToken.issue("automation", kind=TokenKind.ADMIN, created_by=robot)
    robot.is_active = False
    robot.save()

    response = bearer(secret).get("/api/v1/pools/")

    assert response.status_code == 401
    assert response.json() == {"detail": "The user this admin token acts for is gone."}
