"""Websockets open only from pages of this Nexus (host and port); unknown paths close cleanly."""

from __future__ import annotations

import logging

import pytest
from asgiref.sync import sync_to_async

from tests.support.sockets import answer_to, session_cookie

LIVE_PAGE = "/ws/pools/"


async def answer(path: str, *headers: tuple[bytes, bytes]) -> tuple[bool, int | None]:
    """Open a staff user's socket with these headers and return how it was answered."""
    cookie = await sync_to_async(session_cookie)("ops", staff=True)
    return await answer_to(path, [*headers, cookie])


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("origin", "host", "admitted"),
    [
        ("http://127.0.0.1:8000", "127.0.0.1:8000", True),
        ("http://localhost", "localhost", True),
        ("http://localhost:80", "localhost", True),
        # Another program's page on the same machine, another port: another site.
        ("http://127.0.0.1:3000", "127.0.0.1:8000", False),
        ("http://localhost", "localhost:8000", False),
        # Behind a TLS proxy the page is https and the socket arrives as ws: the port decides.
        ("https://localhost", "localhost:443", True),
        ("http://evil.example", "evil.example", False),
        ("null", "127.0.0.1:8000", False),
    ],
)
async def test_a_socket_is_admitted_only_from_the_same_host_and_port(
    origin: str, host: str, admitted: bool
) -> None:
    connected, _ = await answer(LIVE_PAGE, (b"origin", origin.encode()), (b"host", host.encode()))

    assert connected is admitted


@pytest.mark.django_db(transaction=True)
async def test_a_socket_without_an_origin_is_refused() -> None:
    connected, _ = await answer(LIVE_PAGE, (b"host", b"127.0.0.1:8000"))

    assert connected is False


@pytest.mark.django_db(transaction=True)
async def test_an_unknown_path_closes_cleanly_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG):
        connected, code = await answer(
            "/ws/nothing-here/",
            (b"origin", b"http://127.0.0.1:8000"),
            (b"host", b"127.0.0.1:8000"),
        )

    assert (connected, code) == (False, 4404)
    assert not [record for record in caplog.records if record.exc_info]
