"""The tokens page: list with state, limits and usage; issue with the secret shown once; revoke."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from nexus.models import ApiToken
from pools.gateway.history import write_rows
from tests.nexus.factories import make_pool, make_user
from tests.pools.test_history import row

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff() -> Client:
    client = Client()
    client.force_login(make_user("ops", staff=True))
    return client


def test_the_list_shows_state_limits_and_usage_of_the_last_day_and_month(
    staff: Client, django_assert_max_num_queries
) -> None:
    chat = make_pool("chat")
    live, _ = ApiToken.issue("live", pools=["chat"], requests_per_minute=60, max_concurrent=4)
    ApiToken.issue("gone")[0].revoke()
    now = timezone.now()
    write_rows(
        [
            row(chat, 1, token_id=live.pk, created_at=now, prompt_tokens=10, completion_tokens=5),
            row(chat, 2, token_id=live.pk, created_at=now - timedelta(days=3), prompt_tokens=1,
                outcome="upstream_error"),
            row(chat, 3, token_id=live.pk, created_at=now - timedelta(days=40)),
        ]
    )  # fmt: skip
    for number in range(20):
        ApiToken.issue(f"more-{number}", requests_per_minute=number + 1)

    with django_assert_max_num_queries(12):
        page = staff.get("/tokens/")

    html = page.content.decode()
    assert page.status_code == 200
    assert 'data-token="live"' in html
    row_html = html.split('data-token="live"')[1].split("</tr>")[0]
    assert "@pool/chat" in row_html
    assert "Valid" in row_html
    assert "<td data-limits>60 req/min<br>4 at once</td>" in row_html
    assert '<td data-usage="day">1 request<br>15 tokens</td>' in row_html
    assert '<td data-usage="month">2 requests<br>1 error<br>16 tokens</td>' in row_html
    gone = html.split('data-token="gone"')[1].split("</tr>")[0]
    assert "Revoked" in gone and "Revoke</a>" not in gone


def test_issuing_shows_the_secret_once_with_snippets_for_its_pool(staff: Client) -> None:
    make_pool("chat")

    page = staff.post(
        "/tokens/new/",
        {"name": "bot", "kind": "client", "pools": ["chat"], "tokens_per_minute": "5000"},
    )

    token = ApiToken.objects.get(name="bot")
    html = page.content.decode()
    assert page.status_code == 200
    secret = html.split("<code data-secret>")[1].split("</code>")[0]
    assert ApiToken.objects.get(token_hash=token.token_hash) == token
    assert token.tokens_per_minute == 5000
    assert '"model": "@pool/chat"' in html.replace("&quot;", '"')
    assert secret in html.split('id="issued-snippets"')[1]
    assert secret not in staff.get("/tokens/").content.decode()


def test_a_form_error_keeps_the_values_and_issues_nothing(staff: Client) -> None:
    page = staff.post("/tokens/new/", {"name": "adm", "kind": "admin", "requests_per_minute": "5"})

    assert page.status_code == 400
    assert "Limits apply to client tokens" in page.content.decode()
    assert not ApiToken.objects.exists()


def test_revoking_confirms_then_refuses_the_token(staff: Client) -> None:
    token, _ = ApiToken.issue("bot")

    confirm = staff.get(f"/tokens/{token.pk}/revoke/")
    done = staff.post(f"/tokens/{token.pk}/revoke/")

    assert "is refused from now on" in confirm.content.decode()
    assert done.status_code == 302 and done["Location"] == "/tokens/"
    token.refresh_from_db()
    assert token.is_revoked


def test_only_staff_issue_and_revoke_and_others_see_their_own_tokens() -> None:
    member = make_user("member")
    ApiToken.issue("theirs", created_by=member)
    ApiToken.issue("someone else's")
    client = Client()
    client.force_login(member)

    html = client.get("/tokens/").content.decode()

    assert 'data-token="theirs"' in html and "someone else" not in html
    assert client.get("/tokens/new/").status_code == 403
    assert client.post(f"/tokens/{ApiToken.objects.first().pk}/revoke/").status_code == 403
    assert Client().get("/tokens/").status_code == 302  # to sign in
