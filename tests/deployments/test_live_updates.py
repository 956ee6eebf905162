"""Live deployment page: a node row's change reaches signed-in pages over /ws/deployments/<id>/."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from deployments import live
from deployments.models import Deployment, DeploymentNode, NodeState
from nexus.asgi import application
from tests.deployments.factories import make_deployment, make_node
from tests.nexus.factories import make_user

ORIGIN = (b"origin", b"http://127.0.0.1")
MIB = 1024 * 1024


def session_cookie(username: str) -> tuple[bytes, bytes]:
    """Return a Cookie header that signs in a new user."""
    client = Client()
    client.force_login(make_user(username))
    name = settings.SESSION_COOKIE_NAME
    return (b"cookie", f"{name}={client.cookies[name].value}".encode())


def two_deployments() -> tuple[Deployment, Deployment]:
    gpu_a, gpu_b = make_node("gpu-a"), make_node("gpu-b")
    watched = make_deployment("watched", {gpu_a: NodeState.RUNNING, gpu_b: NodeState.PENDING})
    other = make_deployment("other", {gpu_a: NodeState.RUNNING})
    return watched, other


async def connect(path: str, *headers: tuple[bytes, bytes]) -> WebsocketCommunicator:
    socket = WebsocketCommunicator(application, path, headers=[ORIGIN, *headers])
    connected, _ = await socket.connect()
    assert connected
    return socket


@pytest.fixture
async def deployments(transactional_db: None) -> tuple[Deployment, Deployment]:
    return await sync_to_async(two_deployments)()


@pytest.fixture
async def teammate_socket(
    deployments: tuple[Deployment, Deployment],
) -> AsyncIterator[WebsocketCommunicator]:
    cookie = await sync_to_async(session_cookie)("teammate")
    socket = await connect(f"/ws/deployments/{deployments[0].pk}/", cookie)
    yield socket
    await socket.disconnect()


async def test_an_outsider_is_refused(deployments: tuple[Deployment, Deployment]) -> None:
    socket = WebsocketCommunicator(
        application, f"/ws/deployments/{deployments[0].pk}/", headers=[ORIGIN]
    )

    connected, code = await socket.connect()

    assert (connected, code) == (False, 1000)


async def test_a_node_rows_progress_is_pushed_with_the_summary(
    deployments: tuple[Deployment, Deployment], teammate_socket: WebsocketCommunicator
) -> None:
    row = await DeploymentNode.objects.aget(deployment=deployments[0], node__name="gpu-a")
    await DeploymentNode.objects.filter(pk=row.pk).aupdate(
        phase="downloading", bytes_done=12 * MIB, bytes_total=48 * MIB, percent=25.0
    )

    await sync_to_async(live.node_changed)(row.pk)
    fragment = await teammate_socket.receive_from(timeout=5)

    assert fragment.lstrip().startswith(
        f'<tr id="deployment-node-{row.pk}" data-state="running" hx-swap-oob="true">'
    )
    assert '<progress max="100" value="25.0"></progress>' in fragment
    assert "12.0 of 48.0 MiB" in fragment
    assert '<p id="deployment-summary" class="facts" hx-swap-oob="true">' in fragment


async def test_another_deployments_rows_are_not_pushed(
    deployments: tuple[Deployment, Deployment], teammate_socket: WebsocketCommunicator
) -> None:
    other_row = await DeploymentNode.objects.aget(deployment=deployments[1])

    await sync_to_async(live.node_changed)(other_row.pk)

    assert await teammate_socket.receive_nothing(timeout=0.5)
