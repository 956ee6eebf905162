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
from tests.support.sockets import socket_of


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


async def test_pushes_reach_staff_sockets_only_others_get_their_projects_table(
    transactional_db: None,
) -> None:
    cast = await sync_to_async(acme_and_rival)()
    sockets = {
        who: await socket_of("/ws/pools/", getattr(cast, who))
        for who in ("teammate", "outsider", "staff")
    }
    try:
        states = {who: await socket.receive_from(timeout=5) for who, socket in sockets.items()}
        assert "Acme chat" in states["teammate"] and "Rival chat" not in states["teammate"]
        assert "No pools yet" in states["outsider"] and "Acme chat" not in states["outsider"]
        assert "Acme chat" in states["staff"] and "Rival chat" in states["staff"]

        await sync_to_async(make_pool)("hidden-chat", name="Hidden chat")

        assert "Hidden chat" in await sockets["staff"].receive_from(timeout=5)
        assert await sockets["outsider"].receive_nothing(timeout=1.5)
        assert await sockets["teammate"].receive_nothing(timeout=0.1)
    finally:
        for socket in sockets.values():
            await socket.disconnect()
