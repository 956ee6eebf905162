"""Helpers for replica tests: model folders on disk, services made with the ORM, agents that may
run commands in the models directory, and serving ticks driven by hand."""

from __future__ import annotations

import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from serving import probes, reconciler
from serving.models import (
    ModelFolder,
    ResourceGroup,
    Revision,
    Route,
    RouteState,
    Service,
    models_root,
)
from tests.support.agent import RunningAgent, running_agent

REPO_ROOT = Path(__file__).resolve().parents[2]
HELLO = "hello from the model folder\n"
# A static file server over the mount destination: it serves the folder only if /models was
# mapped to the folder's real path.
FILE_SERVER = [sys.executable, "-m", "http.server", "${PORT}", "--bind", "127.0.0.1"]
FILE_SERVER += ["--directory", "/models"]
CRASHING = [
    sys.executable,
    "-c",
    "import sys; print('loading weights'); print('CUDA out of memory', file=sys.stderr); "
    "sys.exit(1)",
]
# Probed every 0.2 s from the start; UNHEALTHY after 3 failures in a row.
FAST_CHECK = {
    "path": "/hello.txt",
    "interval": 0.2,
    "max_retries": 2,
    "max_wait_time": 2.0,
    "expected_status_code": 200,
    "initial_delay": 0.0,
}


@contextmanager
def model_folder(name: str = "") -> Iterator[ModelFolder]:
    """Make a model folder holding hello.txt; remove its directory afterwards."""
    folder = ModelFolder.objects.create(name=name or f"tiny-{uuid.uuid4().hex[:8]}")
    folder.path.mkdir(parents=True)
    (folder.path / "hello.txt").write_text(HELLO)
    try:
        yield folder
    finally:
        shutil.rmtree(folder.path, ignore_errors=True)


@contextmanager
def models_agent(tmp_path: Path, name: str = "agent") -> Iterator[RunningAgent]:
    """Run an agent that may run commands in (and read) the models directory."""
    models_root().mkdir(parents=True, exist_ok=True)
    with running_agent(tmp_path, name=name, args=["--allow-dir", str(models_root())]) as agent:
        yield agent


def spec(argv: list[str] | None = None, **changes: Any) -> dict[str, Any]:
    """Return a revision spec serving the folder over HTTP, with the fast health check."""
    return {
        "argv": argv or FILE_SERVER,
        "env": {"PYTHONUNBUFFERED": "1"},
        "port": None,
        "model_name": "tiny",
        "health_check": FAST_CHECK,
        "pre_start_actions": [],
        **changes,
    }


def add_revision(
    service: Service, folder: ModelFolder, *, slots: dict[str, Any] | None = None, **changes: Any
) -> Revision:
    """Make the service's next revision its latest, as an update does."""
    number = (service.revisions.order_by("-number").values_list("number", flat=True).first()) or 0
    revision = Revision.objects.create(
        service=service,
        number=number + 1,
        model_folder=folder,
        runtime_variant="custom",
        resource_group=ResourceGroup.objects.get(name="default"),
        resource_slots=slots or {},
        spec=spec(**changes),
    )
    Service.objects.filter(pk=service.pk).update(latest_revision=revision)
    service.refresh_from_db()
    return revision


def make_service(
    folder: ModelFolder, name: str = "chat", replicas: int = 1, **changes: Any
) -> Service:
    """Make a service with its first revision."""
    service = Service.objects.create(name=name, desired_replicas=replicas)
    add_revision(service, folder, **changes)
    return service


def tick(service: Service) -> None:
    """Run one serving tick for the service: reconcile, then the due health probes."""
    assert reconciler.reconcile(service) != "busy"
    probes.probe_due_routes()
    service.refresh_from_db()


def run_until(
    service: Service,
    condition: Callable[[], Any],
    *,
    timeout_s: float = 30.0,
    every: Callable[[], None] | None = None,
) -> Any:
    """Run ticks until the condition holds; `every` is checked after each tick."""
    deadline = time.monotonic() + timeout_s
    while True:
        tick(service)
        if every is not None:
            every()
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"not reached in {timeout_s} s; routes: {describe(service)}")
        time.sleep(0.1)


def routes(service: Service, *states: str) -> list[Route]:
    """Return the service's routes (in these states), oldest first."""
    found = service.routes.order_by("pk").select_related("node", "revision")
    return list(found.filter(state__in=states) if states else found)


def healthy(service: Service, count: int) -> bool:
    return len(routes(service, RouteState.HEALTHY)) == count


def describe(service: Service) -> str:
    return "; ".join(
        f"{r.pk} r{r.revision.number} {r.state} on {r.node and r.node.name} "
        f"{r.status_message!r} {r.errors[-1:]}"
        for r in routes(service)
    )
