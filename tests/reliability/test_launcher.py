"""The `make run` launcher supervises its children: a crashed engine or Redis is restarted with a
log line while the rest keep serving, and a child that keeps crashing stops the launcher, named.

The first test runs a real `manage.py nexus_run` (output to a file, as `make run > run.log`) and
kills its children with SIGKILL; the second drives the Supervisor with a child that always fails.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redis

from nexus.env import bundled_redis_socket
from nexus.launcher import LaunchError, Supervisor
from tests.support import outcomes
from tests.support.http import LOOPBACK
from tests.support.launcher import (
    BANNER_END,
    Launcher,
    free_ports,
    is_running,
    kind_of,
    launcher_environment,
    process_tree,
)
from tests.support.traffic import Answer, chat_body, send
from tests.support.waiting import wait_until

RECOVERY_TIMEOUT_S = 30.0


def child_pid(launcher: Launcher, kind: str, argument: str = "") -> int:
    """Return the pid of the launcher's child of this kind (whose argv holds `argument`)."""
    for pid, parent in process_tree(launcher.process.pid).items():
        if parent != launcher.process.pid or kind_of(pid) != kind:
            continue
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        if not argument or argument in argv:
            return pid
    raise AssertionError(f"no {kind} {argument} among the launcher's children")


def keep_chatting(url: str, token: str, stop: threading.Event) -> list[Answer]:
    """Send short streams to the demo pool until `stop` (bounded: at most 120 s)."""
    answers = []
    deadline = time.monotonic() + 120
    body = chat_body("demo", max_tokens=4, stream=True)
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            answers.append(send(f"{url}/v1/chat/completions", token, body, timeout_s=30))
        except httpx.HTTPError as error:
            answers.append(Answer(0, httpx.Headers(), repr(error).encode(), [], 0.0, 0.0))
        time.sleep(0.05)
    return answers


def healthz(url: str) -> dict[str, object]:
    try:
        return dict(LOOPBACK.get(f"{url}/healthz", timeout=5).json())
    except (httpx.HTTPError, ValueError):
        return {}


