"""Validate: a trial replica of the launcher's settings on a real agent, run to a verdict and
always stopped; the page's popup and the API start one."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.test import Client
from rest_framework.test import APIClient

from nodes.models import Node
from serving import folders, trials
from serving.models import ModelFolder, Trial, TrialState, models_root
from tests.nexus.factories import make_user
from tests.nodes.fleet import trusted_node
from tests.support.agent import running_agent

HEALTH = """\
      port: 8000
      health_check:
        path: /
        interval: 0.2
        max_retries: 2
        max_wait_time: 1.0
        initial_delay: 0
"""
BROKEN = f"""\
models:
  - name: site
    model_path: /models
    service:
      start_command:
        - python
        - -c
        - "import sys; print('cannot load the model: no weights', file=sys.stderr); sys.exit(3)"
        - ${{PORT}}
{HEALTH}"""
# Probed for up to 10 s: the server's own start may take a while on a loaded machine.
SERVING = """\
models:
  - name: site
    model_path: /models
    service:
      start_command: [python, -m, http.server, "${PORT}", --bind, 127.0.0.1, --directory, /models]
      port: 8000
      health_check:
        path: /
        interval: 0.25
        max_retries: 40
        max_wait_time: 1.0
        initial_delay: 0
"""
SILENT = f"""\
models:
  - name: site
    model_path: /models
    service:
      start_command: [python, -c, "import time; time.sleep(60)", "${{PORT}}"]
{HEALTH}"""


@pytest.fixture
def node(transactional_db: None, tmp_path: Path, data_dir: Path) -> Iterator[Node]:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
    with running_agent(
        tmp_path, name="node-a", args=["--allow-dir", str(models_root())], env={"PATH": path}
    ) as agent:
        yield trusted_node("node-a", agent)


def folder_with(definition: str) -> ModelFolder:
    folder = folders.create_folder(ModelFolder(name="site"))
    folders.write_file(folder, "model-definition.yaml", [definition.encode()])
    return folder


def trial_of(definition: str) -> Trial:
    folder = folder_with(definition)
    return trials.start_trial(None, name="", model_folder=folder, runtime_variant="custom")


def running_processes(node: Node) -> list[dict[str, object]]:
    with node.client() as agent:
        return [record for record in agent.processes() if record.get("state") == "running"]


def test_a_broken_definitions_trial_fails_with_its_exit_and_log(node: Node) -> None:
    trial = trial_of(BROKEN)

    assert trials.run_trial(trial.pk) == "failed"

    trial.refresh_from_db()
    assert trial.state == TrialState.FAILED
    assert trial.reason == "the process exited with code 3"
    assert "cannot load the model: no weights" in trial.log
    assert trial.node == node
    assert running_processes(node) == []


def test_a_serving_definitions_trial_passes_its_first_probe_and_is_stopped(node: Node) -> None:
    trial = trial_of(SERVING)

    assert trials.run_trial(trial.pk) == "passed"

    trial.refresh_from_db()
    assert trial.reason == "/ answered HTTP 200"
    assert trial.probes[-1]["passed"] is True
    assert running_processes(node) == []


def test_a_silent_server_fails_after_max_retries_plus_one_probes(node: Node) -> None:
    trial = trial_of(SILENT)

    assert trials.run_trial(trial.pk) == "failed"

    trial.refresh_from_db()
    assert [probe["passed"] for probe in trial.probes] == [False, False, False]
    assert trial.reason.startswith("3 health probes of / failed in a row; the last: ")
    assert running_processes(node) == []


def test_a_trial_runs_once(node: Node) -> None:
    trial = trial_of(BROKEN)
    trials.run_trial(trial.pk)

    assert trials.run_trial(trial.pk) == "gone"


@pytest.mark.django_db
def test_the_launcher_lists_the_problems_instead_of_starting_a_trial(data_dir: Path) -> None:
    folder_with(BROKEN.replace("start_command", "start_commands"))
    client = Client()
    client.force_login(make_user("owner", staff=True))

    page = client.post(
        "/serving/services/new/validate/",
        {
            "name": "",
            "model_folder": "site",
            "runtime_variant": "custom",
            "custom_mode": "definition",
            "mount_destination": "/models",
            "desired_replicas": "1",
            "resource_group": "default",
            "cluster_mode": "single",
            "cluster_size": "1",
        },
    ).content.decode()

    assert "Not started" in page
    assert "start_command" in page
    assert not Trial.objects.exists()


def test_the_api_starts_a_trial_and_shows_it(node: Node) -> None:
    folder_with(BROKEN)
    api = APIClient()
    api.force_login(make_user("owner", staff=True))

    started = api.post(
        "/api/v1/services/validate/",
        {"model_folder": "site", "runtime_variant": "custom"},
        format="json",
    )
    trials.run_trial(started.json()["id"])
    shown = api.get(f"/api/v1/trials/{started.json()['id']}/").json()

    assert started.status_code == 202
    assert started.json()["state"] == "queued"
    assert (shown["state"], shown["reason"], shown["node"]) == (
        "failed",
        "the process exited with code 3",
        "node-a",
    )
    assert "cannot load the model: no weights" in shown["log"]
