"""Replicas through real agents: the process spec, start, stop, exits noticed, errors cleared."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import httpx
from django.utils import timezone

from nodes.models import Node
from serving import replicas
from serving.models import ModelFolder, Route, RouteState, Service
from tests.nodes.fleet import trusted_node
from tests.serving.fleet import (
    CRASHING,
    HELLO,
    add_revision,
    make_service,
    model_folder,
    models_agent,
)
from tests.support.agent import RunningAgent, running_agent
from tests.support.http import LOOPBACK
from tests.support.waiting import wait_until


def placed_route(service: Service, node: Node) -> Route:
    route = Route.objects.create(service=service, revision=service.latest_revision, node=node)
    return Route.objects.select_related("service", "revision__model_folder", "node").get(
        pk=route.pk
    )


def agent_record(agent: RunningAgent, process_id: str) -> dict:
    response = LOOPBACK.get(
        f"{agent.url}/agent/v1/processes/{process_id}", headers=agent.headers(), timeout=5
    )
    response.raise_for_status()
    return response.json()


def ended(agent: RunningAgent, route: Route) -> dict | None:
    record = agent_record(agent, route.process_id)
    return record if record["state"] != "running" else None


def test_the_process_spec_maps_the_mount_to_the_folder(db: None) -> None:
    folder = ModelFolder.objects.create(name="llama")
    service = Service.objects.create(name="chat")
    real = str(folder.path)
    add_revision(
        service,
        folder,
        argv=["vllm", "serve", "/models/llama-3", "--download-dir=/models", "/modelsx", "/m"],
        env={"WEIGHTS": "/models/w.bin", "OTHER": "models/w.bin"},
        port=8000,
        model_name="llama-3-8b",
        slots={"cpu": 2, "mem": "4g", "cuda.shares": 1},
        pre_start_actions=[
            {"action": "write_file", "args": {"filename": "/models/run.sh", "body": "/models"}},
            {"action": "run_command", "args": {"command": ["ls", "/models/x"]}},
        ],
    )
    route = Route.objects.create(service=service, revision=service.latest_revision)

    spec = replicas.process_spec(route, gpus=[1])

    assert spec == {
        "argv": ["vllm", "serve", f"{real}/llama-3", f"--download-dir={real}", "/modelsx", "/m"],
        "env": {"WEIGHTS": f"{real}/w.bin", "OTHER": "models/w.bin"},
        "cwd": real,
        "name": f"chat-r1-{route.pk}",
        "model": {
            "id": "llama-3-8b",
            "runtime": "custom",
            "digest": None,
            "health_path": "/hello.txt",
        },
        "resources": {"cpu_count": 2.0, "memory_bytes": 4 << 30, "gpus": [1]},
        "port": 8000,
        "pre_start_actions": [
            {"action": "write_file", "args": {"filename": f"{real}/run.sh", "body": real}},
            {"action": "run_command", "args": {"command": ["ls", f"{real}/x"]}},
        ],
    }


def test_a_custom_mount_destination_is_mapped_and_port_left_to_the_agent(db: None) -> None:
    folder = ModelFolder.objects.create(name="weights")
    service = Service.objects.create(name="embed")
    revision = add_revision(service, folder, argv=["serve", "/data/x", "--port", "${PORT}"])
    revision.mount_destination = "/data/"
    revision.save()
    route = Route.objects.create(service=service, revision=revision)

    spec = replicas.process_spec(route)

    assert spec["argv"] == ["serve", f"{folder.path}/x", "--port", "${PORT}"]
    assert "port" not in spec
    assert "pre_start_actions" not in spec


def test_a_started_route_serves_its_folder_and_stops_on_the_agent(db: None, tmp_path: Path) -> None:
    with model_folder() as folder, models_agent(tmp_path) as agent:
        node = trusted_node("node-a", agent)
        service = make_service(folder, name="files")
        route = placed_route(service, node)

        assert replicas.start_route(route)

        route.refresh_from_db()
        assert route.state == RouteState.PROVISIONING
        assert route.process_id and route.port and route.started_at
        record = agent_record(agent, route.process_id)
        assert record["name"] == f"files-r1-{route.pk}"
        assert record["cwd"] == str(folder.path)
        assert record["model"] == {
            "id": "tiny",
            "runtime": "custom",
            "digest": None,
            "health_path": "/hello.txt",
        }
        served = wait_until(
            lambda: _get(f"http://127.0.0.1:{route.port}/hello.txt"), what=agent.log
        )
        assert served.text == HELLO

        route.state = RouteState.TERMINATING
        route.save()
        assert replicas.stop_route(route)

        route.refresh_from_db()
        assert route.state == RouteState.TERMINATED
        assert route.ended_at is not None
        assert agent_record(agent, route.process_id)["state"] == "stopped"


def test_a_process_that_exits_while_provisioning_failed_to_start_with_its_last_lines(
    db: None, tmp_path: Path
) -> None:
    with model_folder() as folder, models_agent(tmp_path) as agent:
        node = trusted_node("node-a", agent)
        service = make_service(folder, argv=CRASHING)
        route = placed_route(service, node)
        replicas.start_route(route)
        record = wait_until(lambda: ended(agent, route), what=agent.log)
        before = timezone.now()

        assert replicas.notice_exit(route, record)

        route.refresh_from_db()
        assert route.state == RouteState.FAILED_TO_START
        assert route.status_message == "the process exited with code 1"
        [error] = route.errors
        assert error["message"] == "the process exited with code 1"
        assert error["exit_code"] == 1
        assert error["log_tail"].splitlines()[-2:] == ["loading weights", "CUDA out of memory"]
        assert route.ended_at is not None
        # The first failure waits a second before its replacement.
        assert before + timedelta(seconds=1) <= route.not_before
        assert route.not_before <= timezone.now() + timedelta(seconds=1)


def test_a_healthy_process_that_exits_is_unhealthy(db: None, tmp_path: Path) -> None:
    with model_folder() as folder, models_agent(tmp_path) as agent:
        node = trusted_node("node-a", agent)
        exits_later = [sys.executable, "-c", "import time; time.sleep(0.5); raise SystemExit(7)"]
        service = make_service(folder, argv=exits_later)
        route = placed_route(service, node)
        replicas.start_route(route)
        Route.objects.filter(pk=route.pk).update(state=RouteState.HEALTHY)
        route.state = RouteState.HEALTHY
        record = wait_until(lambda: ended(agent, route), what=agent.log)

        assert replicas.notice_exit(route, record)

        route.refresh_from_db()
        assert route.state == RouteState.UNHEALTHY
        assert route.errors[-1]["exit_code"] == 7
        assert route.errors[-1]["message"] == "the process exited with code 7"


def test_a_running_process_is_not_an_exit(db: None, tmp_path: Path) -> None:
    with model_folder() as folder, models_agent(tmp_path) as agent:
        node = trusted_node("node-a", agent)
        route = placed_route(make_service(folder), node)
        replicas.start_route(route)

        assert not replicas.notice_exit(route, agent_record(agent, route.process_id))

        route.refresh_from_db()
        assert route.state == RouteState.PROVISIONING
        assert route.errors == []


def test_an_agent_that_may_not_run_in_the_folder_fails_the_route_saying_so(
    db: None, tmp_path: Path
) -> None:
    # No --allow-dir: the models directory is outside what this agent may use.
    with model_folder() as folder, running_agent(tmp_path) as agent:
        node = trusted_node("node-a", agent)
        route = placed_route(make_service(folder), node)

        assert not replicas.start_route(route)

        route.refresh_from_db()
        assert route.state == RouteState.FAILED_TO_START
        assert route.process_id == ""
        assert route.status_message.startswith("node node-a refused to start it: ")
        assert str(folder.path) in route.status_message
        assert route.errors[-1]["exit_code"] is None


def test_pre_start_actions_run_with_the_folder_mapped(db: None, tmp_path: Path) -> None:
    with model_folder() as folder, models_agent(tmp_path) as agent:
        node = trusted_node("node-a", agent)
        service = make_service(
            folder,
            pre_start_actions=[
                {"action": "write_file", "args": {"filename": "/models/ready.txt", "body": "ok"}}
            ],
        )
        route = placed_route(service, node)

        assert replicas.start_route(route), route.status_message

        route.refresh_from_db()
        served = wait_until(
            lambda: _get(f"http://127.0.0.1:{route.port}/ready.txt"), what=agent.log
        )
        assert served.text == "ok"
        assert (folder.path / "ready.txt").read_text() == "ok"


def test_clearing_errors_lets_a_failed_route_be_replaced_at_once(db: None) -> None:
    folder = ModelFolder.objects.create(name="tiny")
    service = make_service(folder)
    later = timezone.now() + timedelta(seconds=60)
    route = Route.objects.create(
        service=service,
        revision=service.latest_revision,
        state=RouteState.FAILED_TO_START,
        errors=[{"at": "", "message": "boom", "exit_code": 1, "log_tail": ""}],
        restart_count=6,
        not_before=later,
    )

    replicas.clear_errors_and_retry(route)

    route.refresh_from_db()
    assert route.errors == []
    assert route.restart_count == 0
    assert route.not_before <= timezone.now()


def test_backoff_doubles_up_to_a_minute() -> None:
    assert [replicas.backoff_s(n) for n in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert replicas.backoff_s(1000) == 60


def _get(url: str) -> httpx.Response | None:
    try:
        response = LOOPBACK.get(url, timeout=2)
    except httpx.TransportError:
        return None
    return response if response.status_code == 200 else None
