"""The tokens page: list with state, limits and usage; issue with the secret shown once; revoke."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from nexus.models import ApiToken, Membership, Project, Role
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
        {
            "name": "bot",
            "kind": "client",
            "project": "default",
            "pools": ["chat"],
            "tokens_per_minute": "5000",
        },
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
    page = staff.post(
        "/tokens/new/",
        {"name": "adm", "kind": "admin", "project": "default", "requests_per_minute": "5"},
    )

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


def test_members_issue_and_revoke_their_projects_tokens_viewers_only_read_them() -> None:
    acme, other = Project.objects.create(name="acme"), Project.objects.create(name="other")
    make_pool("chat", project=acme)
    make_pool("elsewhere", project=other)
    member, viewer = make_user("member"), make_user("viewer")
    Membership.objects.create(user=member, project=acme, role=Role.MEMBER)
    Membership.objects.create(user=viewer, project=acme, role=Role.VIEWER)
    ours, _ = ApiToken.issue("ours", project=acme, pools=["chat"])
    ApiToken.issue("theirs", project=other, pools=["elsewhere"])
    as_member, as_viewer = Client(), Client()
    as_member.force_login(member)
    as_viewer.force_login(viewer)

    member_page = as_member.get("/tokens/").content.decode()
    viewer_page = as_viewer.get("/tokens/").content.decode()
    outside = as_member.post(
        "/tokens/new/", {"name": "x", "kind": "client", "project": "acme", "pools": ["elsewhere"]}
    )
    issued = as_member.post(
        "/tokens/new/", {"name": "bot", "kind": "client", "project": "acme", "pools": ["chat"]}
    )

    assert 'data-token="ours"' in member_page and "theirs" not in member_page
    assert "Revoke</a>" in member_page and "Issue token" in member_page
    assert 'data-token="ours"' in viewer_page and "Revoke</a>" not in viewer_page
    assert "Issue token" not in viewer_page
    assert outside.status_code == 400
    assert issued.status_code == 200
    assert ApiToken.objects.get(name="bot").project == acme
    assert as_viewer.get("/tokens/new/").status_code == 403
    assert as_viewer.post(f"/tokens/{ours.pk}/revoke/").status_code == 403
    assert as_member.post(f"/tokens/{ours.pk}/revoke/").status_code == 302
    assert Client().get("/tokens/").status_code == 302  # to sign in
