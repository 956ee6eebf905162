"""Every /api/v1/ route × every persona answers with the exact status docs/access.md promises.

The routes are read from the URL resolver, so a new route fails `test_every_route_has_its_row`
until its row below says who may call it. Each case runs against a fresh world (one project,
`acme`, holding a pool, a target, history, a model folder, a service with a route and a token;
the fleet: a node, a deployment, a resource group and preset), because writes change it: the
world is built once per module in a transaction that is rolled back at the end, each case runs
in a savepoint inside it (the `db` fixture's) and on its own copy of the world's files.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any

import pytest
from django.conf import LazySettings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import transaction
from django.test import override_settings
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone
from rest_framework.test import APIClient

from deployments.models import NodeState
from nexus.management.commands.nexus_run import seed_first_run
from nexus.models import ApiToken, Project
from pools.models import RoutingRecord, Target
from serving import folders, services
from serving.models import (
    AutoScalingRule,
    ModelFolder,
    ResourceGroup,
    ResourcePreset,
    Route,
    RouteState,
    Trial,
)
from serving.tokens import issue_service_token
from tests.deployments.factories import make_deployment, make_node
from tests.nexus.factories import make_pool, make_target
from tests.support.personas import Cast, Persona, bearer, make_cast

P = Persona
PERSONAS = list(Persona)
API_PREFIX = "api/v1/"
# A node and targets on a port nothing listens on: a call that reaches out fails at once.
NOWHERE = "http://127.0.0.1:9"


def reads(*, detail: bool) -> dict[Persona, int]:
    """A read of a project's objects: its people and the owner's admin tokens; others 404."""
    outsider = 404 if detail else 200
    return {
        P.ANONYMOUS: 401,
        P.CLIENT_TOKEN: 403,
        P.ADMIN_READ_TOKEN: 200,
        P.ADMIN_WRITE_TOKEN: 200,
        P.OWNER: 200,
        P.TEAMMATE: 200,
        P.OUTSIDER: outsider,
        P.STAFF: 200,
    }


def writes(done: int, *, outsider: int = 404, staff: int | None = None) -> dict[Persona, int]:
    """A change to a project's objects: owner, the owner's write token and staff do it (`done`);
    a viewer and a read token are refused; an outsider does not see it."""
    return {
        P.ANONYMOUS: 401,
        P.CLIENT_TOKEN: 403,
        P.ADMIN_READ_TOKEN: 403,
        P.ADMIN_WRITE_TOKEN: done,
        P.OWNER: done,
        P.TEAMMATE: 403,
        P.OUTSIDER: outsider,
        P.STAFF: done if staff is None else staff,
    }


def fleet_reads() -> dict[Persona, int]:
    """The fleet: every signed-in caller and admin token reads it."""
    return reads(detail=False)


def fleet_writes(done: int) -> dict[Persona, int]:
    """A change to the fleet: staff only."""
    return {persona: 403 for persona in PERSONAS} | {P.ANONYMOUS: 401, P.STAFF: done}


def everyone_signed_in(done: int, *, read_token: int) -> dict[Persona, int]:
    """A check that changes nothing: every signed-in caller; a read token only for a GET."""
    return {persona: done for persona in PERSONAS} | {
        P.ANONYMOUS: 401,
        P.CLIENT_TOKEN: 403,
        P.ADMIN_READ_TOKEN: read_token,
    }


RULE = {
    "metric_source": "kernel",
    "metric_name": "cpu_util",
    "condition": "scale_out",
    "max_threshold": 80,
}
# (URL name, method) → (body, expected status per persona). Bodies are valid where a valid body
# lets the permission decide; an invalid one shows the caller got past it (400).
ROUTES: dict[tuple[str, str], tuple[Any, dict[Persona, int]]] = {
    # Tokens: a project's tokens are its members' business.
    ("token-list", "get"): (None, reads(detail=False)),
    ("token-list", "post"): (
        {"name": "ci", "project": "acme", "pools": ["chat"]},
        writes(201, outsider=400),
    ),
    ("token-detail", "get"): (None, reads(detail=True)),
    ("token-revoke", "post"): (None, writes(200)),
    # Projects and members: owners and staff change them; staff create projects.
    ("project-list", "get"): (None, reads(detail=False)),
    ("project-list", "post"): (
        {"name": "new"},
        writes(403, outsider=403, staff=201),
    ),
    ("project-detail", "get"): (None, reads(detail=True)),
    ("project-detail", "patch"): ({"description": "ours"}, writes(200)),
    ("project-detail", "put"): ({"name": "acme", "description": "ours"}, writes(200)),
    ("project-member-list", "get"): (None, reads(detail=True)),
    ("project-member-list", "post"): ({"user": "acme-outsider", "role": "viewer"}, writes(201)),
    ("project-member-detail", "get"): (None, reads(detail=True)),
    ("project-member-detail", "put"): ({"user": "acme-teammate", "role": "member"}, writes(200)),
    ("project-member-detail", "patch"): ({"role": "member"}, writes(200)),
    ("project-member-detail", "delete"): (None, writes(204)),
    # Pools, targets, history.
    ("pool-list", "get"): (None, reads(detail=False)),
    ("pool-list", "post"): (
        {"slug": "new", "name": "New", "project": "acme"},
        writes(201, outsider=400),
    ),
    ("pool-detail", "get"): (None, reads(detail=True)),
    ("pool-detail", "put"): ({"slug": "chat", "name": "Chat 2"}, writes(200)),
    ("pool-detail", "patch"): ({"name": "Chat 2"}, writes(200)),
    ("pool-detail", "delete"): (None, writes(204)),
    ("pool-dry-run", "post"): ({"kind": "chat"}, writes(200)),
    ("pool-drain", "post"): (None, writes(200)),
    ("pool-resume", "post"): (None, writes(200)),
    ("pool-validate", "post"): ({}, writes(200)),
    ("pool-confirm-identity", "post"): (None, writes(201)),
    ("target-list", "get"): (None, reads(detail=False)),
    ("target-list", "post"): (
        {"pool": "chat", "name": "b", "base_url": f"{NOWHERE}/v1", "model_id": "m"},
        writes(201, outsider=400),
    ),
    ("target-detail", "get"): (None, reads(detail=True)),
    ("target-detail", "put"): (
        {"pool": "chat", "name": "a", "base_url": f"{NOWHERE}/v1", "model_id": "m"},
        writes(200),
    ),
    ("target-detail", "patch"): ({"base_url": "http://attacker.example/v1"}, writes(200)),
    ("target-detail", "delete"): (None, writes(204)),
    ("target-drain", "post"): (None, writes(200)),
    ("target-resume", "post"): (None, writes(200)),
    ("history-list", "get"): (None, reads(detail=False)),
    ("history-detail", "get"): (None, reads(detail=True)),
    ("history-replay", "post"): (None, writes(200)),
    ("usage-list", "get"): (None, reads(detail=False)),
    # Model folders and their files.
    ("model-folder-list", "get"): (None, reads(detail=False)),
    ("model-folder-list", "post"): ({"name": "qwen", "project": "acme"}, writes(201, outsider=400)),
    ("model-folder-detail", "get"): (None, reads(detail=True)),
    ("model-folder-detail", "delete"): (None, writes(409)),  # the service uses it
    ("model-folder-files", "get"): (None, reads(detail=True)),
    ("model-folder-files", "post"): ("upload", writes(201)),
    ("model-folder-file", "get"): (None, reads(detail=True)),
    ("model-folder-file", "put"): ("raw", writes(200)),
    ("model-folder-file", "delete"): (None, writes(204)),
    # Services and their tokens.
    ("service-list", "get"): (None, reads(detail=False)),
    ("service-list", "post"): (
        {"name": "svc2", "project": "acme", "model_folder": "llama", "runtime_variant": "vllm"},
        writes(201, outsider=400),
    ),
    ("service-detail", "get"): (None, reads(detail=True)),
    # Validate: a trial of launch settings, started as a service would be, then followed.
    ("service-validate", "post"): (
        {"project": "acme", "model_folder": "llama", "runtime_variant": "vllm"},
        writes(202, outsider=400),
    ),
    ("trial-detail", "get"): (None, reads(detail=True)),
    ("service-detail", "patch"): ({"desired_replicas": 2}, writes(200)),
    ("service-detail", "delete"): (None, writes(202)),
    ("service-route-clear-errors", "post"): (None, writes(200)),
    ("service-token-list", "get"): (None, reads(detail=True)),
    ("service-token-list", "post"): ("service-token", writes(201)),
    ("service-token-detail", "delete"): (None, writes(204)),
    # A service's autoscaling rules and scale events: as the service.
    ("autoscaling-rule-list", "get"): (None, reads(detail=True)),
    ("autoscaling-rule-list", "post"): (RULE, writes(201)),
    ("autoscaling-rule-detail", "get"): (None, reads(detail=True)),
    ("autoscaling-rule-detail", "put"): (RULE, writes(200)),
    ("autoscaling-rule-detail", "patch"): ({"max_threshold": 9}, writes(200)),
    ("autoscaling-rule-detail", "delete"): (None, writes(204)),
    # The preview runs a query and changes nothing: whoever sees the service.
    ("autoscaling-rule-preview", "post"): (
        {"prometheus_preset": "vllm-requests-waiting"},
        reads(detail=True) | {P.ADMIN_READ_TOKEN: 403},
    ),
    ("scale-event-list", "get"): (None, reads(detail=True)),
    ("autoscaling-presets", "get"): (None, fleet_reads()),
    # The fleet.
    ("node-list", "get"): (None, fleet_reads()),
    ("node-list", "post"): ({"name": "gpu-b", "address": NOWHERE}, fleet_writes(400)),
    ("node-detail", "get"): (None, fleet_reads()),
    ("node-detail", "put"): ({"name": "gpu-a", "address": NOWHERE}, fleet_writes(405)),
    ("node-detail", "patch"): ({"labels": {"rack": "1"}}, fleet_writes(200)),
    ("node-detail", "delete"): (None, fleet_writes(409)),  # a route runs on it
    ("node-confirm", "post"): (None, fleet_writes(400)),  # already trusted
    ("node-models", "get"): (None, fleet_reads()),
    ("node-refresh", "post"): (None, fleet_writes(200)),
    ("node-reject", "post"): (None, fleet_writes(200)),
    ("deployment-list", "get"): (None, fleet_reads()),
    ("deployment-list", "post"): ({"name": "d2"}, fleet_writes(400)),
    ("deployment-detail", "get"): (None, fleet_reads()),
    ("deployment-retry", "post"): (None, fleet_writes(200)),
    ("resource-group-list", "get"): (None, fleet_reads()),
    ("resource-group-list", "post"): ({"name": "rg2"}, fleet_writes(201)),
    ("resource-group-detail", "get"): (None, fleet_reads()),
    ("resource-group-detail", "patch"): ({"description": "spare"}, fleet_writes(200)),
    ("resource-group-detail", "put"): ({"name": "rg", "all_nodes": True}, fleet_writes(200)),
    # No revision names "rg": it can go.
    ("resource-group-detail", "delete"): (None, fleet_writes(204)),
    ("resource-preset-list", "get"): (None, fleet_reads()),
    ("resource-preset-list", "post"): ({"name": "large"}, fleet_writes(201)),
    ("resource-preset-detail", "get"): (None, fleet_reads()),
    # Definitions: the schema is public; checking a definition is for the signed in.
    ("model-definition-schema", "get"): (
        None,
        {persona: 200 for persona in PERSONAS} | {P.CLIENT_TOKEN: 403},
    ),
    ("definition-validate", "post"): (
        {"kind": "command", "text": "vllm serve /models/x"},
        everyone_signed_in(200, read_token=403),
    ),
}


def api_routes() -> Iterator[tuple[str, str, URLPattern]]:
    """Yield (URL name, method, pattern) for every /api/v1/ route, format suffixes aside."""

    def walk(patterns: list[Any], prefix: str) -> Iterator[tuple[str, URLPattern]]:
        for entry in patterns:
            if isinstance(entry, URLResolver):
                yield from walk(entry.url_patterns, prefix + str(entry.pattern))
            else:
                yield prefix + str(entry.pattern), entry

    for route, pattern in walk(get_resolver().url_patterns, ""):
        if not route.startswith(API_PREFIX) or "(?P<format>" in route:
            continue
        callback = pattern.callback
        actions = getattr(callback, "actions", None)
        if actions is not None:
            methods = set(actions) - {"head", "options"}
        else:
            view = callback.view_class  # type: ignore[attr-defined]
            methods = {m for m in ("get", "post", "put", "patch", "delete") if hasattr(view, m)}
        for method in sorted(methods):
            yield str(pattern.name), method, pattern


def test_every_route_has_its_row() -> None:
    found = {(name, method) for name, method, _ in api_routes()}

    assert found == set(ROUTES)


@dataclass
class World:
    """One project's objects and the fleet, with the path arguments of each route."""

    cast: Cast
    kwargs: dict[str, dict[str, str]]
    # The signed-in personas' session cookies: signed in once, with the world.
    cookies: dict[Persona, SimpleCookie] = field(default_factory=dict)

    def client(self, persona: Persona) -> APIClient:
        """Return an API client that speaks as the persona."""
        if persona not in self.cookies:
            return self.cast.client(persona)
        client = APIClient()
        client.cookies = SimpleCookie(self.cookies[persona])
        return client


