"""Declaring model services through the admin API: create (with revision 1), read, change (a new
revision, or a scale), delete; resource groups and presets; definition checks. Every refused
request says precisely why and leaves nothing behind."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from nexus.models import ApiToken, ConfigVersion
from serving import folders, services
from serving.definitions import MODEL_DEFINITION_SCHEMA
from serving.models import (
    ModelFolder,
    ResourceGroup,
    ResourcePreset,
    Revision,
    Route,
    RouteState,
    Service,
    ServiceLifecycle,
)
from tests.deployments.factories import make_node
from tests.nexus.factories import make_pool, make_user
from tests.support.personas import signed_in

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("data_dir")]

SERVICES = "/api/v1/services/"
MODEL_DEFINITION = """\
models:
  - name: echo
    model_path: /models
    service:
      start_command: python -m http.server --port ${PORT}
      port: 8000
      health_check:
        path: /
"""
SERVICE_DEFINITION = """\
[vllm.resource_slots]
cpu = 3
mem = "2gb"

[vllm.environ]
VLLM_TP_SIZE = "2"
"""
KNOWN = "vllm, sglang, nim, modular-max, llama-cpp, custom, simulator"
GIB = 1 << 30
HEALTH = {
    "path": "/health",
    "interval": 10.0,
    "max_retries": 10,
    "max_wait_time": 15.0,
    "expected_status_code": 200,
    "initial_delay": 60.0,
}


def make_folder(name: str = "llama", **files: str) -> ModelFolder:
    """Create a model folder holding the given files (keyword: relative path)."""
    folder = folders.create_folder(ModelFolder(name=name))
    for relative, text in files.items():
        folders.write_file(folder, relative, [text.encode()])
    return folder


def make_service(name: str = "chat", **settings: Any) -> Service:
    """Create a vLLM service on the folder llama (made if missing) through the services layer."""
    if not ModelFolder.objects.filter(name="llama").exists():
        make_folder("llama")
    settings = {"model_folder": "llama", "runtime_variant": "vllm", **settings}
    return services.create_service(name=name, **settings)


@pytest.fixture
def nothing_created() -> Iterator[None]:
    """Assert that the test leaves as many services and revisions as it found."""
    before = (Service.objects.count(), Revision.objects.count())
    yield
    assert (Service.objects.count(), Revision.objects.count()) == before


def problems(response: Any) -> list[tuple[str, str, str]]:
    """Return a refusal's problems as (file, path, message)."""
    return [(p["file"], p["path"], p["message"]) for p in response.json()["problems"]]


# Creating


def test_an_owner_creates_a_vllm_service_with_its_first_revision(owner: APIClient) -> None:
    make_folder("llama")

    response = owner.post(
        SERVICES,
        {
            "name": "chat",
            "model_folder": "llama",
            "runtime_variant": "vllm",
            "environ": {"VLLM_TP_SIZE": "2"},
            "desired_replicas": 2,
            "preset": "cpu-medium",
        },
        format="json",
    )

    assert response.status_code == 201
    body = response.json()
    assert {key: body[key] for key in ("name", "owner", "lifecycle", "status", "updating")} == {
        "name": "chat",
        "owner": "owner",
        "lifecycle": "active",
        "status": "0 of 2 replicas ready",
        "updating": True,
    }
    assert (body["desired_replicas"], body["ready_replicas"], body["open_to_public"]) == (
        2,
        0,
        False,
    )
    assert (body["endpoint"], body["runtime_variant"], body["running_revision"]) == (
        "/serve/chat/",
        "vllm",
        None,
    )
    latest = body["latest_revision"]
    assert {key: latest[key] for key in ("number", "state", "model_folder", "preset")} == {
        "number": 1,
        "state": "pending",
        "model_folder": "llama",
        "preset": "cpu-medium",
    }
    assert (latest["resource_group"], latest["created_by"]) == ("default", "owner")
    assert latest["resource_slots"] == {"cpu": 2.0, "mem": 4 * GIB, "cuda.shares": 0.0}
    assert latest["spec"] == {
        "argv": [
            *("vllm", "serve", "/models", "--host", "127.0.0.1", "--port", "${PORT}"),
            *("--served-model-name", "llama", "--tensor-parallel-size", "2"),
        ],
        "env": {"VLLM_TP_SIZE": "2", "PORT": "${PORT}"},
        "port": None,
        "model_name": "llama",
        "health_check": HEALTH,
        "pre_start_actions": [],
        "capacity": 128,
    }
    assert body["routes"] == []
    assert [(r["number"], r["state"]) for r in body["revisions"]] == [(1, "pending")]
    service = Service.objects.get()
    assert service.latest_revision == Revision.objects.get(service=service, number=1)


