"""Extra mounts: a model definition's service may mount general or data folders beside its
model folder, each at its own path; the launcher, the API, the revision and the replica's
process all carry them."""

from __future__ import annotations

import pytest
from django.test import Client

from serving import folders, replicas, services
from serving.forms import form_data_of
from serving.launch import LaunchError
from serving.models import FolderUsage, ModelFolder, Route
from tests.nexus.factories import make_user

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("data_dir")]

DEFINITION = """\
models:
  - name: site
    model_path: /models
    service:
      start_command: [serve, /models/w.bin, --data=/data/train, /datasets]
      port: 8001
"""


@pytest.fixture
def site() -> ModelFolder:
    folder = folders.create_folder(ModelFolder(name="site"))
    folders.write_file(folder, "model-definition.yaml", [DEFINITION.encode()])
    folders.create_folder(ModelFolder(name="train", usage=FolderUsage.DATA))
    folders.create_folder(ModelFolder(name="shared", usage=FolderUsage.GENERAL))
    folders.create_folder(ModelFolder(name="other-model"))
    return folder


def problems_of(**declaration: object) -> list[tuple[str, str]]:
    with pytest.raises(LaunchError) as refused:
        services.check_service(name="svc", runtime_variant="custom", **declaration)
    return [(problem.path, problem.message) for problem in refused.value.problems]


def test_a_definitions_service_mounts_data_folders_and_its_process_sees_them(
    site: ModelFolder,
) -> None:
    mounts = [
        {"folder": "train", "destination": "/data"},
        {"folder": "shared", "destination": "/datasets/"},
    ]
    service = services.create_service(
        name="svc", model_folder=site, runtime_variant="custom", extra_mounts=mounts
    )
    route = Route.objects.create(service=service, revision=service.latest_revision)

    spec = replicas.process_spec(route)

    assert service.latest_revision.spec["extra_mounts"] == [
        {"folder": "train", "destination": "/data"},
        {"folder": "shared", "destination": "/datasets"},
    ]
    train = ModelFolder.objects.get(name="train").path
    shared = ModelFolder.objects.get(name="shared").path
    assert spec["argv"] == ["serve", f"{site.path}/w.bin", f"--data={train}/train", str(shared)]


def test_only_general_and_data_folders_are_mounted_each_at_its_own_path(
    site: ModelFolder,
) -> None:
    found = problems_of(
        model_folder=site,
        extra_mounts=[
            {"folder": "other-model", "destination": "/other"},
            {"folder": "nope", "destination": "/nope"},
            {"folder": "train", "destination": "/models/train"},
            {"folder": "shared", "destination": "relative"},
        ],
    )

    assert found == [
        (
            "extra_mounts[0]",
            "other-model is a model folder; only general and data folders are mounted",
        ),
        ("extra_mounts[1]", "no folder is named 'nope'"),
        ("extra_mounts[2]", "/models/train overlaps another mount (/models)"),
        ("extra_mounts[3]", "destination must be an absolute path like /models"),
    ]


def test_a_pasted_command_mounts_no_more_folders(site: ModelFolder) -> None:
    found = problems_of(
        model_folder=site,
        command="python -m http.server ${PORT}",
        extra_mounts=[{"folder": "train", "destination": "/data"}],
    )

    assert found == [
        ("extra_mounts", "only a model definition (Custom, definition file) mounts more folders")
    ]


def test_the_launcher_reads_and_edit_shows_the_extra_mounts(site: ModelFolder) -> None:
    client = Client()
    client.force_login(make_user("owner", staff=True))

    response = client.post(
        "/serving/services/new/",
        {
            "name": "svc",
            "model_folder": "site",
            "runtime_variant": "custom",
            "custom_mode": "definition",
            "extra_mounts": "train=/data\n\nshared=/datasets\n",
            "mount_destination": "/models",
            "desired_replicas": "1",
            "resource_group": "default",
            "cluster_mode": "single",
        },
    )

    assert response.status_code == 302
    service = services.find_service("svc")
    assert service is not None
    assert form_data_of(service)["extra_mounts"] == "train=/data\nshared=/datasets"
    page = client.get("/serving/services/svc/").content.decode()
    assert "<code>train</code> at <code>/data</code>" in page


def test_the_api_takes_extra_mounts_and_data_folders(site: ModelFolder) -> None:
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_login(make_user("owner", staff=True))

    folder = api.post("/api/v1/model-folders/", {"name": "more", "usage": "data"}, format="json")
    created = api.post(
        "/api/v1/services/",
        {
            "name": "svc",
            "model_folder": "site",
            "runtime_variant": "custom",
            "extra_mounts": [{"folder": "more", "destination": "/more"}],
        },
        format="json",
    )

    assert folder.status_code == 201, folder.json()
    assert folder.json()["usage"] == "data"
    assert created.status_code == 201, created.json()
    assert created.json()["latest_revision"]["spec"]["extra_mounts"] == [
        {"folder": "more", "destination": "/more"}
    ]