@pytest.fixture(scope="module")
def built_world(
    django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[World, Path]]:
    """Build the world once, in a transaction rolled back after the module's last case."""
    data_dir = tmp_path_factory.mktemp("world") / "data"
    data_dir.mkdir()
    with django_db_blocker.unblock(), transaction.atomic(), override_settings(DATA_DIR=data_dir):
        yield build_world(), data_dir
        transaction.set_rollback(True)


@pytest.fixture
def world(
    built_world: tuple[World, Path], db: None, settings: LazySettings, tmp_path: Path
) -> World:
    """The built world as it was, whatever earlier cases changed: its rows in a savepoint the
    `db` fixture rolls back, its files copied afresh."""
    world, data_dir = built_world
    settings.DATA_DIR = tmp_path / "data"
    shutil.copytree(data_dir, settings.DATA_DIR)
    return world


def build_world() -> World:
    """Create the project's objects, the fleet and the cast; return them with the route
    arguments."""
    project = Project.objects.create(name="acme")
    pool = make_pool("chat", project=project)
    target = make_target(pool, "a", base_url=f"{NOWHERE}/v1", model_id="m")
    record = RoutingRecord.objects.create(
        request_id=f"{1:032x}", pool=pool, kind="chat", outcome="ok", status_code=200
    )
    folder = folders.create_folder(ModelFolder(name="llama", project="acme"))
    folders.write_file(folder, "config.json", [b"{}"])
    service = services.create_service(
        name="svc", project="acme", model_folder="llama", runtime_variant="vllm"
    )
    node = make_node("gpu-a", address=NOWHERE)
    route = Route.objects.create(
        service=service,
        revision=service.latest_revision,
        node=node,
        port=41001,
        state=RouteState.UNHEALTHY,
    )
    rule = AutoScalingRule.objects.create(service=service, **RULE)
    service_token, _ = issue_service_token(
        service, name="app", expires_at=timezone.now() + timedelta(days=1)
    )
    deployment = make_deployment("demo", {node: NodeState.FAILED})
    ResourceGroup.objects.create(name="rg")
    ResourcePreset.objects.create(name="small")
    trial = Trial.objects.create(project="acme", runtime_variant="vllm")
    cast = make_cast(project, client_pools=["chat"])
    token = ApiToken.objects.get(project=project, name="app", services=[])
    member = {"project_name": "acme"}
    folder_kwargs = {"name": "llama"}
    return World(
        cast,
        cookies={
            persona: cast.client(persona).cookies
            for persona in (P.OWNER, P.TEAMMATE, P.OUTSIDER, P.STAFF)
        },
        kwargs={
            "token": {"pk": str(token.pk)},
            "project": {"name": "acme"},
            "project-member-list": member,
            "project-member": member | {"username": cast.teammate.username},
            "pool": {"slug": "chat"},
            "target": {"pk": str(target.pk)},
            "history": {"request_id": record.request_id},
            "model-folder": folder_kwargs,
            "model-folder-files": folder_kwargs,
            "model-folder-file": folder_kwargs | {"path": "config.json"},
            "service": {"name": "svc", "route_id": str(route.pk)},
            "service-token": {"service_name": "svc", "pk": str(service_token.pk)},
            "autoscaling-rule": {"service_name": "svc", "pk": str(rule.pk)},
            "scale-event": {"service_name": "svc"},
            "node": {"name": "gpu-a"},
            "deployment": {"pk": str(deployment.pk)},
            "resource-group": {"name": "rg"},
            "resource-preset": {"name": "small"},
            "trial": {"pk": str(trial.pk)},
        },
    )


