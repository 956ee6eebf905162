"""Model folders follow their replicas (issue 19, done-when 4): two real agents whose allowed
directories differ. node-shared sees the controller's models directory (shared storage);
node-far does not. A replica placed on node-far gets the folder copied from the controller
(through a signed URL, checked file by file), becomes ready and serves the copy; the second
replica there copies nothing; a replica on node-shared uses the folder where it is.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.test import APIClient

from nexus.models import ApiToken
from nodes.models import Node
from pools.models import Pool
from serving import folders
from serving.models import (
    ModelFolder,
    ResourceGroup,
    Route,
    RouteState,
    Service,
    models_root,
)
from tests.nexus.factories import make_user
from tests.nodes.fleet import trusted_node
from tests.support.agent import RunningAgent, running_agent
from tests.support.http import LOOPBACK
from tests.support.live import LiveServer, running_nexus
from tests.support.waiting import wait_until
from tests.support.worker import RunningWorker, running_worker

SHARED, FAR = "node-shared", "node-far"
FAR_SERVICE, SHARED_SERVICE = "far-files", "shared-files"
TICK_S = 0.5
HELLO = "hello from the controller's folder\n"
WEIGHTS_BYTES = 24 * 1024 * 1024
DEFINITION = """\
models:
  - name: "files"
    model_path: "/models"
    service:
      start_command: ["python", "-m", "http.server", "${PORT}", "--bind", "127.0.0.1",
                      "--directory", "/models"]
      port: 8000
      health_check:
        path: /hello.txt
        interval: 0.5
        max_retries: 2
        max_wait_time: 2.0
        initial_delay: 0