def test_a_custom_service_runs_the_folders_model_definition(owner: APIClient) -> None:
    make_folder("echo", **{"model-definition.yaml": MODEL_DEFINITION})

    response = owner.post(
        SERVICES,
        {"name": "echo", "model_folder": "echo", "runtime_variant": "custom"},
        format="json",
    )

    assert response.status_code == 201
    spec = response.json()["latest_revision"]["spec"]
    assert spec["argv"] == ["python", "-m", "http.server", "--port", "${PORT}"]
    assert (spec["port"], spec["model_name"], spec["health_check"]["path"]) == (None, "echo", "/")


def test_a_custom_service_runs_a_pasted_command(owner: APIClient) -> None:
    make_folder("llama")

    response = owner.post(
        SERVICES,
        {
            "name": "pasted",
            "model_folder": "llama",
            "runtime_variant": "custom",
            "command": "vllm serve /models/llama --tp 2 --port 8001",
        },
        format="json",
    )

    assert response.status_code == 201
    latest = response.json()["latest_revision"]
    assert latest["command"] == "vllm serve /models/llama --tp 2 --port 8001"
    assert (latest["spec"]["argv"], latest["spec"]["port"]) == (
        ["vllm", "serve", "/models/llama", "--tp", "2", "--port", "8001"],
        8001,
    )


def test_a_pasted_commands_health_path_delay_and_retries_are_set_and_changed(
    owner: APIClient,
) -> None:
    make_folder("llama")
    command = "python -m http.server ${PORT} --directory /models"

    created = owner.post(
        SERVICES,
        {
            "name": "files",
            "model_folder": "llama",
            "runtime_variant": "custom",
            "command": command,
            "command_settings": {"health_path": "/", "initial_delay": 1.0},
        },
        format="json",
    )
    changed = owner.patch(
        f"{SERVICES}files/", {"command_settings": {"max_retries": 2}}, format="json"
    )

    assert created.status_code == 201
    first = created.json()["latest_revision"]
    assert first["command_settings"] == {"health_path": "/", "initial_delay": 1.0}
    assert first["spec"]["health_check"] == {**HEALTH, "path": "/", "initial_delay": 1.0}
    assert first["spec"]["port"] is None
    assert changed.status_code == 200
    second = changed.json()["latest_revision"]
    assert second["number"] == 2
    assert second["spec"]["health_check"] == {**HEALTH, "max_retries": 2}


def test_slots_are_the_folders_defaults_under_the_preset_under_those_given(
    owner: APIClient,
) -> None:
    make_folder("llama", **{"service-definition.toml": SERVICE_DEFINITION})

    folder_only = owner.post(
        SERVICES,
        {"name": "a", "model_folder": "llama", "runtime_variant": "vllm"},
        format="json",
    )
    with_preset = owner.post(
        SERVICES,
        {
            "name": "b",
            "model_folder": "llama",
            "runtime_variant": "vllm",
            "preset": "gpu-1",
            "resource_slots": {"mem": "32gb"},
        },
        format="json",
    )

    assert folder_only.json()["latest_revision"]["resource_slots"] == {"cpu": 3, "mem": 2 * GIB}
    assert with_preset.json()["latest_revision"]["resource_slots"] == {
        "cpu": 4.0,
        "mem": 32 * GIB,
        "cuda.shares": 1.0,
    }
    assert folder_only.json()["latest_revision"]["spec"]["env"]["VLLM_TP_SIZE"] == "2"


