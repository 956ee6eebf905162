"""`manage.py nexus_run`, what `make run` starts, as a user runs it: real processes and ports."""

from __future__ import annotations

import json
import re
import signal
import socket
import sqlite3
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.hashers import check_password
from openai import OpenAI

from tests.support.http import LOOPBACK
from tests.support.launcher import (
    BANNER_END,
    EXIT_TIMEOUT_S,
    START_TIMEOUT_S,
    Launcher,
    free_ports,
    is_running,
    kind_of,
    launcher_environment,
    process_tree,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
# The worker starts after the banner and records a heartbeat when it is ready: /healthz says so
# within seconds of the banner, give or take a slow machine.
WORKER_HEALTHY_TIMEOUT_S = 30.0


def wait_for_healthy_worker(url: str) -> dict[str, Any]:
    """Return /healthz's report once it says the worker's heartbeat arrived."""
    deadline = time.monotonic() + WORKER_HEALTHY_TIMEOUT_S
    while True:
        response = LOOPBACK.get(f"{url}/healthz", timeout=5)
        report = response.json()
        if report["worker"]["status"] == "ok" or time.monotonic() > deadline:
            return {"http_status": response.status_code, **report}
        time.sleep(0.5)


def assert_it_serves_the_demo(url: str, token: str) -> None:
    """Check health, the model list and one streamed chat through the official SDK."""
    report = wait_for_healthy_worker(url)
    assert report["http_status"] == 200
    assert report["database"]["status"] == "ok"
    assert report["redis"]["status"] == "ok"
    assert report["worker"]["status"] == "ok", report
    client = OpenAI(base_url=f"{url}/v1", api_key=token, max_retries=0, timeout=30)
    assert "@pool/demo" in [model.id for model in client.models.list()]
    stream = client.chat.completions.create(
        model="@pool/demo",
        messages=[{"role": "user", "content": "Say hello."}],
        stream=True,
        max_tokens=8,
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text.strip()


def read_rows(database: Path, query: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(database) as db:
        return db.execute(query).fetchall()


def start_runtime_on_the_local_agent(agent_url: str, data_dir: Path, model: str) -> dict[str, Any]:
    """Start a simulator as a process of the local agent, with the credential it stored."""
    credential = (data_dir / "agent" / "credential").read_text().strip()
    response = LOOPBACK.post(
        f"{agent_url}/agent/v1/processes",
        headers={"Authorization": f"Bearer {credential}"},
        json={
            "argv": [sys.executable, "-m", "serving.runtimes.simulator", "--model", model,
                     "--host", "127.0.0.1", "--port", "${PORT}"],
            # The agent runs it in its data dir; the simulator is imported from this checkout.
            "env": {"PYTHONPATH": str(REPO_ROOT)},
            "name": f"simulator {model}",
            "model": {"id": model, "runtime": "simulator"},
        },
        timeout=10,
    )  # fmt: skip
    assert response.status_code == 201, response.text
    return response.json()


def wait_for_rows(database: Path, query: str, expected: list[tuple[Any, ...]]) -> None:
    """Return once the query reads the expected rows; fail after START_TIMEOUT_S."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while (rows := read_rows(database, query)) != expected:
        if time.monotonic() > deadline:
            pytest.fail(f"{query} reads {rows}, not {expected}")
        time.sleep(0.2)


def test_it_runs_the_demo_stops_everything_and_reuses_its_data_on_the_next_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # Given a fresh data dir (a short path: Unix socket paths hold at most 107 bytes)
    data_dir = tmp_path_factory.mktemp("run")
    web_port, agent_port, *demo_ports = free_ports(5)
    env = launcher_environment(data_dir, web_port, demo_ports, agent_port)
    url = f"http://127.0.0.1:{web_port}"
    agent_url = f"http://127.0.0.1:{agent_port}"
    database = data_dir / "nexus.sqlite3"
    local_node = f"Local node    local: agent on {agent_url} (trusted)"
    node_state = "SELECT name, address, trust, status FROM nodes_node"

    # When Nexus runs for the first time
    first = Launcher(env)
    try:
        first.wait_for(BANNER_END)

        # Then it prints the URL, the admin's password and a client token, once
        assert f"Nexus is running at {url}/" in first.output
        password = re.search(r"user admin, password (\S+)", first.output)
        token = re.search(r"Client token  (nx-\S+)", first.output)
        assert password and token, first.output
        [(password_hash,)] = read_rows(database, "SELECT password FROM auth_user")
        assert check_password(password[1], password_hash)

        # and serves the demo pool with a worker and beat behind it
        assert_it_serves_the_demo(url, token[1])

        # and trusts the local agent it started as node `local`, which the refresh finds online
        assert local_node in first.output
        assert read_rows(database, node_state) == [("local", agent_url, "trusted", "online")]
        printed = re.search(
            r"^fingerprint: (\S+)$", (data_dir / "logs/agent.log").read_text(), re.M
        )
        assert printed, (data_dir / "logs/agent.log").read_text()
        assert read_rows(database, "SELECT fingerprint FROM nodes_node") == [(printed[1],)]

        # and a runtime the local agent starts shows in the node's inventory
        runtime = start_runtime_on_the_local_agent(agent_url, data_dir, "local-1b")
        inventory = "SELECT model_id, process_id FROM nodes_nodemodel"
        wait_for_rows(database, inventory, [("local-1b", runtime["id"])])

        # and started Redis, three engines, the agent, daphne, the history writer and the Celery
        # worker
        tree = process_tree(first.process.pid)
        children = [pid for pid, parent in tree.items() if parent == first.process.pid]
        expected = {
            "serving.runtimes.simulator": 3, "daphne": 1, "runhistorywriter": 1, "celery": 1,
            "nodes.agent": 1,
        }  # fmt: skip
        if "REDIS_URL" not in env:
            expected["redis"] = 1
        assert Counter(kind_of(pid) for pid in children) == expected
        # (whose work shows: the demo requests' history, shipped by daphne, is in the database)
        wait_for_rows(database, "SELECT 1 FROM pools_routingrecord LIMIT 1", [(1,)])
        assert is_running(runtime["pid"]) and runtime["pid"] in tree

        # When it receives SIGTERM
        status = first.stop(signal.SIGTERM)

        # Then it exits 0 and every process it started, and theirs, is gone: the agent's
        # runtime was stopped through the agent, gracefully
        assert status == 0, first.output
        assert [pid for pid in tree if is_running(pid)] == []
        assert "Stopping 1 runtime(s) the local agent runs..." in first.output
        records = json.loads((data_dir / "agent/processes.json").read_text())["processes"]
        assert [(r["id"], r["state"]) for r in records] == [(runtime["id"], "stopped")]
        assert "Nexus stopped." in first.output
    finally:
        first.kill()

    # Given the operator edited the demo pool in between
    with sqlite3.connect(database) as db:
        db.execute("UPDATE pools_target SET capacity_weight = 2 WHERE name = 'slow'")

    # When Nexus runs again on the same data
    second = Launcher(env)
    try:
        second.wait_for(BANNER_END)

        # Then it prints no new password nor token, and the first token still works
        assert "password " + password[1] not in second.output
        assert not re.search(r"user admin, password \S+", second.output)
        assert "nx-" not in second.output
        assert "manage.py nexus_token create --name me" in second.output
        assert_it_serves_the_demo(url, token[1])

        # and the local agent is the same trusted node, with nothing of the last run left running
        assert local_node in second.output
        assert read_rows(database, node_state) == [("local", agent_url, "trusted", "online")]
        assert "runtime(s) the local agent runs" not in second.output

        # and the demo was neither duplicated nor reset
        assert read_rows(database, "SELECT slug FROM pools_pool") == [("demo",)]
        assert sorted(read_rows(database, "SELECT name, capacity_weight FROM pools_target")) == [
            ("fast", 8),
            ("medium", 6),
            ("slow", 2),
        ]
        assert read_rows(database, "SELECT username FROM auth_user") == [("admin",)]
        assert read_rows(database, "SELECT name FROM nexus_apitoken") == [("demo",)]

        # and Ctrl-C (SIGINT) stops it as cleanly
        tree = process_tree(second.process.pid)
        assert second.stop(signal.SIGINT) == 0, second.output
        assert [pid for pid in tree if is_running(pid)] == []
    finally:
        second.kill()


@pytest.mark.parametrize(
    ("busy", "named"),
    [
        ("web", "the web server (NEXUS_PORT)"),
        ("agent", "the local agent (NEXUS_AGENT_PORT)"),
        (1, "demo engine 'medium' (NEXUS_DEMO_PORTS)"),
    ],
)
def test_it_refuses_a_busy_port_at_once_and_names_it(
    tmp_path_factory: pytest.TempPathFactory, busy: str | int, named: str
) -> None:
    # Given another program listens on a port Nexus needs
    data_dir = tmp_path_factory.mktemp("busy")
    web_port, agent_port, *demo_ports = free_ports(5)
    busy_port = {"web": web_port, "agent": agent_port}.get(str(busy)) or demo_ports[int(busy)]
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", busy_port))
        holder.listen()

        # When Nexus starts
        started = time.monotonic()
        launcher = Launcher(launcher_environment(data_dir, web_port, demo_ports, agent_port))
        try:
            status = launcher.wait_exit()
        finally:
            launcher.kill()

    # Then it fails within seconds, names the port and the setting, and started nothing
    assert status == 1
    assert time.monotonic() - started < EXIT_TIMEOUT_S
    assert "already in use" in launcher.output
    assert f"127.0.0.1:{busy_port} for {named}" in launcher.output
    assert not (data_dir / "logs").exists()
