"""The Django admin for deployments: readable by a superuser, node rows never edited by hand."""

from __future__ import annotations

import pytest
from django.test import Client

from deployments.models import NodeState
from tests.deployments.factories import make_deployment, make_node
from tests.nexus.factories import make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def superuser() -> Client:
    client = Client()
    client.force_login(make_user("root", superuser=True))
    return client


def test_a_superuser_reads_deployments_and_their_rows(superuser: Client) -> None:
    deployment = make_deployment("demo", {make_node("gpu-a"): NodeState.FAILED})
    row = deployment.nodes.get()

    listed = superuser.get("/admin/deployments/deployment/")
    change = superuser.get(f"/admin/deployments/deployment/{deployment.pk}/change/")
    row_page = superuser.get(f"/admin/deployments/deploymentnode/{row.pk}/change/")

    assert listed.status_code == 200
    assert "Failed" in listed.content.decode()
    assert change.status_code == 200
    assert "gpu-a" in change.content.decode()
    assert row_page.status_code == 200


def test_deployments_are_started_from_the_page_not_the_admin(superuser: Client) -> None:
    assert superuser.get("/admin/deployments/deployment/add/").status_code == 403
    assert superuser.get("/admin/deployments/deploymentnode/add/").status_code == 403
