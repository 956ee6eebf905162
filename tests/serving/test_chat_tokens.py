"""The chat page's own tokens (issue 16, done-when 2): scoped to the one service or pool
chosen, expiring within the hour, revoked by the page, and only by its user."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.template.loader import render_to_string
from django.test import Client
from django.utils import timezone

from nexus import scopes
from nexus.models import ApiToken, Project, Role
from pools.models import Pool
from serving.chat import CHAT_TOKEN_TTL
from serving.models import Service
from tests.nexus.factories import make_user
from tests.support.personas import add_member

pytestmark = pytest.mark.django_db


def make_service(name: str, **fields: object) -> Service:
    pool = Pool.objects.create(name=name, slug=name, managed=True)
    return Service.objects.create(name=name, pool=pool, **fields)


def signed_in(client: Client, name: str, *, staff: bool = False) -> Client:
    client.force_login(make_user(name, staff=staff))
    return client


def test_the_page_token_calls_only_its_service_and_expires_within_the_hour(
    client: Client,
) -> None:
    service = make_service("chat-a")
    make_service("chat-b")
    signed_in(client, "staff", staff=True)

    before = timezone.now()
    answer = client.post("/chat/tokens/", {"target": f"service:{service.pk}"})

    assert answer.status_code == 201
    token = ApiToken.objects.get(pk=answer.json()["id"])
    assert (token.services, token.pools, token.all_pools) == (["chat-a"], [], False)
    assert token.may_call(scopes.service("chat-a"))
    assert not token.may_call(scopes.service("chat-b"))
    assert token.expires_at is not None
    assert before < token.expires_at <= timezone.now() + timedelta(hours=1)
    assert timedelta(hours=1) >= CHAT_TOKEN_TTL
    assert answer.json()["token"].startswith("nx-")
    assert answer.json()["revoke_url"] == f"/chat/tokens/{token.pk}/revoke/"


def test_a_pool_token_calls_only_that_pool(client: Client) -> None:
    Pool.objects.create(name="Chat", slug="chat")
    Pool.objects.create(name="Other", slug="other")
    signed_in(client, "staff", staff=True)

    answer = client.post("/chat/tokens/", {"target": "pool:chat"})

    token = ApiToken.objects.get(pk=answer.json()["id"])
    assert (token.pools, token.services, token.all_pools) == (["chat"], [], False)
    assert token.may_call(scopes.pool("chat")) and not token.may_call(scopes.pool("other"))
    assert token.expires_at is not None and token.expires_at <= timezone.now() + CHAT_TOKEN_TTL


def test_the_page_revokes_its_token_and_a_second_revoke_finds_none(client: Client) -> None:
    service = make_service("chat-a")
    signed_in(client, "staff", staff=True)
    issued = client.post("/chat/tokens/", {"target": f"service:{service.pk}"}).json()

    first = client.post(issued["revoke_url"])
    second = client.post(issued["revoke_url"])

    assert (first.status_code, second.status_code) == (204, 404)
    assert ApiToken.objects.get(pk=issued["id"]).is_revoked


def test_no_one_else_revokes_a_page_token_nor_any_other_token_through_the_page(
    client: Client,
) -> None:
    service = make_service("chat-a")
    signed_in(client, "staff", staff=True)
    issued = client.post("/chat/tokens/", {"target": f"service:{service.pk}"}).json()
    app_token, _ = ApiToken.issue("app", services=["chat-a"], created_by=make_user("someone"))

    other = Client()
    signed_in(other, "other-staff", staff=True)
    assert other.post(issued["revoke_url"]).status_code == 404
    assert client.post(f"/chat/tokens/{app_token.pk}/revoke/").status_code == 404
    assert not ApiToken.objects.get(pk=issued["id"]).is_revoked
    assert not ApiToken.objects.get(pk=app_token.pk).is_revoked


def test_a_viewer_gets_no_token_and_an_outsider_does_not_see_the_service(
    client: Client,
) -> None:
    project = Project.objects.create(name="team")
    service = make_service("chat-a", project="team")
    viewer = make_user("viewer")
    add_member(project, viewer, Role.VIEWER)
    client.force_login(viewer)

    refused = client.post("/chat/tokens/", {"target": f"service:{service.pk}"})
    outsider = Client()
    signed_in(outsider, "outsider")
    unseen = outsider.post("/chat/tokens/", {"target": f"service:{service.pk}"})

    assert refused.status_code == 403
    assert unseen.status_code == 404
    assert not ApiToken.objects.exists()
    assert f"service:{service.pk}" not in outsider.get("/chat/").content.decode()


def test_the_page_preselects_the_service_it_was_opened_from(client: Client) -> None:
    make_service("chat-a")
    chosen = make_service("chat-b", open_to_public=True)
    signed_in(client, "staff", staff=True)

    page = client.get(f"/chat/?service={chosen.pk}").content.decode()
    button = render_to_string("serving/chat_button.html", {"service": chosen, "alive": True})

    assert f'<option value="service:{chosen.pk}" data-base-path="/serve/chat-b/v1"' in page
    assert 'data-needs-token="false" selected>chat-b (public)</option>' in page
    assert f'href="/chat/?service={chosen.pk}" title="LLM Chat Test">Start chat</a>' in button


def test_the_page_preselects_a_pool_and_lists_no_service_pool_as_a_pool(client: Client) -> None:
    Pool.objects.create(name="Chat", slug="chat")
    Pool.objects.create(name="Fast", slug="fast")
    make_service("chat-a")  # its managed pool is the service, not a pool of its own
    signed_in(client, "staff", staff=True)

    page = client.get("/chat/?pool=fast").content.decode()

    assert '<option value="pool:fast" data-base-path="/v1" data-model="@pool/fast"' in page
    assert 'data-needs-token="true" selected>Fast (@pool/fast)</option>' in page
    assert 'value="pool:chat-a"' not in page


def test_the_page_says_which_service_is_asleep_and_that_a_message_wakes_it(
    client: Client,
) -> None:
    make_service("sleeper", desired_replicas=0, scale_to_zero_after_s=60)
    make_service("awake", desired_replicas=1, scale_to_zero_after_s=60)
    signed_in(client, "staff", staff=True)

    page = client.get("/chat/").content.decode()

    asleep = [line for line in page.splitlines() if 'data-asleep="true"' in line]
    assert len(asleep) == 1 and ">sleeper (private, asleep)<" in asleep[0]
    assert ">awake (private)<" in page
