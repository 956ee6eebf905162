"""The service page's live cards over /ws/serving/services/<pk>/: sent as the page connects and
pushed when they read differently, per audience; refused outside the service's project. The
route drawer shows where a route runs, its probes, errors and log tail."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from serving import live as serving_live
from serving.models import Route, RouteState, Service
from tests.nexus.factories import make_user
from tests.serving.test_services_api import make_service
from tests.support.personas import default_viewer
from tests.support.sockets import refused_socket, socket_of

pytestmark = pytest.mark.usefixtures("data_dir")


@pytest.fixture(autouse=True)
def nothing_pushed_yet() -> Iterator[None]:
    """Forget the fragments an earlier test pushed (ids repeat between tests)."""
    serving_live._last_pushed.clear()
    serving_live._cards_seen.clear()
    yield
    serving_live._last_pushed.clear()
    serving_live._cards_seen.clear()


def path_of(service: Service) -> str:
    return f"/ws/serving/services/{service.pk}/"


async def test_a_teammate_gets_the_cards_on_connect_and_then_a_change(
    transactional_db: None,
) -> None:
    service = await sync_to_async(make_service)("chat", desired_replicas=2)
    teammate = await sync_to_async(default_viewer)("teammate")
    socket = await socket_of(path_of(service), teammate)
    try:
        first = await socket.receive_from(timeout=5)
        assert '<div id="service-banner" hx-swap-oob="true">' in first
        assert "<strong>Preparing.</strong>" in first
        assert '<div id="routes-running" hx-swap-oob="true">' in first
        assert '<div id="routes-finished" hx-swap-oob="true">' in first
        # A viewer's cards carry no control that changes anything.
        assert "Clear errors and retry" not in first and "Revoke" not in first

        await sync_to_async(Route.objects.create)(
            service=service, revision=service.latest_revision, state=RouteState.HEALTHY
        )
        await sync_to_async(serving_live.service_changed)(service.pk)
        pushed = await socket.receive_from(timeout=5)
        assert "<strong>Ready, degraded.</strong> 1 of 2 replicas ready" in pushed
    finally:
        await socket.disconnect()


async def test_an_outsider_is_refused_the_service_socket(transactional_db: None) -> None:
    service = await sync_to_async(make_service)("chat")
    outsider = await sync_to_async(make_user)("outsider")

    assert await refused_socket(path_of(service), outsider) == (False, 1000)


@pytest.mark.django_db
def test_the_route_drawer_shows_where_it_ran_and_the_kept_log_tail() -> None:
    service = make_service("chat")
    error = {"at": "2026-01-01T00:00:00Z", "message": "exited with 1", "log_tail": "boom\n"}
    route = Route.objects.create(
        service=service,
        revision=service.latest_revision,
        state=RouteState.FAILED_TO_START,
        port=41001,
        errors=[error],
    )
    client = Client()
    client.force_login(default_viewer("teammate"))

    page = client.get(f"/serving/services/chat/routes/{route.pk}/").content.decode()

    assert f"<h3>Route {route.pk} · revision 1</h3>" in page
    assert "<dt>Port</dt><dd>41001</dd>" in page
    assert "&quot;log_tail&quot;: &quot;boom\\n&quot;" in page
    assert "<code>boom\n</code>" in page


@pytest.mark.django_db
def test_a_reader_sees_whose_project_it_is_and_edit_disabled_while_staff_get_edit() -> None:
    make_service("chat")
    reader = Client()
    reader.force_login(default_viewer("teammate"))
    staff = Client()
    staff.force_login(make_user("owner", staff=True))

    as_reader = reader.get("/serving/services/chat/").content.decode()
    as_staff = staff.get("/serving/services/chat/").content.decode()

    assert 'id="service-project"' in as_reader and "<strong>Project default.</strong>" in as_reader
    edit = 'class="button" disabled aria-describedby="service-project">Edit</button>'
    assert edit in as_reader
    assert "/serving/services/chat/edit/" not in as_reader
    assert 'id="service-project"' not in as_staff
    assert 'href="/serving/services/chat/edit/"' in as_staff