def test_a_name_freed_by_a_destroyed_service_can_be_used_again(owner: APIClient) -> None:
    old = make_service("chat")
    Service.objects.filter(pk=old.pk).update(lifecycle=ServiceLifecycle.DESTROYED)

    response = owner.post(
        SERVICES, {"name": "chat", "model_folder": "llama", "runtime_variant": "vllm"}
    )

    assert response.status_code == 201
    assert Service.objects.filter(name="chat").count() == 2


# Refusing, with nothing created


def refused(client: APIClient, **overrides: Any) -> Any:
    """Post a service that is valid but for the overrides; expect 400."""
    data = {"name": "chat", "model_folder": "llama", "runtime_variant": "vllm", **overrides}
    response = client.post(SERVICES, data, format="json")
    assert response.status_code == 400, response.content
    return response


def test_malformed_yaml_in_the_folder_is_refused_naming_the_file_and_line(
    owner: APIClient, nothing_created: None
) -> None:
    make_folder("llama", **{"model-definition.yaml": "models:\n  - name: x\n   model_path: /m\n"})

    response = refused(owner, runtime_variant="custom")

    message = (
        "not valid YAML at line 3, column 4: expected <block end>, but found "
        "'<block mapping start>'"
    )
    assert problems(response) == [("model-definition.yaml", "", message)]
    assert response.json()["detail"] == f"model-definition.yaml: {message}"


def test_a_model_definition_key_out_of_bounds_is_refused_at_its_key_path(
    owner: APIClient, nothing_created: None
) -> None:
    make_folder(
        "llama",
        **{
            "model-definition.yaml": "models:\n  - name: x\n    model_path: /models\n"
            "    service:\n      start_command: [serve]\n      port: 0\n"
            "      health_check: {path: health, interval: -1}\n"
        },
    )

    response = refused(owner, runtime_variant="custom")

    assert problems(response) == [
        (
            "model-definition.yaml",
            "models[0].service.port",
            "must be an integer between 1 and 65535",
        ),
        ("model-definition.yaml", "models[0].service.health_check.path", 'must start with "/"'),
        (
            "model-definition.yaml",
            "models[0].service.health_check.interval",
            "must be a number greater than 0",
        ),
    ]


def test_malformed_toml_in_the_folder_is_refused_naming_the_file_and_key(
    owner: APIClient, nothing_created: None
) -> None:
    make_folder("llama", **{"service-definition.toml": "[vllm.resource_slots]\ncuda.shares = 1\n"})

    response = refused(owner)

    assert problems(response) == [
        (
            "service-definition.toml",
            "vllm.resource_slots.cuda",
            'must be a number; quote a dotted slot name: "cuda.shares" = 1',
        )
    ]


def test_toml_that_does_not_parse_is_refused_with_its_line(
    owner: APIClient, nothing_created: None
) -> None:
    make_folder("llama", **{"service-definition.toml": "[vllm\n"})

    response = refused(owner)

    assert problems(response) == [
        (
            "service-definition.toml",
            "",
            "not valid TOML at line 1, column 6: expected ']' at the end of a table declaration",
        )
    ]


def test_an_unknown_runtime_variant_is_refused_listing_the_known_ones(
    owner: APIClient, nothing_created: None
) -> None:
    make_folder("llama")

    response = refused(owner, runtime_variant="tgi")

    assert problems(response) == [
        ("", "runtime_variant", f"unknown runtime variant 'tgi'; known: {KNOWN}")
    ]


def test_a_pasted_port_out_of_range_is_refused(owner: APIClient, nothing_created: None) -> None:
    make_folder("llama")

    response = refused(owner, runtime_variant="custom", command="vllm serve /models --port 65536")

    assert problems(response) == [
        ("", "command", "--port must be a port number between 1 and 65535, not '65536'")
    ]


