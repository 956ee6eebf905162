"""The services list: a property filter (name, service URL; owner for staff), each service's
readiness, URL, replicas, runtime and age, and for staff its owner and a Delete control that
confirms with true counts; live for staff over /ws/serving/services/."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from serving import live as serving_live
from serving.models import Route, RouteState, Service, ServiceLifecycle
from tests.nexus.factories import make_user
from tests.serving.test_services_api import make_service
from tests.support.personas import default_viewer
from tests.support.sockets import refusal, socket_of

LIST = "/serving/services/"
pytestmark = pytest.mark.usefixtures("data_dir")


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def owned_service(name: str, owner: User, **settings: Any) -> Service:
    service = make_service(name, **settings)
    Service.objects.filter(pk=service.pk).update(owner=owner)
    return service


def listed(client: Client, **query: str) -> str:
    response = client.get(LIST, query)
    assert response.status_code == 200
    return response.content.decode()


def names_in(page: str) -> list[str]:
    """Return the services whose rows the page shows, in order."""
    return [chunk.split('/"', 1)[0] for chunk in page.split('<td><a href="/serving/services/')[1:]]


@pytest.mark.django_db
def test_the_list_filters_by_a_part_of_the_name() -> None:
    staff = make_user("owner", staff=True)
    for name in ("chat-small", "chat-large", "embed"):
        make_service(name)

    assert names_in(listed(signed_in(staff), property="name", value="CHAT")) == [
        "chat-large",
        "chat-small",
    ]


@pytest.mark.django_db
def test_the_list_filters_by_the_service_url_pasted_whole() -> None:
    staff = make_user("owner", staff=True)
    make_service("chat")
    make_service("embed")

    page = listed(signed_in(staff), property="url", value="http://nexus:8000/serve/embed/v1")

    assert names_in(page) == ["embed"]


@pytest.mark.django_db
def test_staff_filter_by_owner() -> None:
    staff = make_user("owner", staff=True)
    alice = make_user("alice")
    owned_service("chat", alice)
    owned_service("embed", staff)

    page = listed(signed_in(staff), property="owner", value="ali")

    assert names_in(page) == ["chat"]
    assert '<option value="owner" selected>Owner</option>' in page
    assert "<td>alice</td>" in page


@pytest.mark.django_db
def test_a_teammate_sees_no_owner_and_cannot_filter_by_it() -> None:
    alice = make_user("alice")
    owned_service("chat", alice)
    owned_service("embed", alice)

    page = listed(signed_in(default_viewer("teammate")), property="owner", value="nobody")

    # The owner filter falls back to the name, which "nobody" matches in none.
    assert names_in(page) == []
    assert "No services match" in page
    assert 'value="owner"' not in page
    assert '<th scope="col">Owner</th>' not in page
    assert "Controls" not in page


@pytest.mark.django_db
def test_a_row_shows_readiness_url_replicas_runtime_and_a_delete_control() -> None:
    staff = make_user("owner", staff=True)
    service = owned_service("chat", staff, desired_replicas=3)
    revision = service.latest_revision
    for state in (RouteState.HEALTHY, RouteState.HEALTHY, RouteState.PROVISIONING):
        Route.objects.create(service=service, revision=revision, state=state)
    Route.objects.create(service=service, revision=revision, state=RouteState.TERMINATED)

    page = listed(signed_in(staff))

    row = page[page.index(f'<tr id="service-{service.pk}"') :].split("</tr>")[0]
    assert "2 of 3 replicas ready" in row
    assert "<code>/serve/chat/</code>" in row
    assert '<td class="num">3</td>' in row
    assert "<td>vllm</td>" in row
    assert f'data-dialog="delete-service-{service.pk}"' in row
    assert 'action="/serving/services/chat/delete/?next=list"' in row
    # The confirmation's counts: the terminated route is history, not live.
    assert "3 live routes stop taking requests" in row
    assert "1 finished route is kept in its history" in row


@pytest.mark.django_db
def test_deleting_from_the_list_returns_to_the_list() -> None:
    staff = make_user("owner", staff=True)
    make_service("chat")

    response = signed_in(staff).post("/serving/services/chat/delete/?next=list")

    assert response.status_code == 302
    assert response["Location"] == LIST
    assert Service.objects.get().lifecycle == ServiceLifecycle.DESTROYING


@pytest.mark.django_db
def test_a_destroyed_service_is_found_under_destroyed_by_its_name() -> None:
    staff = make_user("owner", staff=True)
    gone = make_service("chat")
    Service.objects.filter(pk=gone.pk).update(lifecycle=ServiceLifecycle.DESTROYED)
    make_service("embed")

    client = signed_in(staff)

    assert names_in(listed(client, property="name", value="chat")) == []
    assert names_in(listed(client, tab="destroyed", property="name", value="chat")) == ["chat"]


# Live


@pytest.fixture(autouse=True)
def nothing_pushed_yet() -> None:
    """Forget the rows an earlier test pushed (ids repeat between tests)."""
    serving_live._last_pushed.clear()
    serving_live._cards_seen.clear()


@pytest.fixture
async def staff_socket(transactional_db: None) -> AsyncIterator[WebsocketCommunicator]:
    staff = await sync_to_async(make_user)("operator", staff=True)
    socket = await socket_of("/ws/serving/services/", staff)
    yield socket
    await socket.disconnect()


async def test_an_outsider_and_a_teammate_are_refused_the_list_socket(
    transactional_db: None,
) -> None:
    assert await refusal("/ws/serving/services/") == (False, 1000)
    assert await refusal("/ws/serving/services/", "teammate") == (False, 1000)


async def test_a_changed_service_is_pushed_as_its_row_once(
    staff_socket: WebsocketCommunicator,
) -> None:
    assert await staff_socket.receive_nothing(timeout=0.3)  # no services yet: nothing to catch up
    service = await sync_to_async(make_service)("chat", desired_replicas=2)

    await sync_to_async(serving_live.service_changed)(service.pk)
    fragment = await staff_socket.receive_from(timeout=5)

    assert fragment.lstrip().startswith(f'<tr id="service-{service.pk}" hx-swap-oob="true">')
    assert "0 of 2 replicas ready" in fragment
    # Unchanged, it is not pushed again.
    await sync_to_async(serving_live.service_changed)(service.pk)
    assert await staff_socket.receive_nothing(timeout=1.5)
