"""One definition per runtime: a deployment's agent job, a service's runtime variant and the
catalogue build the same command for the same inputs (issue 19, done-when 1)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pytest_django.fixtures import Settings

from deployments.models import Deployment, ModelSource, Runtime
from nodes.agent.jobs import parse_deploy
from nodes.agent.runtimes import serve_argv
from nodes.runtimes import DEPLOYABLE_NAMES, PORT_PLACEHOLDER, build_command
from serving.launch import resolve_launch
from serving.models import ModelFolder
from serving.replicas import map_mount

pytestmark = pytest.mark.django_db
# The runtimes both a deployment and a service can run with a built-in command.
SHARED = ["simulator", "llama-cpp", "vllm", "sglang"]


@pytest.fixture
def folder(settings: Settings, tmp_path: Path) -> ModelFolder:
    """A model folder holding one .gguf file (llama.cpp serves that file, the others the folder)."""
    settings.DATA_DIR = tmp_path / "data"
    folder = ModelFolder.objects.create(name="tiny")
    folder.path.mkdir(parents=True)
    (folder.path / "tiny.gguf").write_bytes(b"GGUF")
    return folder


def served_path(folder: ModelFolder, name: str) -> Path:
    return folder.path / "tiny.gguf" if name == "llama-cpp" else folder.path


@pytest.mark.parametrize("name", SHARED)
def test_a_deployment_a_service_and_the_catalogue_build_the_same_command(
    folder: ModelFolder, name: str
) -> None:
    # Given the same model file or folder, served as the same name, on the agent's port
    model = served_path(folder, name)
    expected = build_command(
        name, model_path=str(model), model_name="tiny", port=PORT_PLACEHOLDER, env={}
    )
    # When a deployment's job reaches the agent (its own interpreter: no venv in this comparison)
    deployment = Deployment(
        name="d",
        runtime=name,
        model_source=ModelSource.PATH,
        model_location=str(model),
        model_name="tiny",
    )
    request = parse_deploy(deployment.job_spec(), [folder.path.parent])
    deployed = serve_argv(request.runtime, None, Path(request.model.location), request.model.name)
    # And a service of the same runtime variant is resolved, its mount mapped to the folder
    launch = resolve_launch(model_folder=folder, runtime_variant=name, model_name="tiny")
    served = [
        map_mount(arg, launch.mount_destination, str(folder.path)) for arg in launch.spec["argv"]
    ]

    # Then all three are one command
    assert deployed == served == expected


def test_deployments_offer_exactly_the_catalogues_deployable_runtimes() -> None:
    assert sorted(Runtime.values) == sorted(DEPLOYABLE_NAMES)
    assert "llama.cpp" not in Runtime.values
