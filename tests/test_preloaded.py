"""The preloader that starts the suite's Python processes (tests/support/preloaded.py) runs a
command as `python` would: its arguments, environment, directory, output, exit status and
signals, and a clean exit that waits for its threads."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import preloaded
from tests.support.waiting import wait_until

pytestmark = pytest.mark.live

SCRIPT = """
import os, sys, threading, time
mode = sys.argv[1]
print("argv", sys.argv[1:], "cwd", os.getcwd(), "env", os.environ.get("PRELOAD_PROBE"))
print("main", __name__, "path0", sys.path[0])
if mode == "exit":
    sys.exit(int(sys.argv[2]))
if mode == "raise":
    raise ValueError("broken on purpose")
if mode == "thread":
    # A non-daemon thread outlives the script's end: the process waits for it, as python does.
    threading.Thread(target=lambda: (time.sleep(0.3), print("thread done", flush=True))).start()
if mode == "wait":
    print("waiting", flush=True)
    time.sleep(60)
"""


def run(tmp_path: Path, *arguments: str) -> tuple[preloaded.Process, Path]:
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    log = tmp_path / "probe.log"
    with log.open("wb") as output:
        process = preloaded.start(
            [sys.executable, str(script), *arguments], {"PRELOAD_PROBE": "seen"}, output
        )
    return process, log


def test_a_script_gets_its_arguments_environment_directory_and_output(tmp_path: Path) -> None:
    process, log = run(tmp_path, "print", "second")

    assert process.wait(30) == 0
    lines = log.read_text().splitlines()
    assert lines[0] == f"argv ['print', 'second'] cwd {preloaded.REPO_ROOT} env seen"
    assert lines[1] == f"main __main__ path0 {tmp_path}"


def test_two_messages_that_arrive_together_are_read_one_at_a_time() -> None:
    # A child that ends at once: its pid and its exit status reach the test in one packet.
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(b'{"pid": 12}\n{"returncode": 0}\n')
        theirs.shutdown(socket.SHUT_WR)
        assert preloaded._receive(ours) == {"pid": 12}
        assert preloaded._receive(ours) == {"returncode": 0}
        assert preloaded._receive(ours) is None


def test_its_exit_status_and_an_uncaught_error_come_back(tmp_path: Path) -> None:
    exiting, _ = run(tmp_path, "exit", "3")
    raising, log = run(tmp_path, "raise")

    assert exiting.wait(30) == 3
    assert raising.wait(30) == 1
    assert "ValueError: broken on purpose" in log.read_text()


def test_it_waits_for_its_threads_before_exiting(tmp_path: Path) -> None:
    process, log = run(tmp_path, "thread")

    assert process.wait(30) == 0
    assert log.read_text().splitlines()[-1] == "thread done"


def test_signals_reach_it_and_wait_times_out_while_it_runs(tmp_path: Path) -> None:
    process, log = run(tmp_path, "wait")
    wait_until(lambda: "waiting" in log.read_text(), timeout_s=30, what=log.read_text)

    assert process.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(0.1)
    process.terminate()
    assert process.wait(30) == -signal.SIGTERM
    assert process.poll() == -signal.SIGTERM


def test_a_module_runs_as_with_python_m(tmp_path: Path) -> None:
    log = tmp_path / "module.log"
    with log.open("wb") as output:
        process = preloaded.start([sys.executable, "-m", "json.tool", "--help"], {}, output)

    assert process.wait(30) == 0
    assert log.read_text().startswith("usage: python -m json.tool")