def path_of(world: World, name: str, pattern: URLPattern) -> str:
    """Return the route's path, its arguments taken from the world's objects."""
    wanted = set(pattern.pattern.regex.groupindex)
    if not wanted:
        return reverse(name)
    basename = next(
        key for key in sorted(world.kwargs, key=len, reverse=True) if name.startswith(key)
    )
    given = world.kwargs[basename]
    if name == "project-member-list":
        given = world.kwargs[name]
    return reverse(name, kwargs={key: given[key] for key in wanted})


def call(client: APIClient, method: str, path: str, body: Any) -> int:
    """Send the request with its body and return the status."""
    if body == "upload":
        response = client.post(path, {"file": SimpleUploadedFile("notes.txt", b"hi")})
    elif body == "raw":
        response = client.put(path, b"{}", content_type="application/octet-stream")
    elif body == "service-token":
        tomorrow = (timezone.now() + timedelta(days=1)).isoformat()
        response = client.post(path, {"name": "b", "expires_at": tomorrow}, format="json")
    else:
        response = getattr(client, method)(path, body, format="json")
    return response.status_code


# Routes whose allowed call reaches a node's agent or a target (a closed loopback port here):
# `live` tests.
REACHES_A_NODE = {("node-refresh", "post"), ("pool-validate", "post")}
CASES = [
    pytest.param(
        name,
        method,
        persona,
        id=f"{name}-{method}-{persona}",
        marks=[pytest.mark.live] if (name, method) in REACHES_A_NODE else [],
    )
    for (name, method) in sorted(ROUTES)
    for persona in PERSONAS
]


@pytest.mark.parametrize(("name", "method", "persona"), CASES)
def test_the_route_answers_the_persona_as_documented(
    world: World, name: str, method: str, persona: Persona
) -> None:
    pattern = next(p for n, m, p in api_routes() if (n, m) == (name, method))
    body, expected = ROUTES[(name, method)]

    status = call(world.client(persona), method, path_of(world, name, pattern), body)

    assert status == expected[persona]


def test_the_demo_client_token_cannot_redirect_a_target(
    db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given what `make run` seeds on a first run: the demo pool and a client token for it,
    monkeypatch.setenv("NEXUS_DEMO_REAL_MODEL", "false")
    seeded = seed_first_run([9, 9, 9])
    target = Target.objects.filter(pool__slug="demo").first()
    assert target is not None and seeded.demo_token

    # when the token's holder tries to point a target elsewhere,
    response = bearer(seeded.demo_token).patch(
        f"/api/v1/targets/{target.pk}/", {"base_url": "http://attacker.example/v1"}
    )

    # then it is refused, saying why, and the target is unchanged.
    assert response.status_code == 403
    assert "A client token calls inference only" in response.json()["detail"]
    target.refresh_from_db()
    assert target.base_url != "http://attacker.example/v1"
