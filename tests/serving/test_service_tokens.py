"""Service tokens: issued per service with an expiry, listed as valid, expired or revoked,
revoked at once (the very next request through a live gateway is refused)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.test import APIClient

from nexus.models import ApiToken, hash_token
from nexus.scopes import AdminAccess, TokenKind
from pools.models import Pool, Target
from serving import tokens
from serving.models import Service, ServiceLifecycle
from tests.nexus.factories import make_user
from tests.support.http import LOOPBACK
from tests.support.live import LiveServer, running_nexus
from tests.support.waiting import wait_until


def make_service(name: str, *, base_url: str = "http://replica.lan:8000", **fields: Any) -> Service:
    """Create a service with a managed pool of one replica target."""
    pool = Pool.objects.create(name=name, slug=name, managed=True)
    Target.objects.create(pool=pool, name=f"{name}-1", base_url=base_url, model_id="demo")
    return Service.objects.create(name=name, pool=pool, **fields)


def tomorrow() -> str:
    return (timezone.now() + timedelta(days=1)).isoformat()


# The API, as the three personas see it


@pytest.mark.django_db
def test_the_owner_issues_a_token_whose_secret_is_shown_once_and_stored_hashed(
    owner: APIClient,
) -> None:
    make_service("chat")

    issued = owner.post("/api/v1/services/chat/tokens/", {"name": "app", "expires_at": tomorrow()})
    listed = owner.get("/api/v1/services/chat/tokens/")

    assert issued.status_code == 201
    secret = issued.json()["token"]
    assert secret.startswith("nx-")
    assert issued.json()["status"] == "valid"
    assert issued.json()["created_by"] == "owner"
    stored = ApiToken.objects.get(pk=issued.json()["id"])
    assert stored.token_hash == hash_token(secret)
    assert (stored.services, stored.all_pools, stored.pools) == (["chat"], False, [])
    assert "token" not in listed.json()["results"][0]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("expires_at", "problem"),
    [(None, "This field may not be null."), ("", None), ("2001-01-01T00:00:00Z", "future")],
)
def test_a_token_must_expire_in_the_future(
    owner: APIClient, expires_at: str | None, problem: str | None
) -> None:
    make_service("chat")
    body: dict[str, Any] = {"name": "app"}
    if expires_at != "":
        body["expires_at"] = expires_at

    response = owner.post("/api/v1/services/chat/tokens/", body, format="json")

    assert response.status_code == 400
    assert "expires_at" in response.json()
    if problem:
        assert problem in response.json()["expires_at"][0]
    assert not ApiToken.objects.exists()


@pytest.mark.django_db
def test_tokens_are_listed_as_valid_expired_or_revoked_newest_first(owner: APIClient) -> None:
    service = make_service("chat")
    make_service("other")
    valid, _ = tokens.issue_service_token(
        service, name="valid", expires_at=timezone.now() + timedelta(days=1)
    )
    expired, _ = ApiToken.issue(
        "expired", services=["chat"], expires_at=timezone.now() - timedelta(minutes=1)
    )
    revoked, _ = tokens.issue_service_token(
        service, name="revoked", expires_at=timezone.now() + timedelta(days=1)
    )
    tokens.revoke_service_token(revoked)
    ApiToken.issue("another service's", services=["other"])
    ApiToken.issue("a client token")

    listed = owner.get("/api/v1/services/chat/tokens/").json()["results"]

    assert [(t["name"], t["status"]) for t in listed] == [
        ("revoked", "revoked"), ("expired", "expired"), ("valid", "valid"),
    ]  # fmt: skip


@pytest.mark.django_db
def test_deleting_a_token_revokes_it_and_keeps_it_listed(owner: APIClient) -> None:
    service = make_service("chat")
    token, _ = tokens.issue_service_token(
        service, name="app", expires_at=timezone.now() + timedelta(days=1)
    )

    first = owner.delete(f"/api/v1/services/chat/tokens/{token.pk}/")
    again = owner.delete(f"/api/v1/services/chat/tokens/{token.pk}/")

    assert (first.status_code, again.status_code) == (204, 204)
    token.refresh_from_db()
    assert token.is_revoked
    assert owner.get("/api/v1/services/chat/tokens/").json()["results"][0]["status"] == "revoked"


@pytest.mark.django_db
def test_a_token_of_another_service_cannot_be_deleted_through_this_one(owner: APIClient) -> None:
    make_service("chat")
    other = make_service("other")
    token, _ = tokens.issue_service_token(
        other, name="app", expires_at=timezone.now() + timedelta(days=1)
    )

    response = owner.delete(f"/api/v1/services/chat/tokens/{token.pk}/")

    assert response.status_code == 404
    token.refresh_from_db()
    assert not token.is_revoked


@pytest.mark.django_db
@pytest.mark.parametrize("lifecycle", [None, ServiceLifecycle.DESTROYED])
def test_an_unknown_or_destroyed_service_has_no_tokens(
    owner: APIClient, lifecycle: ServiceLifecycle | None
) -> None:
    if lifecycle is not None:
        make_service("chat", lifecycle=lifecycle)

    listed = owner.get("/api/v1/services/chat/tokens/")
    issued = owner.post("/api/v1/services/chat/tokens/", {"name": "a", "expires_at": tomorrow()})

    assert (listed.status_code, issued.status_code) == (404, 404)


@pytest.mark.django_db
def test_a_service_being_destroyed_gets_no_new_token(owner: APIClient) -> None:
    make_service("chat", lifecycle=ServiceLifecycle.DESTROYING)

    response = owner.post("/api/v1/services/chat/tokens/", {"name": "a", "expires_at": tomorrow()})

    assert response.status_code == 400
    assert not ApiToken.objects.exists()


@pytest.mark.django_db
def test_a_teammate_may_list_tokens_but_not_issue_or_revoke_them(teammate: APIClient) -> None:
    service = make_service("chat")
    token, _ = tokens.issue_service_token(
        service, name="app", expires_at=timezone.now() + timedelta(days=1)
    )

    listed = teammate.get("/api/v1/services/chat/tokens/")
    issued = teammate.post("/api/v1/services/chat/tokens/", {"name": "a", "expires_at": tomorrow()})
    revoked = teammate.delete(f"/api/v1/services/chat/tokens/{token.pk}/")

    assert (listed.status_code, issued.status_code, revoked.status_code) == (200, 403, 403)


@pytest.mark.django_db
def test_an_outsider_sees_nothing(outsider: APIClient) -> None:
    make_service("chat")

    response = outsider.get("/api/v1/services/chat/tokens/")

    assert response.status_code == 401


@pytest.mark.django_db
def test_a_service_token_cannot_use_the_admin_api(owner: APIClient) -> None:
    service = make_service("chat")
    _, secret = tokens.issue_service_token(
        service,
        name="app",
        expires_at=timezone.now() + timedelta(days=1),
        created_by=make_user("staffer", staff=True),
    )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")

    listed = client.get("/api/v1/services/chat/tokens/")
    issued = client.post("/api/v1/services/chat/tokens/", {"name": "a", "expires_at": tomorrow()})
    pools = client.get("/api/v1/pools/")

    assert (listed.status_code, issued.status_code, pools.status_code) == (403, 403, 403)
    assert "calls inference only" in pools.json()["detail"]


@pytest.mark.django_db
def test_destroying_a_service_can_revoke_all_its_tokens() -> None:
    service = make_service("chat")
    for name in ("a", "b"):
        tokens.issue_service_token(
            service, name=name, expires_at=timezone.now() + timedelta(days=1)
        )

    revoked = tokens.revoke_service_tokens(service)

    assert revoked == 2
    assert [tokens.token_status(t) for t in tokens.service_tokens(service)] == [
        tokens.TokenStatus.REVOKED, tokens.TokenStatus.REVOKED,
    ]  # fmt: skip


# Through a live server: issue, call, revoke, refused at once


@dataclass
class Live:
    nexus: LiveServer
    admin_token: str  # a staff member's client token, for the admin API

    def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.admin_token}"}
        return LOOPBACK.request(
            method, f"{self.nexus.url}/api/v1{path}", headers=headers, timeout=10, **kwargs
        )

    def serve(self, path: str, token: str) -> httpx.Response:
        headers = {"Authorization": f"BackendAI {token}"}
        return LOOPBACK.get(f"{self.nexus.url}/serve/{path}", headers=headers, timeout=10)


class _Hello(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
        self.send_response(200)
        self.send_header("Content-Length", "5")
        self.end_headers()
        self.wfile.write(b"hello")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        """Keep test output quiet."""


@pytest.fixture(scope="module")
def live(committed_db, django_db_blocker, tmp_path_factory) -> Iterator[Live]:
    replica = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    replica.daemon_threads = True
    thread = threading.Thread(target=replica.serve_forever, daemon=True)
    thread.start()
    with django_db_blocker.unblock():
        make_service("hello", base_url=f"http://127.0.0.1:{replica.server_address[1]}")
        _, admin_token = ApiToken.issue(
            "admin",
            kind=TokenKind.ADMIN,
            access=AdminAccess.WRITE,
            created_by=make_user("admin", staff=True),
        )
    try:
        with running_nexus(tmp_path_factory.mktemp("tokens"), NEXUS_LEDGER="memory") as nexus:
            yield Live(nexus, admin_token)
    finally:
        replica.shutdown()
        replica.server_close()
        with django_db_blocker.unblock():
            Service.objects.all().delete()
            Pool.objects.all().delete()
            ApiToken.objects.all().delete()
            User.objects.all().delete()


def test_a_token_issued_through_the_api_calls_the_service_until_it_is_revoked(live: Live) -> None:
    issued = live.api(
        "POST", "/services/hello/tokens/", json={"name": "app", "expires_at": tomorrow()}
    )
    assert issued.status_code == 201
    secret, token_id = issued.json()["token"], issued.json()["id"]
    # A new token is picked up with the next snapshot (about a second).
    wait_until(lambda: live.serve("hello/", secret).status_code == 200, timeout_s=5)

    revoked = live.api("DELETE", f"/services/hello/tokens/{token_id}/")
    refused = live.serve("hello/", secret)

    assert revoked.status_code == 204
    assert refused.status_code == 401
    assert refused.json()["error"]["message"] == "This token was revoked."
    listed = live.api("GET", "/services/hello/tokens/").json()["results"]
    assert [(t["id"], t["status"]) for t in listed] == [(token_id, "revoked")]
