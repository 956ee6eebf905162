"""Deployments survive a lost worker: followers touch their rows, and stalled rows are resumed.

A row whose follower stopped touching it for a minute is claimed by one beat, and another worker
follows the agent job the row recorded; the job itself ran on in the agent all along.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

from deployments import services, tasks
from deployments.models import DeploymentNode, NodeState
from tests.deployments.factories import make_deployment, make_node
from tests.deployments.test_deploying_to_agents import MIB, MODEL, deploy_file, fleet_node
from tests.support.agent import running_agent
from tests.support.fileserver import serving_file
from tests.support.http import LOOPBACK
from tests.support.ports import free_port
from tests.support.waiting import wait_until
from tests.support.worker import running_worker

A_MINUTE_AGO = timedelta(seconds=services.STALLED_AFTER_S + 1)


def stall(row: DeploymentNode, by: timedelta = A_MINUTE_AGO) -> None:
    """Make the row look untouched for `by`, as if its worker died that long ago."""
    DeploymentNode.objects.filter(pk=row.pk).update(updated_at=timezone.now() - by)


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    """Record the resumes queued instead of sending them to a broker."""
    calls: list[tuple[int, str]] = []
    monkeypatch.setattr(tasks.resume_deployment_node, "delay", lambda *args: calls.append(args))
    return calls


@pytest.mark.django_db
def test_a_row_touched_within_the_minute_is_left_to_its_follower(
    queued: list[tuple[int, str]],
) -> None:
    row = make_deployment("demo", {make_node("gpu-a"): NodeState.RUNNING}).nodes.get()
    stall(row, by=timedelta(seconds=services.STALLED_AFTER_S - 5))

    assert tasks.resume_stalled() == "0 resumed"
    assert queued == []


@pytest.mark.django_db
def test_a_stalled_row_is_claimed_by_one_beat_only_and_other_states_never(
    queued: list[tuple[int, str]],
) -> None:
    nodes = {make_node(name): state for name, state in [
        ("gpu-a", NodeState.RUNNING), ("gpu-b", NodeState.PENDING),
        ("gpu-c", NodeState.SUCCEEDED), ("gpu-d", NodeState.FAILED),
    ]}  # fmt: skip
    deployment = make_deployment("demo", nodes)
    for row in deployment.nodes.all():
        stall(row)
    running = deployment.nodes.get(state=NodeState.RUNNING)

    assert tasks.resume_stalled() == "1 resumed"
    assert tasks.resume_stalled() == "0 resumed"

    [(row_id, claimed_at)] = queued
    assert row_id == running.pk
    running.refresh_from_db()
    assert running.updated_at == datetime.fromisoformat(claimed_at)
    assert running.state == NodeState.RUNNING and running.attempt == 1


@pytest.mark.django_db
def test_a_broker_that_cannot_take_the_resume_leaves_the_row_for_the_next_beat(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*args: object) -> None:
        raise ConnectionError("Error 111 connecting to redis")

    monkeypatch.setattr(tasks.resume_deployment_node, "delay", refuse)
    row = make_deployment("demo", {make_node("gpu-a"): NodeState.RUNNING}).nodes.get()
    stall(row)

    assert tasks.resume_stalled() == "0 resumed"

    row.refresh_from_db()
    assert row.state == NodeState.RUNNING and row.error == ""


@pytest.mark.django_db
def test_a_resume_follows_the_recorded_job_and_a_second_delivery_does_nothing(
    queued: list[tuple[int, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(services, "UNREACHABLE_AFTER_S", 0.5)
    node = make_node("gpu-a", address=f"http://127.0.0.1:{free_port()}")
    row = make_deployment("demo", {node: NodeState.RUNNING}).nodes.get()
    DeploymentNode.objects.filter(pk=row.pk).update(agent_job_id="job-1", phase="downloading")
    stall(row)
    tasks.resume_stalled()
    [(row_id, claimed_at)] = queued

    # Following job-1 of a silent agent fails as following does; submitting anew would have
    # failed at once with "did not answer".
    assert tasks.resume_deployment_node(row_id, claimed_at) == "failed"
    assert tasks.resume_deployment_node(row_id, claimed_at) == "skipped"

    row.refresh_from_db()
    assert row.error == "node gpu-a stopped answering while downloading: connection refused"
    assert (row.state, row.attempt, row.agent_job_id) == (NodeState.FAILED, 1, "job-1")


@contextmanager
def serving_file_when_released(content: bytes, name: str) -> Iterator[tuple[str, threading.Event]]:
    """Serve one file whose every response waits until the event is set: a silent server."""
    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
            release.wait(timeout=30)
            self.send_response(200)
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            """Keep test output quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/{name}", release
    finally:
        release.set()
        server.shutdown()
        server.server_close()


