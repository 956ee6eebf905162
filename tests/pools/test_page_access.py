"""The pools pages by project role: a project's people see its pools, nobody else does (404,
so no name leaks), and a push rendered for everyone reaches staff's sockets only."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.test import Client

from nexus.models import Project
from tests.nexus.factories import make_pool
from tests.support.personas import Cast, make_cast
from tests.support.sockets import refused_socket, socket_of


def browser(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def acme_and_rival() -> Cast:
    """The acme project's people, acme's pool `acme-chat` and another project's `rival-chat`."""
    acme = Project.objects.create(name="acme")
    make_pool("acme-chat", name="Acme chat", project=acme)
    make_pool("rival-chat", name="Rival chat", project=Project.objects.create(name="rival"))
    return make_cast(acme)


@pytest.fixture
def cast(db: None) -> Cast:
    return acme_and_rival()


@pytest.mark.parametrize(
    ("who", "listed"),
    [
        ("owner", {"Acme chat"}),
        ("teammate", {"Acme chat"}),
        ("outsider", set()),
        ("staff", {"Acme chat", "Rival chat"}),
    ],
)
def test_the_list_shows_exactly_the_visible_pools(cast: Cast, who: str, listed: set[str]) -> None:
    page = browser(getattr(cast, who)).get("/pools/").content.decode()

    assert {name for name in ("Acme chat", "Rival chat") if name in page} == listed


@pytest.mark.parametrize(
    ("who", "acme", "rival"),
    [("owner", 200, 404), ("teammate", 200, 404), ("outsider", 404, 404), ("staff", 200, 200)],
)
def test_a_pool_outside_ones_projects_is_404(cast: Cast, who: str, acme: int, rival: int) -> None:
    client = browser(getattr(cast, who))

    assert client.get("/pools/acme-chat/").status_code == acme
    assert client.get("/pools/rival-chat/").status_code == rival


def test_only_staff_pages_open_the_live_socket(cast: Cast) -> None:
    for who, live in (("owner", False), ("teammate", False), ("staff", True)):
        page = browser(getattr(cast, who)).get("/pools/").content.decode()
        assert ('ws-connect="/ws/pools/"' in page) is live, who


async def test_pushes_reach_staff_sockets_only(transactional_db: None) -> None:
    cast = await sync_to_async(acme_and_rival)()
    staff = await socket_of("/ws/pools/", cast.staff)
    try:
        state = await staff.receive_from(timeout=5)
        assert "Acme chat" in state and "Rival chat" in state
        for who in ("owner", "teammate", "outsider"):
            assert await refused_socket("/ws/pools/", getattr(cast, who)) == (False, 1000), who

        await sync_to_async(make_pool)("hidden-chat", name="Hidden chat")

        assert "Hidden chat" in await staff.receive_from(timeout=5)
    finally:
        await staff.disconnect()
