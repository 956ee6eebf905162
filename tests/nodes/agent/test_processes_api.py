"""The process routes of a real agent process, and processes outliving the agent."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.support.agent import RunningAgent, running_agent
from tests.support.ports import free_port
from tests.support.waiting import wait_until

# Every wait is bounded by this; a healthy run needs a fraction of it.
WAIT_S = 10.0
TRAP_SIGTERM = """
    import signal, sys, time
    def bye(*_):
        print("bye")
        sys.exit(0)
    signal.signal(signal.SIGTERM, bye)
    print("ready")
    time.sleep(60)
"""
SLEEP = "print('ready'); import time; time.sleep(60)"


def python(code: str) -> list[str]:
    """Return the argv that runs `code` with unbuffered output, so the log shows it at once."""
    return [sys.executable, "-u", "-c", textwrap.dedent(code)]


def gone(pid: int) -> bool:
    """Return whether the process has ended (a zombie waiting to be reaped has)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path


@pytest.fixture
def agent(tmp_path: Path, models_dir: Path) -> Iterator[RunningAgent]:
    with running_agent(tmp_path, args=["--allow-dir", str(models_dir)]) as agent:
        yield agent


@pytest.fixture
def client(agent: RunningAgent) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=agent.url, headers=agent.headers(), timeout=WAIT_S + 5) as client:
        yield client


def wait_for_log(client: httpx.Client, process_id: str, text: str) -> None:
    wait_until(
        lambda: text in client.get(f"/agent/v1/processes/{process_id}/log?tail=50").text,
        timeout_s=WAIT_S,
        what=f"{text!r} in the log of {process_id}",
    )


def wait_for_state(client: httpx.Client, process_id: str, state: str) -> dict[str, Any]:
    """Wait until the agent reports the process in `state` and return it."""

    def reported() -> dict[str, Any] | None:
        process: dict[str, Any] = client.get(f"/agent/v1/processes/{process_id}").json()
        return process if process["state"] == state else None

    return wait_until(reported, timeout_s=WAIT_S, what=f"{process_id} is {state}")


def test_a_process_is_started_listed_tailed_and_stopped(client: httpx.Client) -> None:
    created = client.post(
        "/agent/v1/processes",
        json={"argv": python(TRAP_SIGTERM), "name": "trap", "env": {"TOKEN": "s3cret"}},
    )

    assert created.status_code == 201
    process = created.json()
    assert (process["name"], process["state"]) == ("trap", "running")
    assert process["env_keys"] == ["TOKEN"]
    assert "s3cret" not in created.text
    assert client.get("/agent/v1/processes").json()["data"] == [process]
    assert client.get(f"/agent/v1/processes/{process['id']}").json() == process

    wait_for_log(client, process["id"], "ready")
    log = client.get(f"/agent/v1/processes/{process['id']}/log", params={"tail": 1})
    assert log.headers["content-type"].startswith("text/plain")
    assert log.text == "ready\n"

    stopped = client.delete(f"/agent/v1/processes/{process['id']}", params={"grace": 5})

    assert stopped.status_code == 200
    body = stopped.json()
    assert (body["state"], body["exit_code"], body["log_tail"]) == ("stopped", 0, "ready\nbye\n")
    assert client.get(f"/agent/v1/processes/{process['id']}").json() == body


def test_a_crash_is_reported_with_its_exit_code_and_last_lines(client: httpx.Client) -> None:
    code = "import sys; print('loading'); print('out of memory', file=sys.stderr); sys.exit(2)"
    process = client.post("/agent/v1/processes", json={"argv": python(code)}).json()

    crashed = wait_for_state(client, process["id"], "exited")

    assert (crashed["exit_code"], crashed["log_tail"]) == (2, "loading\nout of memory\n")


@pytest.mark.parametrize(
    ("body", "status", "code", "message"),
    [
        ({}, 400, "invalid_request", "argv: required"),
        ({"argv": [sys.executable], "port": "80"}, 400, "invalid_request", "port: "),
        ({"argv": ["nexus-no-such-command"]}, 400, "invalid_request", "argv[0]: "),
        ({"argv": [sys.executable], "cwd": "/"}, 403, "path_not_allowed", "/ is outside"),
    ],
)
def test_a_refused_start_answers_the_error_and_records_nothing(
    client: httpx.Client, body: dict[str, Any], status: int, code: str, message: str
) -> None:
    response = client.post("/agent/v1/processes", json=body)

    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code
    assert error["message"].startswith(message)
    assert client.get("/agent/v1/processes").json()["data"] == []


def test_a_port_held_by_a_running_process_answers_409(client: httpx.Client) -> None:
    port = free_port()
    first = client.post("/agent/v1/processes", json={"argv": python(SLEEP), "port": port})

    second = client.post("/agent/v1/processes", json={"argv": python(SLEEP), "port": port})

    assert first.status_code == 201
    assert second.status_code == 409
    assert second.json()["error"]["code"] == "port_in_use"


def test_an_unknown_process_and_a_bad_tail_are_refused(client: httpx.Client) -> None:
    missing = client.get("/agent/v1/processes/p-00000000")
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "process_not_found")
    assert client.delete("/agent/v1/processes/p-00000000").status_code == 404

    process = client.post("/agent/v1/processes", json={"argv": python(SLEEP)}).json()
    for tail in ("0", "10001", "many"):
        refused = client.get(f"/agent/v1/processes/{process['id']}/log", params={"tail": tail})
        assert refused.status_code == 400
        assert refused.json()["error"]["message"].startswith("tail: ")


def test_processes_survive_an_agent_restart_and_ones_that_end_meanwhile_are_lost(
    agent: RunningAgent, client: httpx.Client
) -> None:
    # Given two processes the agent started,
    live = client.post("/agent/v1/processes", json={"argv": python(SLEEP)}).json()
    doomed = client.post("/agent/v1/processes", json={"argv": python(SLEEP)}).json()
    wait_for_log(client, doomed["id"], "ready")

    # when the agent crashes, one of them is killed while it is down, and the agent comes back,
    agent.kill()
    assert not gone(live["pid"])
    os.killpg(doomed["pid"], signal.SIGKILL)
    wait_until(lambda: gone(doomed["pid"]), timeout_s=WAIT_S, what="the process ends")
    agent.start()

    # then the live one is reported running still, and the killed one lost.
    assert client.get(f"/agent/v1/processes/{live['id']}").json() == live
    lost = client.get(f"/agent/v1/processes/{doomed['id']}").json()
    assert (lost["state"], lost["exit_code"], lost["log_tail"]) == ("lost", None, "ready\n")

    # The re-adopted process can still be stopped through the new agent.
    stopped = client.delete(f"/agent/v1/processes/{live['id']}", params={"grace": 5}).json()
    assert (stopped["state"], stopped["exit_code"]) == ("stopped", None)
    assert gone(live["pid"])


def test_a_re_adopted_process_that_ends_is_reported_lost(
    agent: RunningAgent, client: httpx.Client
) -> None:
    process = client.post("/agent/v1/processes", json={"argv": python(SLEEP)}).json()
    wait_for_log(client, process["id"], "ready")
    agent.kill()
    agent.start()
    assert client.get(f"/agent/v1/processes/{process['id']}").json()["state"] == "running"

    os.killpg(process["pid"], signal.SIGKILL)

    lost = wait_for_state(client, process["id"], "lost")
    assert lost["message"] == "ended while the agent was not its parent"
