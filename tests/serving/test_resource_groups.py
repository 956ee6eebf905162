"""Resource groups: the page lists them with their nodes and services; staff create one and
edit which nodes it spans; a group no revision names is deleted (page and API), one in use or
the default is refused with the reason."""

from __future__ import annotations

import pytest
from django.test import Client

from serving.models import ResourceGroup, Service, ServiceLifecycle
from tests.deployments.factories import make_node
from tests.nexus.factories import make_user
from tests.serving.test_services_api import make_service
from tests.support.personas import default_viewer, signed_in

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("data_dir")]

GROUPS = "/serving/resource-groups/"
API = "/api/v1/resource-groups/"


@pytest.fixture
def staff() -> Client:
    client = Client()
    client.force_login(make_user("operator", staff=True))
    return client


def test_the_page_lists_groups_with_their_nodes_and_services(staff: Client) -> None:
    gpu = ResourceGroup.objects.create(name="gpu")
    gpu.nodes.add(make_node("gpu-a"), make_node("gpu-b"))
    make_service("chat", resource_group="gpu")

    page = staff.get(GROUPS).content.decode()

    row = page[page.index('<tr id="resource-group-gpu">') :].split("</tr>")[0]
    assert ">gpu-a</a>, <a" in row
    assert '<td class="num">1</td>' in row
    default = page[page.index('<tr id="resource-group-default">') :].split("</tr>")[0]
    assert "Every trusted node" in default


def test_staff_create_a_group_of_chosen_nodes(staff: Client) -> None:
    node = make_node("gpu-a")
    make_node("gpu-b")

    response = staff.post(GROUPS, {"name": "gpu", "nodes": [node.pk]})

    assert response.status_code == 302
    assert list(ResourceGroup.objects.get(name="gpu").nodes.values_list("name", flat=True)) == [
        "gpu-a"
    ]


def test_a_group_needs_nodes_or_every_node(staff: Client) -> None:
    response = staff.post(GROUPS, {"name": "empty"})

    assert response.status_code == 400
    assert "Choose the nodes, or every node." in response.content.decode()
    assert not ResourceGroup.objects.filter(name="empty").exists()


def test_staff_change_which_nodes_a_group_spans_but_not_its_name(staff: Client) -> None:
    a, b = make_node("gpu-a"), make_node("gpu-b")
    gpu = ResourceGroup.objects.create(name="gpu")
    gpu.nodes.add(a)

    response = staff.post(f"{GROUPS}gpu/", {"name": "renamed", "nodes": [b.pk]})

    assert response.status_code == 302
    gpu.refresh_from_db()
    assert gpu.name == "gpu"
    assert list(gpu.nodes.values_list("name", flat=True)) == ["gpu-b"]


def test_a_teammate_sees_the_groups_but_changes_none() -> None:
    client = Client()
    client.force_login(default_viewer("teammate"))

    page = client.get(GROUPS)
    created = client.post(GROUPS, {"name": "gpu", "all_nodes": "on"})

    assert page.status_code == 200
    assert "New resource group" not in page.content.decode()
    assert created.status_code == 403
    assert client.get(f"{GROUPS}default/").status_code == 403


def test_staff_delete_an_unused_group_on_the_page(staff: Client) -> None:
    ResourceGroup.objects.create(name="spare", all_nodes=True)

    asked = staff.get(f"{GROUPS}spare/delete/")
    response = staff.post(f"{GROUPS}spare/delete/")

    assert "the group goes, its nodes stay as they are" in asked.content.decode()
    assert response.status_code == 302
    assert not ResourceGroup.objects.filter(name="spare").exists()


def test_the_api_deletes_an_unused_group() -> None:
    ResourceGroup.objects.create(name="spare", all_nodes=True)

    response = signed_in(make_user("operator", staff=True)).delete(f"{API}spare/")

    assert response.status_code == 204
    assert not ResourceGroup.objects.filter(name="spare").exists()


def test_the_api_refuses_to_delete_a_group_a_destroyed_service_ran_in() -> None:
    ResourceGroup.objects.create(name="gpu", all_nodes=True)
    gone = make_service("chat", resource_group="gpu")
    Service.objects.filter(pk=gone.pk).update(lifecycle=ServiceLifecycle.DESTROYED)

    response = signed_in(make_user("operator", staff=True)).delete(f"{API}gpu/")

    assert response.status_code == 409
    assert response.json()["detail"] == (
        "The resource group gpu is used by the service chat (destroyed ones included: their "
        "revisions keep where they ran)."
    )
    assert ResourceGroup.objects.filter(name="gpu").exists()


def test_the_default_group_is_never_deleted(staff: Client) -> None:
    api = signed_in(make_user("admin", staff=True)).delete(f"{API}default/")
    page = staff.post(f"{GROUPS}default/delete/")

    assert api.status_code == 409
    assert "where services go unless told otherwise" in api.json()["detail"]
    assert page.status_code == 302
    assert ResourceGroup.objects.filter(name="default").exists()