def test_a_follower_touches_its_row_while_nothing_changes(
    transactional_db: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(services, "HEARTBEAT_S", 0.3)
    content = os.urandom(64 * 1024)
    with (
        running_agent(tmp_path) as agent,
        serving_file_when_released(content, "demo.bin") as (url, release),
        ThreadPoolExecutor(max_workers=1) as worker,
    ):
        node = fleet_node(agent, "node-a")
        row = services.create_deployment(
            name="demo", nodes=[node], runtime="simulator", model_source="http",
            model_location=url, model_sha256=hashlib.sha256(content).hexdigest(),
            model_name=MODEL,
        ).nodes.get()  # fmt: skip

        def follow() -> str:
            try:
                return services.run_node(row.pk)
            finally:
                connections.close_all()

        outcome = worker.submit(follow)
        progress = ("phase", "bytes_done", "message", "log", "updated_at")
        downloading = DeploymentNode.objects.filter(pk=row.pk, phase="downloading")
        wait_until(downloading.exists, timeout_s=30)
        # The agent now waits for the server's answer: nothing about the job changes.
        time.sleep(1.0)
        waiting = DeploymentNode.objects.values(*progress).get(pk=row.pk)

        # While the file server says nothing, only the heartbeat moves
        moved = wait_until(
            lambda: (
                DeploymentNode.objects.filter(pk=row.pk)
                .exclude(updated_at=waiting["updated_at"])
                .values(*progress)
                .first()
            ),
            timeout_s=5,
        )
        assert {**moved, "updated_at": None} == {**waiting, "updated_at": None}

        release.set()
        assert outcome.result(timeout=60) == NodeState.SUCCEEDED


def test_a_deployment_whose_worker_was_killed_is_finished_by_another_on_the_same_job(
    transactional_db: None, tmp_path: Path
) -> None:
    content = os.urandom(8 * MIB)
    with ExitStack() as stack:
        agent = stack.enter_context(running_agent(tmp_path))
        server = stack.enter_context(
            serving_file(content, name="demo.bin", rate_bytes_per_s=MIB // 2)
        )
        node = fleet_node(agent, "node-a")

        # Given a worker following a node's download
        with running_worker(tmp_path) as first:
            deployment = deploy_file(server, [node], hashlib.sha256(content).hexdigest())
            row = deployment.nodes.get()
            wait_until(
                lambda: DeploymentNode.objects.get(pk=row.pk).bytes_done > 0,
                timeout_s=30,
                what=first.log,
            )

            # When that worker is killed mid-download
            first.process.kill()
            first.process.wait()
        lost = DeploymentNode.objects.get(pk=row.pk)
        assert lost.state == NodeState.RUNNING and lost.agent_job_id

        # and, a minute later, a beat finds the row stalled with another worker running
        stall(lost)
        second = stack.enter_context(running_worker(tmp_path))
        assert tasks.resume_stalled() == "1 resumed"

        # Then the other worker follows the same job to its end: same attempt, one download
        def finished() -> DeploymentNode | None:
            done = DeploymentNode.objects.get(pk=row.pk)
            return done if done.state != NodeState.RUNNING else None

        done = wait_until(finished, timeout_s=60, what=second.log)
        assert (done.state, done.error) == (NodeState.SUCCEEDED, "")
        assert (done.attempt, done.agent_job_id) == (1, lost.agent_job_id)
        gets = [request["range"] for request in server.requests if request["method"] == "GET"]
        assert gets == [None], server.requests
        jobs = LOOPBACK.get(f"{agent.url}/agent/v1/jobs", headers=agent.headers(), timeout=5)
        assert [job["id"] for job in jobs.json()["data"]] == [lost.agent_job_id]