def test_a_killed_engine_and_a_killed_redis_are_restarted_while_nexus_keeps_serving(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # Given `make run > run.log` on a fresh data dir (a short path: Unix socket paths are short)
    data_dir = tmp_path_factory.mktemp("supervised")
    web_port, agent_port, *demo_ports = free_ports(5)
    env = launcher_environment(data_dir, web_port, demo_ports, agent_port)
    # The bundled Redis is the one killed below: without REDIS_URL (CI sets one) it is started.
    env.pop("REDIS_URL", None)
    url = f"http://127.0.0.1:{web_port}"
    launcher = Launcher(env, output_file=data_dir / "run.log")
    try:
        # Then the banner is in the file by the time /healthz says ok (the worker starts after it)
        wait_until(
            lambda: healthz(url).get("status") == "ok",
            timeout_s=90,
            what=lambda: launcher.output,
        )
        assert BANNER_END in launcher.output
        token = re.search(r"Client token  (nx-\S+)", launcher.output)
        assert token, launcher.output
        web = child_pid(launcher, "daphne")

        stop = threading.Event()
        chatting = threading.Thread(
            target=lambda: answers.extend(keep_chatting(url, token[1], stop)), daemon=True
        )
        answers: list[Answer] = []
        chatting.start()
        time.sleep(1)

        # When a demo engine is killed
        engine = child_pid(launcher, "serving.runtimes.simulator", str(demo_ports[0]))
        # The time is taken before the kill: a stream it cuts ends after it, however soon.
        engine_killed_at = time.monotonic()
        os.kill(engine, signal.SIGKILL)

        # Then the launcher says so and starts it again, and it answers on its port
        launcher.wait_for("engine-fast exited with status -9; restarting it in", 10)
        launcher.wait_for("engine-fast restarted", 10)
        wait_until(
            lambda: _answers(f"http://127.0.0.1:{demo_ports[0]}/health"),
            timeout_s=RECOVERY_TIMEOUT_S,
        )
        engine_recovered_s = time.monotonic() - engine_killed_at

        # When the bundled Redis is killed
        redis_pid = child_pid(launcher, "redis")
        redis_killed_at = time.monotonic()
        os.kill(redis_pid, signal.SIGKILL)

        # Then it is restarted too, and answers on its socket again
        launcher.wait_for("redis exited with status -9; restarting it in", 10)
        launcher.wait_for("redis restarted", 15)
        socket_path = bundled_redis_socket(data_dir)
        wait_until(
            lambda: redis.Redis(unix_socket_path=str(socket_path), socket_timeout=1).ping(),
            timeout_s=RECOVERY_TIMEOUT_S,
        )
        redis_recovered_s = time.monotonic() - redis_killed_at
        time.sleep(2)
        stop.set()
        chatting.join(timeout=60)

        # and the web server never stopped, and the launcher is still running
        assert child_pid(launcher, "daphne") == web
        assert launcher.process.poll() is None
        # and traffic went on: the pool routed around the dead engine, Redis' loss failed nothing
        # A stream already running on the engine when it was killed may end with an error event
        # (the request was delivered, so it is not retried: DESIGN.md); no other may fail.
        cut = [a for a in answers if a.started < engine_killed_at <= a.finished]
        failed = [
            answer
            for answer in answers
            if (answer.status != 200 or not answer.done) and answer not in cut
        ]
        served_after = [a for a in answers if a.started > redis_killed_at and a.status == 200]
        outcomes.record(
            "launcher_child_crashes",
            {
                "requests": len(answers),
                "failed": len(failed),
                "engine_back_after_s": round(engine_recovered_s, 2),
                "redis_back_after_s": round(redis_recovered_s, 2),
            },
        )
        assert failed == [], [
            (a.status, a.content[:200], a.events[-2:], a.started - engine_killed_at) for a in failed
        ]
        assert len(cut) <= 1, cut  # one client, one stream at a time
        assert served_after, "no request was served after Redis came back"

        # When it receives SIGTERM while a stream is in flight
        tree = process_tree(launcher.process.pid)
        streaming = threading.Event()
        long_body = chat_body("demo", max_tokens=200, stream=True)
        with ThreadPoolExecutor(max_workers=1) as executor:
            last = executor.submit(
                send, f"{url}/v1/chat/completions", token[1], long_body, started=streaming
            )
            assert streaming.wait(10)
            status = launcher.stop(signal.SIGTERM)
            answer = last.result()

        # Then the stream finished first (the web server stops before the engines), and
        # everything stopped, the restarted children included
        assert (answer.status, answer.done) == (200, True), answer.events[-2:]
        assert status == 0, launcher.output
        assert [pid for pid in tree if is_running(pid)] == []
    finally:
        launcher.kill()


def _answers(url: str) -> bool:
    try:
        return LOOPBACK.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


# The supervisor under test starts the child process.
@pytest.mark.live
def test_a_child_that_keeps_crashing_stops_the_launcher_naming_it(tmp_path: Path) -> None:
    # Given a supervised child that exits with status 3 as soon as it starts
    said: list[str] = []
    supervisor = Supervisor(
        cwd=tmp_path, env={}, log_dir=tmp_path / "logs", say=said.append, backoff_s=0.01
    )
    supervisor.start("flaky", [sys.executable, "-c", "print('cannot go on'); raise SystemExit(3)"])
    supervisor.supervise()

    # When the launcher watches it
    started = time.monotonic()
    with pytest.raises(LaunchError) as stopped:
        supervisor.watch()

    # Then it was restarted with a growing backoff, then given up on, named, with its log's end
    assert time.monotonic() - started < 10
    assert [line.split(";")[1].strip() for line in said if "exited" in line] == [
        "restarting it in 0.0 s (see {})".format(tmp_path / "logs/flaky.log"),
        "restarting it in 0.0 s (see {})".format(tmp_path / "logs/flaky.log"),
        "restarting it in 0.0 s (see {})".format(tmp_path / "logs/flaky.log"),
        "restarting it in 0.1 s (see {})".format(tmp_path / "logs/flaky.log"),
        "restarting it in 0.2 s (see {})".format(tmp_path / "logs/flaky.log"),
    ]
    assert sum("flaky restarted" in line for line in said) == 5
    message = str(stopped.value)
    assert message.startswith("flaky exited with status 3 after 5 restarts in 60 s")
    assert "crash-looping" in message
    # The log kept every run's output, not only the last one's.
    assert message.count("cannot go on") == 6
    supervisor.stop_all()