def test_a_duplicate_name_is_refused(owner: APIClient) -> None:
    make_service("chat")
    before = (Service.objects.count(), Revision.objects.count())

    response = refused(owner, name="chat")

    assert problems(response) == [("", "name", "a service named 'chat' exists")]
    assert (Service.objects.count(), Revision.objects.count()) == before


def test_a_name_that_is_an_ordinary_pools_slug_is_refused(
    owner: APIClient, nothing_created: None
) -> None:
    make_folder("llama")
    make_pool("chat")

    response = refused(owner, name="chat")

    assert problems(response) == [
        (
            "",
            "name",
            "the pool 'chat' has this slug; a service's pool takes the service's name, so choose "
            "another",
        )
    ]


@pytest.mark.parametrize(
    ("replicas", "message"),
    [
        (65, "must be between 0 and 64, not 65"),
        (-1, "must be between 0 and 64, not -1"),
        ("many", "A valid integer is required."),
    ],
)
def test_replicas_out_of_range_are_refused(
    owner: APIClient, nothing_created: None, replicas: object, message: str
) -> None:
    make_folder("llama")

    response = refused(owner, desired_replicas=replicas)

    assert problems(response) == [("", "desired_replicas", message)]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("my chat", "may hold only letters, digits, '-' and '_' (it is part of the URL)"),
        ("chat.v2", "may hold only letters, digits, '-' and '_' (it is part of the URL)"),
        ("new", "'new' is the launcher's address (/serving/services/new/); choose another"),
        ("x" * 65, "has at most 64 characters"),
        ("", "This field may not be blank."),
    ],
)
def test_a_name_that_is_not_a_short_slug_is_refused(
    owner: APIClient, nothing_created: None, name: str, message: str
) -> None:
    make_folder("llama")

    response = refused(owner, name=name)

    assert problems(response) == [("", "name", message)]


def test_every_problem_is_reported_at_once(owner: APIClient, nothing_created: None) -> None:
    response = refused(
        owner,
        model_folder="nope",
        resource_group="gpu-farm",
        preset="huge",
        desired_replicas=100,
        resource_slots={"cpu": -1, "mem": "lots"},
        environ={"VLLM_TP_SIZE": "two"},
    )

    assert problems(response) == [
        ("", "desired_replicas", "must be between 0 and 64, not 100"),
        ("", "model_folder", "no model folder named 'nope'"),
        ("", "resource_group", "no resource group named 'gpu-farm'"),
        ("", "preset", "no resource preset named 'huge'"),
        ("", "resource_slots.cpu", "must be a number, 0 or more"),
        ("", "resource_slots.mem", 'must be a size like "8gb" or "512m"'),
    ]


def test_a_variable_the_variant_refuses_is_named(owner: APIClient, nothing_created: None) -> None:
    make_folder("llama")

    response = refused(owner, environ={"VLLM_TP_SIZE": "two", "ok": "1"})

    assert problems(response) == [
        ("", "environ.VLLM_TP_SIZE", "must be a positive integer, not 'two'")
    ]


def test_malformed_fields_are_refused_at_their_paths(
    owner: APIClient, nothing_created: None
) -> None:
    response = owner.post(
        SERVICES,
        {"name": "chat", "environ": {"A": ["x"]}, "open_to_public": "perhaps"},
        format="json",
    )

    assert response.status_code == 400
    assert problems(response) == [
        ("", "model_folder", "This field is required."),
        ("", "runtime_variant", "This field is required."),
        ("", "environ.A", "Not a valid string."),
        ("", "open_to_public", "Must be a valid boolean."),
    ]