"""


@dataclass
class Fleet:
    nexus: LiveServer
    worker: RunningWorker
    agents: dict[str, RunningAgent]
    owner: APIClient
    folder: ModelFolder
    tokens: dict[str, str]

    def routes(self, service: str) -> list[Route]:
        found = Route.objects.filter(service__name=service).select_related("node")
        return list(found.order_by("pk"))

    def healthy(self, service: str, count: int) -> bool:
        return (
            len([r for r in self.routes(service) if r.state == RouteState.HEALTHY and r.target_id])
            == count
        )

    def why(self, service: str) -> str:
        lines = [
            f"  route {r.pk} {r.state} on {r.node and r.node.name} {r.status_message!r} "
            f"{r.placement.get('folders')} {r.errors[-1:]}"
            for r in self.routes(service)
        ]
        return "\n".join(lines) + f"\n--- worker\n{self.worker.log()[-3000:]}"

    def serve(self, service: str, path: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.tokens[service]}"}
        return LOOPBACK.get(f"{self.nexus.url}/serve/{service}{path}", headers=headers, timeout=10)


def agent_environment() -> dict[str, str]:
    """Let `python` in the start command be this checkout's interpreter."""
    return {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


@pytest.fixture(scope="module")
def fleet(committed_db, django_db_blocker, tmp_path_factory) -> Iterator[Fleet]:
    tmp_path = tmp_path_factory.mktemp("folders-follow")
    suffix = uuid.uuid4().hex[:8]
    folder_name = f"files-{suffix}"
    with ExitStack() as stack:
        with django_db_blocker.unblock():
            user = make_user(f"owner-{suffix}", staff=True)
            owner = APIClient()
            owner.force_login(user)
        stack.callback(_remove_rows, django_db_blocker, user.pk, folder_name)
        models_root().mkdir(parents=True, exist_ok=True)
        allowed = {SHARED: ["--allow-dir", str(models_root())], FAR: []}
        agents = {
            name: stack.enter_context(
                running_agent(tmp_path, name=name, args=args, env=agent_environment())
            )
            for name, args in allowed.items()
        }
        nexus = stack.enter_context(running_nexus(tmp_path, NEXUS_LEDGER="memory"))
        worker = stack.enter_context(
            running_worker(
                tmp_path,
                beat=True,
                NEXUS_SERVING_TICK_S=str(TICK_S),
                NEXUS_CONTROLLER_URL=nexus.url,
            )
        )
        with django_db_blocker.unblock():
            nodes = {name: trusted_node(name, agent) for name, agent in agents.items()}
            folder = folders.create_folder(ModelFolder(name=folder_name))
            folders.write_file(folder, "model-definition.yaml", [DEFINITION.encode()])
            folders.write_file(folder, "hello.txt", [HELLO.encode()])
            folders.write_file(folder, "weights/model.bin", [os.urandom(WEIGHTS_BYTES)])
            world = Fleet(nexus, worker, agents, owner, folder, tokens={})
            for service, node, replicas in ((FAR_SERVICE, FAR, 2), (SHARED_SERVICE, SHARED, 1)):
                group = ResourceGroup.objects.create(name=f"{service}-{suffix}")
                group.nodes.add(nodes[node])
                declared = owner.post(
                    "/api/v1/services/",
                    {
                        "name": service,
                        "model_folder": folder_name,
                        "runtime_variant": "custom",
                        "desired_replicas": replicas,
                        "resource_group": group.name,
                    },
                    format="json",
                )
                assert declared.status_code == 201, declared.content
                expires_at = (timezone.now() + timedelta(hours=1)).isoformat()
                token = owner.post(
                    f"/api/v1/services/{service}/tokens/",
                    {"name": "client", "expires_at": expires_at},
                    format="json",
                )
                world.tokens[service] = token.json()["token"]
            for service, count in ((FAR_SERVICE, 2), (SHARED_SERVICE, 1)):
                wait_until(
                    lambda s=service, c=count: world.healthy(s, c),
                    timeout_s=60,
                    what=lambda s=service: world.why(s),
                )
        yield world


def _remove_rows(blocker: Any, user_id: int, folder_name: str) -> None:
    with blocker.unblock():
        Service.objects.filter(name__in=[FAR_SERVICE, SHARED_SERVICE]).delete()
        Pool.objects.filter(slug__in=[FAR_SERVICE, SHARED_SERVICE]).delete()
        ResourceGroup.objects.filter(name__startswith="far-files-").delete()
        ResourceGroup.objects.filter(name__startswith="shared-files-").delete()
        Node.objects.filter(name__in=[SHARED, FAR]).delete()
        for folder in ModelFolder.objects.filter(name=folder_name):
            folders.delete_folder(folder)
        ApiToken.objects.filter(created_by_id=user_id).delete()
        User.objects.filter(pk=user_id).delete()


@pytest.fixture(autouse=True)
def database(django_db_blocker: Any) -> Iterator[None]:
    with django_db_blocker.unblock():
        yield


def test_a_node_without_the_folder_copies_it_once_and_serves_the_copy(fleet: Fleet) -> None:
    far = fleet.agents[FAR]
    first, second = [r for r in fleet.routes(FAR_SERVICE) if r.state == RouteState.HEALTHY]
    copies = [route.placement["folders"][FAR] for route in (first, second)]
    total = sum(f.size for f in folders.list_files(fleet.folder).files)

    # The folder was copied to node-far once, with its progress kept on the route ...
    by_source = sorted(copies, key=lambda copy: copy["source"])
    assert [copy["source"] for copy in by_source] == ["cache", "download"]
    cached, downloaded = by_source
    assert downloaded["copied_bytes"] == total
    assert (downloaded["bytes_done"], downloaded["bytes_total"]) == (total, total)
    assert downloaded["percent"] == 100.0
    # ... and the second replica there copied nothing.
    assert cached["copied_bytes"] == 0
    assert cached["path"] == downloaded["path"]
    copy = Path(downloaded["path"])
    assert copy.is_relative_to(far.data_dir.resolve())
    assert (copy / "hello.txt").read_text() == HELLO
    assert (copy / "weights" / "model.bin").stat().st_size == WEIGHTS_BYTES
    # The replicas run in the copy, the controller's path never seen on that node.
    for route in (first, second):
        record = LOOPBACK.get(
            f"{far.url}/agent/v1/processes/{route.process_id}", headers=far.headers(), timeout=5
        ).json()
        assert record["argv"][-1] == str(copy)
    # And they serve it.
    answer = fleet.serve(FAR_SERVICE, "/hello.txt")
    assert (answer.status_code, answer.text) == (200, HELLO)


def test_a_node_that_shares_the_folder_copies_nothing(fleet: Fleet) -> None:
    [route] = [r for r in fleet.routes(SHARED_SERVICE) if r.state == RouteState.HEALTHY]
    copy = route.placement["folders"][SHARED]

    assert (copy["source"], copy["copied_bytes"]) == ("shared", 0)
    assert copy["path"] == str(fleet.folder.path.resolve())
    assert fleet.serve(SHARED_SERVICE, "/hello.txt").text == HELLO


def test_the_folder_link_is_refused_without_a_valid_token(fleet: Fleet) -> None:
    forged = LOOPBACK.get(f"{fleet.nexus.url}/serving/folder-sync/not-a-token/hello.txt", timeout=5)

    assert forged.status_code == 403
    assert forged.json() == {"detail": "The folder link is invalid or expired."}
