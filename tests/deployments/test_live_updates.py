"""Live deployment page: a node row's change reaches signed-in pages over /ws/deployments/<id>/,
rendered from the page's own partials; the retry button only in the version for staff."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from deployments import live
from deployments.models import Deployment, DeploymentNode, NodeState
from tests.deployments.factories import make_deployment, make_node
from tests.support.sockets import refusal, signed_in_socket

MIB = 1024 * 1024


def two_deployments() -> tuple[Deployment, Deployment]:
    gpu_a, gpu_b = make_node("gpu-a"), make_node("gpu-b")
    watched = make_deployment("watched", {gpu_a: NodeState.RUNNING, gpu_b: NodeState.PENDING})
    other = make_deployment("other", {gpu_a: NodeState.RUNNING})
    return watched, other


@pytest.fixture
async def deployments(transactional_db: None) -> tuple[Deployment, Deployment]:
    return await sync_to_async(two_deployments)()


@pytest.fixture
async def teammate_socket(
    deployments: tuple[Deployment, Deployment],
) -> AsyncIterator[WebsocketCommunicator]:
    socket = await signed_in_socket(f"/ws/deployments/{deployments[0].pk}/", "teammate")
    await socket.receive_from(timeout=5)  # the state on connect
    yield socket
    await socket.disconnect()


async def test_an_outsider_is_refused(deployments: tuple[Deployment, Deployment]) -> None:
    assert await refusal(f"/ws/deployments/{deployments[0].pk}/") == (False, 1000)


async def test_a_deployment_that_does_not_exist_is_refused(transactional_db: None) -> None:
    assert await refusal("/ws/deployments/999/", "teammate") == (False, 1000)


async def test_a_page_that_connects_gets_every_row_and_the_summary(
    deployments: tuple[Deployment, Deployment],
) -> None:
    socket = await signed_in_socket(f"/ws/deployments/{deployments[0].pk}/", "teammate")

    state = await socket.receive_from(timeout=5)

    assert state.lstrip().startswith(
        '<table class="deployment-nodes" id="deployment-nodes" hx-swap-oob="true">'
    )
    rows = [row async for row in DeploymentNode.objects.filter(deployment=deployments[0])]
    for row in rows:
        assert f'<tr id="deployment-node-{row.pk}" data-state="{row.state}">' in state
    assert '<div id="deployment-summary" class="facts" hx-swap-oob="true">' in state
    await socket.disconnect()


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
        '<table class="deployment-nodes" id="deployment-nodes" hx-swap-oob="true">'
    )
    assert f'<tr id="deployment-node-{row.pk}" data-state="running">' in fragment
    assert '<progress max="100" value="25.0"></progress>' in fragment
    assert "Running (downloading, 25 %)" in fragment
    assert "12 MiB of 48 MiB" in fragment
    assert '<div id="deployment-summary" class="facts" hx-swap-oob="true">' in fragment


async def test_a_failed_node_brings_the_retry_button_to_staff_pages_only(
    deployments: tuple[Deployment, Deployment], teammate_socket: WebsocketCommunicator
) -> None:
    owner_socket = await signed_in_socket(
        f"/ws/deployments/{deployments[0].pk}/", "owner", staff=True
    )
    assert "Retry failed nodes" not in await owner_socket.receive_from(timeout=5)
    row = await DeploymentNode.objects.aget(deployment=deployments[0], node__name="gpu-b")
    await DeploymentNode.objects.filter(pk=row.pk).aupdate(state=NodeState.FAILED)

    await sync_to_async(live.node_changed)(row.pk)

    assert "Retry failed nodes" in await owner_socket.receive_from(timeout=5)
    assert "Retry failed nodes" not in await teammate_socket.receive_from(timeout=5)
    await owner_socket.disconnect()


async def test_another_deployments_rows_are_not_pushed(
    deployments: tuple[Deployment, Deployment], teammate_socket: WebsocketCommunicator
) -> None:
    other_row = await DeploymentNode.objects.aget(deployment=deployments[1])

    await sync_to_async(live.node_changed)(other_row.pk)

    assert await teammate_socket.receive_nothing(timeout=0.5)