def test_a_failure_while_writing_leaves_no_service(
    owner: APIClient, nothing_created: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_folder("llama")

    def broken(*args: Any, **kwargs: Any) -> Revision:
        raise RuntimeError("disk full")

    monkeypatch.setattr(services, "_new_revision", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        services.create_service(name="chat", model_folder="llama", runtime_variant="vllm")


def test_a_teammate_cannot_create_and_an_outsider_cannot_read(
    teammate: APIClient, outsider: APIClient, nothing_created: None
) -> None:
    make_folder("llama")
    data = {"name": "chat", "model_folder": "llama", "runtime_variant": "vllm"}

    assert teammate.post(SERVICES, data, format="json").status_code == 403
    assert outsider.get(SERVICES).status_code == 401


# Reading


def test_the_list_filters_by_lifecycle(teammate: APIClient) -> None:
    make_service("live")
    make_service("going")
    gone = make_service("gone")
    services.delete_service(Service.objects.get(name="going"))
    Service.objects.filter(pk=gone.pk).update(lifecycle=ServiceLifecycle.DESTROYED)

    every = teammate.get(SERVICES).json()["results"]
    active = teammate.get(SERVICES, {"lifecycle": "active"}).json()["results"]
    destroyed = teammate.get(SERVICES, {"lifecycle": "destroyed"}).json()["results"]
    wrong = teammate.get(SERVICES, {"lifecycle": "sleeping"})

    assert [s["name"] for s in every] == ["going", "gone", "live"]
    assert [(s["name"], s["lifecycle"]) for s in active] == [
        ("going", "destroying"),
        ("live", "active"),
    ]
    assert [(s["name"], s["status"]) for s in destroyed] == [("gone", "Destroyed")]
    assert wrong.status_code == 400
    assert problems(wrong) == [("", "lifecycle", "must be active or destroyed")]


def test_client_tokens_cannot_read_the_admin_api_and_an_outsider_sees_no_service() -> None:
    make_service("mine")
    _, service_secret = ApiToken.issue("app", services=["mine"])
    _, pool_secret = ApiToken.issue("client", pools=["chat"])
    outsider = make_user("stranger")

    as_service = APIClient(HTTP_AUTHORIZATION=f"Bearer {service_secret}").get(SERVICES)
    as_pool = APIClient(HTTP_AUTHORIZATION=f"Bearer {pool_secret}").get(SERVICES)
    as_outsider = signed_in(outsider)

    assert (as_service.status_code, as_pool.status_code) == (403, 403)
    assert as_outsider.get(SERVICES).json()["results"] == []
    assert as_outsider.get(f"{SERVICES}mine/").status_code == 404


def test_the_detail_counts_ready_replicas_and_shows_routes_with_their_errors(
    teammate: APIClient,
) -> None:
    service = make_service("chat", desired_replicas=3)
    revision = service.latest_revision
    node = make_node("gpu-a")
    Route.objects.create(
        service=service, revision=revision, node=node, port=41001, state=RouteState.HEALTHY
    )
    failed = Route.objects.create(
        service=service,
        revision=revision,
        node=node,
        state=RouteState.FAILED_TO_START,
        errors=[{"at": "2026-01-01T00:00:00Z", "message": "exited", "exit_code": 1}],
    )
    Route.objects.create(service=service, revision=revision, state=RouteState.TERMINATED)

    body = teammate.get(f"{SERVICES}chat/").json()

    assert (body["status"], body["ready_replicas"]) == ("1 of 3 replicas ready", 1)
    assert [(r["state"], r["node"], r["port"], r["revision"]) for r in body["routes"]] == [
        ("healthy", "gpu-a", 41001, 1),
        ("failed_to_start", "gpu-a", None, 1),
    ]
    assert body["routes"][1]["id"] == failed.pk
    assert body["routes"][1]["errors"] == [
        {"at": "2026-01-01T00:00:00Z", "message": "exited", "exit_code": 1}
    ]


def test_latest_and_running_revisions_are_side_by_side_while_they_differ(
    teammate: APIClient,
) -> None:
    service = make_service("chat")
    first = service.latest_revision
    Service.objects.filter(pk=service.pk).update(running_revision=first)
    services.update_service(service, environ={"VLLM_TP_SIZE": "4"})

    body = teammate.get(f"{SERVICES}chat/").json()

    assert body["updating"] is True
    assert body["latest_revision"]["number"] == 2
    assert body["running_revision"]["number"] == 1
    assert "--tensor-parallel-size" in body["latest_revision"]["spec"]["argv"]
    assert "--tensor-parallel-size" not in body["running_revision"]["spec"]["argv"]


def test_an_unknown_service_is_404(teammate: APIClient) -> None:
    assert teammate.get(f"{SERVICES}nope/").status_code == 404


# Changing


def test_changing_replicas_or_access_makes_no_revision(owner: APIClient) -> None:
    make_service("chat")
    version = ConfigVersion.current()

    scaled = owner.patch(f"{SERVICES}chat/", {"desired_replicas": 4}, format="json")
    opened = owner.patch(f"{SERVICES}chat/", {"open_to_public": True}, format="json")

    assert scaled.status_code == 200
    assert (scaled.json()["desired_replicas"], scaled.json()["status"]) == (
        4,
        "0 of 4 replicas ready",
    )
    assert opened.json()["open_to_public"] is True
    assert Revision.objects.count() == 1
    # Both reach the gateway: access decides who may call, the replica count is in its answer
    # when no replica is ready ("0 of 4 ready").
    assert ConfigVersion.current() == version + 2


def test_changing_a_launch_setting_makes_a_new_immutable_revision(owner: APIClient) -> None:
    service = make_service("chat")
    first_spec = service.latest_revision.spec

    response = owner.patch(
        f"{SERVICES}chat/", {"environ": {"VLLM_TP_SIZE": "2"}, "desired_replicas": 2}, format="json"
    )

    assert response.status_code == 200
    body = response.json()
    assert (body["latest_revision"]["number"], body["desired_replicas"]) == (2, 2)
    assert body["latest_revision"]["environ"] == {"VLLM_TP_SIZE": "2"}
    assert body["latest_revision"]["created_by"] == "owner"
    assert [r["number"] for r in body["revisions"]] == [1, 2]
    assert Revision.objects.get(service=service, number=1).spec == first_spec


def test_the_same_settings_again_make_no_revision(owner: APIClient) -> None:
    make_service("chat", environ={"VLLM_TP_SIZE": "2"})

    response = owner.patch(
        f"{SERVICES}chat/",
        {
            "runtime_variant": "vllm",
            "environ": {"VLLM_TP_SIZE": "2"},
            "mount_destination": "/models",
        },
        format="json",
    )

    assert response.json()["latest_revision"]["number"] == 1
    assert Revision.objects.count() == 1


def test_a_new_preset_replaces_the_slots(owner: APIClient) -> None:
    make_service("chat", preset="cpu-small", resource_slots={"cpu": 8})

    response = owner.patch(f"{SERVICES}chat/", {"preset": "cpu-large"}, format="json")

    assert response.json()["latest_revision"]["resource_slots"] == {
        "cpu": 4.0,
        "mem": 8 * GIB,
        "cuda.shares": 0.0,
    }


def test_switching_to_custom_with_a_command_resolves_it(owner: APIClient) -> None:
    make_service("chat")

    response = owner.patch(
        f"{SERVICES}chat/",
        {"runtime_variant": "custom", "command": "llama-server -m /models/x.gguf --port ${PORT}"},
        format="json",
    )

    latest = response.json()["latest_revision"]
    assert (latest["runtime_variant"], latest["spec"]["argv"][0], latest["spec"]["port"]) == (
        "custom",
        "llama-server",
        None,
    )


def test_giving_a_command_switches_a_custom_service_away_from_its_model_definition(
    owner: APIClient,
) -> None:
    make_folder(
        "echo", **{"model-definition.yaml": MODEL_DEFINITION, "defs.yaml": MODEL_DEFINITION}
    )
    services.create_service(
        name="echo",
        model_folder="echo",
        runtime_variant="custom",
        model_definition_path="defs.yaml",
    )

    response = owner.patch(f"{SERVICES}echo/", {"command": "./serve --port ${PORT}"}, format="json")

    latest = response.json()["latest_revision"]
    assert (latest["command"], latest["model_definition_path"], latest["spec"]["argv"]) == (
        "./serve --port ${PORT}",
        "",
        ["./serve", "--port", "${PORT}"],
    )


def test_a_refused_change_changes_nothing(owner: APIClient) -> None:
    service = make_service("chat")

    response = owner.patch(
        f"{SERVICES}chat/",
        {"desired_replicas": 3, "runtime_variant": "custom", "command": "serve --port 0"},
        format="json",
    )

    assert response.status_code == 400
    assert problems(response) == [
        ("", "command", "--port must be a port number between 1 and 65535, not '0'")
    ]
    service.refresh_from_db()
    assert (service.desired_replicas, Revision.objects.count()) == (1, 1)


def test_a_service_being_destroyed_cannot_change(owner: APIClient) -> None:
    services.delete_service(make_service("chat"))

    response = owner.patch(f"{SERVICES}chat/", {"desired_replicas": 3}, format="json")

    assert response.status_code == 409
    assert problems(response) == [
        ("", "", "the service 'chat' is destroying; it cannot change any more")
    ]


def test_a_teammate_cannot_change_a_service(teammate: APIClient) -> None:
    make_service("chat")

    response = teammate.patch(f"{SERVICES}chat/", {"desired_replicas": 3}, format="json")

    assert response.status_code == 403
    assert Service.objects.get().desired_replicas == 1


# Deleting


def test_deleting_starts_destroying_and_tells_the_gateway(owner: APIClient) -> None:
    make_service("chat")
    version = ConfigVersion.current()

    response = owner.delete(f"{SERVICES}chat/")
    again = owner.delete(f"{SERVICES}chat/")

    assert response.status_code == 202
    assert response.json()["lifecycle"] == "destroying"
    assert again.status_code == 202
    assert ConfigVersion.current() == version + 1
    assert Service.objects.get().lifecycle == ServiceLifecycle.DESTROYING


def test_a_destroyed_service_cannot_be_deleted_again(owner: APIClient) -> None:
    service = make_service("chat")
    Service.objects.filter(pk=service.pk).update(lifecycle=ServiceLifecycle.DESTROYED)

    response = owner.delete(f"{SERVICES}chat/")

    assert response.status_code == 409
    assert problems(response) == [("", "", "the service 'chat' is destroyed")]


# Routes


def test_clearing_a_routes_errors_lets_it_retry_now(owner: APIClient) -> None:
    service = make_service("chat")
    route = Route.objects.create(
        service=service,
        revision=service.latest_revision,
        state=RouteState.FAILED_TO_START,
        errors=[{"at": "2026-01-01T00:00:00Z", "message": "exited"}],
        restart_count=3,
        not_before=timezone.now() + timedelta(minutes=1),
    )

    response = owner.post(f"{SERVICES}chat/routes/{route.pk}/clear-errors/")

    assert response.status_code == 200
    assert (response.json()["errors"], response.json()["restart_count"]) == ([], 0)
    route.refresh_from_db()
    assert route.errors == []
    assert route.not_before is not None and route.not_before <= timezone.now()


def test_clearing_errors_of_another_services_route_is_404(owner: APIClient) -> None:
    make_service("chat")
    other = make_service("other")
    route = Route.objects.create(service=other, revision=other.latest_revision)

    response = owner.post(f"{SERVICES}chat/routes/{route.pk}/clear-errors/")

    assert response.status_code == 404


# Resource groups and presets


def test_the_default_group_and_presets_exist_and_an_owner_adds_more(
    owner: APIClient, teammate: APIClient
) -> None:
    make_node("gpu-a")

    groups = teammate.get("/api/v1/resource-groups/").json()["results"]
    presets = teammate.get("/api/v1/resource-presets/").json()["results"]
    created = owner.post(
        "/api/v1/resource-groups/", {"name": "gpu", "nodes": ["gpu-a"]}, format="json"
    )
    preset = owner.post(
        "/api/v1/resource-presets/",
        {"name": "tiny", "cpu": 0.5, "memory_bytes": 1 << 28},
        format="json",
    )
    refused_by_role = teammate.post("/api/v1/resource-groups/", {"name": "x"}, format="json")

    assert [(g["name"], g["all_nodes"]) for g in groups] == [("default", True)]
    assert [p["name"] for p in presets] == ["cpu-large", "cpu-medium", "cpu-small", "gpu-1"]
    assert created.status_code == 201
    assert teammate.get("/api/v1/resource-groups/gpu/").json()["nodes"] == ["gpu-a"]
    assert preset.status_code == 201
    assert ResourcePreset.objects.get(name="tiny").slots() == {
        "cpu": 0.5,
        "mem": 1 << 28,
        "cuda.shares": 0.0,
    }
    assert refused_by_role.status_code == 403
    assert ResourceGroup.objects.count() == 2


def test_a_service_runs_in_a_group_named_at_creation(owner: APIClient) -> None:
    make_folder("llama")
    ResourceGroup.objects.create(name="gpu")

    response = owner.post(
        SERVICES,
        {
            "name": "chat",
            "model_folder": "llama",
            "runtime_variant": "vllm",
            "resource_group": "gpu",
        },
        format="json",
    )

    assert response.json()["latest_revision"]["resource_group"] == "gpu"


# Definitions


def test_the_model_definition_schema_is_public(outsider: APIClient) -> None:
    response = outsider.get("/api/v1/definitions/model-definition.schema.json")

    assert response.status_code == 200
    assert response.json() == MODEL_DEFINITION_SCHEMA


@pytest.mark.parametrize(
    ("kind", "text", "answer"),
    [
        (
            "model-definition",
            "models:\n  - name: x\n    model_path: /models\n",
            {
                "valid": True,
                "problems": [],
                "result": {"models": [{"name": "x", "model_path": "/models"}]},
            },
        ),
        (
            "model-definition",
            "models:\n  - name: x\n    model_path: /models\n    service:\n      port: 99999\n",
            {
                "valid": False,
                "problems": [
                    {"path": "models[0].service.start_command", "message": "required"},
                    {
                        "path": "models[0].service.port",
                        "message": "must be an integer between 1 and 65535",
                    },
                ],
                "result": None,
            },
        ),
        (
            "service-definition",
            '[vllm.environ]\nA = "1"\n',
            {
                "valid": True,
                "problems": [],
                "result": {"vllm": {"resource_slots": {}, "environ": {"A": "1"}}},
            },
        ),
        (
            "service-definition",
            "[tgi]\n",
            {
                "valid": False,
                "problems": [
                    {"path": "tgi", "message": f"unknown runtime variant; known: {KNOWN}"}
                ],
                "result": None,
            },
        ),
        (
            "command",
            "vllm serve 'unclosed",
            {
                "valid": False,
                "problems": [
                    {"path": "", "message": "unbalanced quote: a quote is opened and never closed"}
                ],
                "result": None,
            },
        ),
    ],
)
def test_a_definition_is_checked_without_storing_anything(
    teammate: APIClient, kind: str, text: str, answer: dict[str, Any]
) -> None:
    response = teammate.post(
        "/api/v1/definitions/validate/", {"kind": kind, "text": text}, format="json"
    )

    assert response.status_code == 200
    assert response.json() == answer


def test_a_valid_command_is_read_into_its_fields(teammate: APIClient) -> None:
    response = teammate.post(
        "/api/v1/definitions/validate/",
        {"kind": "command", "text": "vllm serve /models/m --tp 2 --port 8001"},
        format="json",
    )

    result = response.json()["result"]
    assert response.json()["valid"] is True
    assert (result["runtime"], result["port"], result["tensor_parallel_size"]) == ("vllm", 8001, 2)
    assert result["model_path"] == "/models/m"


def test_an_unknown_kind_of_definition_is_a_bad_request(teammate: APIClient) -> None:
    response = teammate.post(
        "/api/v1/definitions/validate/", {"kind": "dockerfile", "text": ""}, format="json"
    )

    assert response.status_code == 400
    assert response.json() == {
        "kind": ["must be one of: model-definition, service-definition, command"]
    }


def test_an_outsider_cannot_check_definitions(outsider: APIClient) -> None:
    response = outsider.post(
        "/api/v1/definitions/validate/", {"kind": "command", "text": "x"}, format="json"
    )

    assert response.status_code == 401
