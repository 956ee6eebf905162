"""The serving pages by project role: a project's people see its services and model folders,
nobody else does (404, so no name leaks), and only staff change them through the pages."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client
from pytest_django.fixtures import Settings

from nexus.models import Project
from serving import folders, services
from serving.models import ModelFolder, Service
from tests.support.personas import Cast, make_cast

pytestmark = pytest.mark.django_db

PEOPLE = ("owner", "teammate", "outsider", "staff")
# What each persona sees of acme's and rival's: 200 where they see it, 404 where they do not.
SEEN = {
    "owner": (200, 404),
    "teammate": (200, 404),
    "outsider": (404, 404),
    "staff": (200, 200),
}


@pytest.fixture
def cast(settings: Settings, tmp_path: Path) -> Cast:
    """acme's people; a folder and a service in acme (`acme-*`) and in rival (`rival-*`)."""
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.mkdir()
    acme = Project.objects.create(name="acme")
    Project.objects.create(name="rival")
    for project in ("acme", "rival"):
        folders.create_folder(ModelFolder(name=f"{project}-llama", project=project))
        services.create_service(
            name=f"{project}-chat",
            project=project,
            model_folder=f"{project}-llama",
            runtime_variant="vllm",
        )
    return make_cast(acme)


def browser(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def shown(page: str, *names: str) -> set[str]:
    return {name for name in names if f"/{name}/" in page}


@pytest.mark.parametrize("who", PEOPLE)
def test_the_lists_show_exactly_the_visible_services_and_folders(cast: Cast, who: str) -> None:
    client = browser(getattr(cast, who))
    expected = {
        project
        for project, status in zip(("acme", "rival"), SEEN[who], strict=True)
        if status == 200
    }

    service_page = client.get("/serving/services/").content.decode()
    folder_page = client.get("/serving/models/").content.decode()

    assert shown(service_page, "acme-chat", "rival-chat") == {f"{p}-chat" for p in expected}
    assert shown(folder_page, "acme-llama", "rival-llama") == {f"{p}-llama" for p in expected}


@pytest.mark.parametrize("who", PEOPLE)
def test_pages_of_another_projects_service_or_folder_are_404(cast: Cast, who: str) -> None:
    client = browser(getattr(cast, who))

    for project, status in zip(("acme", "rival"), SEEN[who], strict=True):
        assert client.get(f"/serving/services/{project}-chat/").status_code == status
        assert client.get(f"/serving/models/{project}-llama/").status_code == status


@pytest.mark.parametrize(
    ("who", "status"), [("teammate", 403), ("owner", 403), ("outsider", 404), ("staff", 302)]
)
def test_changes_through_the_pages_stay_with_staff(cast: Cast, who: str, status: int) -> None:
    client = browser(getattr(cast, who))

    scaled = client.post("/serving/services/acme-chat/scale/", {"desired_replicas": "3"})
    deleted = client.post("/serving/models/acme-llama/delete-file/", {"path": "none"})

    assert scaled.status_code == status
    assert deleted.status_code == status
    replicas = Service.objects.get(name="acme-chat").desired_replicas
    assert replicas == (3 if who == "staff" else 1)


def test_an_outsider_meets_404_on_every_service_action(cast: Cast) -> None:
    client = browser(cast.outsider)

    for action in ("scale/", "delete/", "edit/", "tokens/", "tokens/1/revoke/"):
        assert client.post(f"/serving/services/acme-chat/{action}").status_code == 404, action
