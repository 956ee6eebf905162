"""Starting the agent: banner, credential sources, restarts, signals and `manage.py runagent`."""

from __future__ import annotations

import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil

from tests.support import processes
from tests.support.agent import REPO_ROOT, running_agent
from tests.support.http import LOOPBACK
from tests.support.ports import free_port

STARTUP_S = 30
BANNER = re.compile(
    r"^Nexus agent 0\.1\.0 on http://127\.0\.0\.1:(\d+)\n"
    r"fingerprint: (SHA256:[A-Za-z0-9+/]{43})\n"
    r"credential: (.+)\n",
    re.M,
)


def agent_environment(**extra: str) -> dict[str, str]:
    """Return the environment without a credential or Django settings, plus `extra`."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("NEXUS_AGENT_CREDENTIAL", "DJANGO_SETTINGS_MODULE")
    }
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


@contextmanager
def started(command: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen]:
    """Run an agent command until the block ends, waiting until it has printed its banner."""
    with log.open("wb") as output:
        process = subprocess.Popen(
            command, cwd=REPO_ROOT, env=env, stdout=output, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + STARTUP_S
        while not BANNER.search(log.read_text()):
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the agent did not start:\n{log.read_text()}")
            time.sleep(0.05)
        yield process
    finally:
        processes.stop(process, timeout_s=10)


def info(port: int, credential: str) -> httpx.Response:
    return LOOPBACK.get(
        f"http://127.0.0.1:{port}/agent/v1/info",
        headers={"Authorization": f"Bearer {credential}"},
        timeout=10,
    )


def test_the_banner_shows_url_and_fingerprint_but_never_the_credential(tmp_path: Path) -> None:
    with running_agent(tmp_path, credential="banner-secret-123") as agent:
        banner = BANNER.search(agent.log())

    assert banner is not None
    assert int(banner.group(1)) == agent.port
    assert banner.group(2) == agent.fingerprint
    assert banner.group(3) == "from --credential"
    assert "banner-secret-123" not in agent.log()


def test_without_a_credential_one_is_generated_once_into_a_private_file(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    port = free_port()
    command = [sys.executable, "-m", "nodes.agent", "--port", str(port)]
    command += ["--data-dir", str(data_dir)]

    with started(command, agent_environment(), tmp_path / "first.log"):
        credential = (data_dir / "credential").read_text()
        first = info(port, credential)
    with started(command, agent_environment(), tmp_path / "second.log"):
        second = info(port, credential)

    assert stat.S_IMODE((data_dir / "credential").stat().st_mode) == 0o600
    assert len(credential) >= 43  # 32 random bytes, URL-safe base64
    assert (first.status_code, second.status_code) == (200, 200)
    banner = BANNER.search((tmp_path / "first.log").read_text())
    assert banner is not None
    assert banner.group(3) == f"stored in {data_dir / 'credential'}"
    for log in ("first.log", "second.log"):
        assert credential not in (tmp_path / log).read_text()


def test_the_credential_can_come_from_the_environment(tmp_path: Path) -> None:
    port = free_port()
    command = [sys.executable, "-m", "nodes.agent", "--port", str(port)]
    command += ["--data-dir", str(tmp_path / "data")]
    env = agent_environment(NEXUS_AGENT_CREDENTIAL="from-the-environment")

    with started(command, env, tmp_path / "agent.log"):
        accepted = info(port, "from-the-environment")

    assert accepted.status_code == 200
    assert "credential: from NEXUS_AGENT_CREDENTIAL\n" in (tmp_path / "agent.log").read_text()
    assert not (tmp_path / "data" / "credential").exists()


def test_the_fingerprint_survives_a_restart_and_a_crash(tmp_path: Path) -> None:
    with running_agent(tmp_path) as agent:
        first = agent.fingerprint
        agent.stop()
        agent.start()
        after_restart = agent.fingerprint
        agent.kill()
        agent.start()
        after_crash = agent.fingerprint
        served = info(agent.port, agent.credential).json()["fingerprint"]

    assert first == after_restart == after_crash == served
    assert stat.S_IMODE((agent.data_dir / "identity.key").stat().st_mode) == 0o600


def test_sigterm_stops_the_agent_cleanly_and_its_processes_keep_running(tmp_path: Path) -> None:
    with running_agent(tmp_path) as agent:
        process = LOOPBACK.post(
            f"{agent.url}/agent/v1/processes",
            headers=agent.headers(),
            json={"argv": ["sleep", "60"]},
            timeout=10,
        ).json()
        agent.process.send_signal(signal.SIGTERM)
        exit_code = agent.process.wait(10)
        survived = psutil.pid_exists(process["pid"])
        agent.start()
        adopted = LOOPBACK.get(
            f"{agent.url}/agent/v1/processes/{process['id']}", headers=agent.headers(), timeout=10
        ).json()

    assert exit_code == 0
    assert survived
    assert adopted["state"] == "running"
    assert "Traceback" not in agent.log()


def test_sigint_stops_the_agent_cleanly_too(tmp_path: Path) -> None:
    with running_agent(tmp_path) as agent:
        agent.process.send_signal(signal.SIGINT)
        exit_code = agent.process.wait(10)

    assert exit_code == 0
    assert "Traceback" not in agent.log()


def test_a_port_in_use_is_reported_and_the_agent_exits(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "nodes.agent", "--port", str(port)]
            + ["--data-dir", str(tmp_path / "data"), "--credential", "x"],
            cwd=REPO_ROOT,
            env=agent_environment(),
            capture_output=True,
            text=True,
            timeout=STARTUP_S,
        )

    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


def test_the_agent_needs_no_django(tmp_path: Path) -> None:
    probe = (
        "import sys; import nodes.agent.server, nodes.agent.identity; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'django'))"
    )

    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO_ROOT,
        env=agent_environment(),
        capture_output=True,
        text=True,
        timeout=STARTUP_S,
        check=True,
    )

    assert result.stdout == "[]\n"


def test_nexus_agent_help_lists_its_options() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "nodes.agent", "--help"],
        cwd=REPO_ROOT,
        env=agent_environment(),
        capture_output=True,
        text=True,
        timeout=STARTUP_S,
        check=True,
    )

    for option in ("--host", "--port", "--data-dir", "--credential", "--allow-dir", "--watch"):
        assert option in result.stdout


def test_manage_py_runagent_help_lists_the_same_options() -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "runagent", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=STARTUP_S,
        check=True,
    )

    for option in ("--host", "--port", "--data-dir", "--credential", "--allow-dir", "--watch"):
        assert option in result.stdout


def test_manage_py_runagent_runs_the_same_agent(tmp_path: Path) -> None:
    credential = "runagent-secret"
    port = free_port()
    command = [sys.executable, "manage.py", "runagent", "--port", str(port)]
    command += ["--data-dir", str(tmp_path / "data"), "--credential", credential]

    with started(command, {**os.environ, "PYTHONUNBUFFERED": "1"}, tmp_path / "agent.log") as agent:
        answered = info(port, credential)
        agent.terminate()
        exit_code = agent.wait(10)

    banner = BANNER.search((tmp_path / "agent.log").read_text())
    assert banner is not None
    assert answered.status_code == 200
    assert answered.json()["fingerprint"] == banner.group(2)
    assert exit_code == 0
