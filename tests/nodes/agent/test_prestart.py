"""Pre-start actions: run by a real agent, in order, before the command, in the same process."""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from nodes.agent import prestart
from serving.definitions import model_definition
from tests.nodes.agent.test_processes_api import (
    WAIT_S,
    gone,
    python,
    wait_for_log,
    wait_for_state,
)
from tests.support.agent import RunningAgent, running_agent
from tests.support.waiting import wait_until

# The command most tests run after their actions: it reports who it is, then waits to be stopped.
REPORT_AND_WAIT = """
    import json, os, signal, sys, time
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    tempfiles = {k: v for k, v in os.environ.items() if k.startswith("NEXUS_TEMPFILE")}
    print(json.dumps(
        {"pid": os.getpid(), "argv": sys.argv[1:], "cwd": os.getcwd(), "tempfiles": tempfiles}
    ))
    print("ready")
    time.sleep(60)
"""


@pytest.fixture(scope="module")
def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory the agent is allowed to use besides its data dir."""
    return tmp_path_factory.mktemp("shared")


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory, shared_dir: Path) -> Iterator[RunningAgent]:
    tmp_path = tmp_path_factory.mktemp("prestart")
    with running_agent(tmp_path, args=["--allow-dir", str(shared_dir)]) as agent:
        yield agent


@pytest.fixture
def client(agent: RunningAgent) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=agent.url, headers=agent.headers(), timeout=WAIT_S + 5) as client:
        yield client


@pytest.fixture
def workdir(shared_dir: Path, request: pytest.FixtureRequest) -> Path:
    """A fresh working directory for one test's process, inside the allowed directory."""
    path = shared_dir / request.node.name.replace("[", "-").replace("]", "")
    path.mkdir()
    return path


def start(client: httpx.Client, actions: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    """Start a process with these pre-start actions (REPORT_AND_WAIT unless argv is given)."""
    body = {"argv": python(REPORT_AND_WAIT), "pre_start_actions": actions, **spec}
    response = client.post("/agent/v1/processes", json=body)
    assert response.status_code == 201, response.text
    process: dict[str, Any] = response.json()
    return process


def log_lines(client: httpx.Client, process_id: str) -> list[str]:
    log = client.get(f"/agent/v1/processes/{process_id}/log", params={"tail": 200})
    return log.text.splitlines()


def report(client: httpx.Client, process_id: str) -> dict[str, Any]:
    """Wait until REPORT_AND_WAIT is running and return what it reported about itself."""
    wait_for_log(client, process_id, "ready")
    reported: dict[str, Any] = json.loads(
        next(line for line in log_lines(client, process_id) if line.startswith("{"))
    )
    return reported


def action(kind: str, **args: Any) -> dict[str, Any]:
    return {"action": kind, "args": args}


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- every action, in order -----------------------------------------------------------------------


def test_the_actions_run_in_order_each_with_a_line_in_the_log_before_the_command(
    client: httpx.Client, workdir: Path
) -> None:
    process = start(
        client,
        [
            action("mkdir", path="conf"),
            action("log", message="preparing on port ${PORT}"),
            action("log", message="details", debug=True),
            action("write_file", filename="conf/server.yaml", body="port: ${PORT}\n"),
            action("run_command", command="sh -c 'echo checked $(cat conf/server.yaml)'"),
        ],
        cwd=str(workdir),
        env={"SERVED_ON": "${PORT}"},
    )

    report(client, process["id"])

    port = process["port"]
    assert process["pre_start_actions"] == 5
    assert log_lines(client, process["id"])[:7] == [
        f"pre-start action 1 (mkdir): mkdir {workdir}/conf",
        f"pre-start action 2 (log): preparing on port {port}",
        "pre-start action 3 (log): debug: details",
        f"pre-start action 4 (write_file): write {workdir}/conf/server.yaml (mode 0644)",
        "pre-start action 5 (run_command): run sh -c 'echo checked $(cat conf/server.yaml)'",
        f"checked port: {port}",
        f"pre-start: 5 actions done, starting {sys.executable}",
    ]


def test_the_command_replaces_the_runner_in_the_same_process_with_its_argv_and_env(
    agent: RunningAgent, client: httpx.Client, workdir: Path
) -> None:
    # The run_command's parent is the runner: it prints the runner's pid.
    process = start(
        client,
        [action("run_command", command=["sh", "-c", "echo runner $PPID"])],
        argv=[*python(REPORT_AND_WAIT), "--port", "${PORT}"],
        env={"MODEL_NAME": "demo", "SERVED_ON": "${PORT}"},
        cwd=str(workdir),
    )

    reported = report(client, process["id"])

    pid = process["pid"]
    assert f"runner {pid}" in log_lines(client, process["id"])
    assert reported == {
        "pid": pid,
        "argv": ["--port", str(process["port"])],
        "cwd": str(workdir),
        "tempfiles": {},
    }
    running = psutil.Process(pid)
    assert running.cmdline() == [*python(REPORT_AND_WAIT), "--port", str(process["port"])]
    assert os.getpgid(pid) == pid  # still the leader of its own group
    environ = running.environ()
    assert (environ["MODEL_NAME"], environ["SERVED_ON"]) == ("demo", str(process["port"]))
    assert "NEXUS_AGENT_CREDENTIAL" not in environ
    assert agent.credential not in environ.values()
    assert process["argv"] == running.cmdline()


def test_files_are_written_with_their_mode_and_appended_to(
    client: httpx.Client, workdir: Path
) -> None:
    process = start(
        client,
        [
            action("write_file", filename="secret.env", body="TOKEN=s3cret\n", mode="0600"),
            action("write_file", filename="notes.txt", body="one\n"),
            action("write_file", filename="notes.txt", body="two\n", append=True, mode="640"),
            action("write_file", filename="run.sh", body="#!/bin/sh\n", mode="0o755"),
            action("write_file", filename="digits.txt", body="", mode=600),
            action("write_file", filename=str(workdir / "absolute.txt"), body="here"),
        ],
        cwd=str(workdir),
    )

    report(client, process["id"])

    assert (workdir / "secret.env").read_text() == "TOKEN=s3cret\n"
    assert mode_of(workdir / "secret.env") == 0o600
    assert (workdir / "notes.txt").read_text() == "one\ntwo\n"
    assert mode_of(workdir / "notes.txt") == 0o640
    assert mode_of(workdir / "run.sh") == 0o755
    assert (workdir / "digits.txt").read_text() == ""
    assert mode_of(workdir / "digits.txt") == 0o600  # an integer's digits are read as octal
    assert (workdir / "absolute.txt").read_text() == "here"
    assert "secret" not in json.dumps(process)


def test_a_file_written_again_is_replaced(client: httpx.Client, workdir: Path) -> None:
    (workdir / "config.json").write_text('{"old": "and much longer"}')

    process = start(
        client, [action("write_file", filename="config.json", body="{}")], cwd=str(workdir)
    )

    report(client, process["id"])
    assert (workdir / "config.json").read_text() == "{}"


def test_mkdir_makes_parents_and_accepts_a_directory_that_exists(
    client: httpx.Client, workdir: Path
) -> None:
    (workdir / "exists").mkdir()

    process = start(
        client,
        [action("mkdir", path="a/b/c"), action("mkdir", path="exists")],
        cwd=str(workdir),
    )

    report(client, process["id"])
    assert (workdir / "a" / "b" / "c").is_dir()


def test_a_tempfile_is_named_by_placeholder_and_environment_and_removed_at_the_end(
    agent: RunningAgent, client: httpx.Client
) -> None:
    # The command is the first tempfile; the second is read by a later run_command.
    script = textwrap.dedent(REPORT_AND_WAIT)
    process = start(
        client,
        [
            action("write_tempfile", body=script, mode="0700"),
            action("write_tempfile", body="settings = 1\n"),
            action("run_command", command=["cat", "${NEXUS_TEMPFILE}"]),
        ],
        argv=[sys.executable, "-u", "${NEXUS_TEMPFILE_1}", "--config", "${NEXUS_TEMPFILE}"],
    )

    reported = report(client, process["id"])

    tempdir = agent.data_dir / "prestart" / process["id"]
    first, second = sorted(tempdir.iterdir(), key=lambda path: path.read_text() != script)
    assert (first.suffix, second.suffix) == (".py", ".py")
    assert (mode_of(first), mode_of(second)) == (0o700, 0o644)
    assert log_lines(client, process["id"])[:4] == [
        f"pre-start action 1 (write_tempfile): write {first} (mode 0700) as "
        "${NEXUS_TEMPFILE}, ${NEXUS_TEMPFILE_1}",
        f"pre-start action 2 (write_tempfile): write {second} (mode 0644) as "
        "${NEXUS_TEMPFILE}, ${NEXUS_TEMPFILE_2}",
        f"pre-start action 3 (run_command): run cat {second}",
        "settings = 1",
    ]
    assert psutil.Process(process["pid"]).cmdline()[2:] == [str(first), "--config", str(second)]
    assert reported["argv"] == ["--config", str(second)]
    assert reported["tempfiles"] == {
        "NEXUS_TEMPFILE": str(second),
        "NEXUS_TEMPFILE_1": str(first),
        "NEXUS_TEMPFILE_2": str(second),
    }

    client.delete(f"/agent/v1/processes/{process['id']}", params={"grace": 5})

    assert not tempdir.exists()


def test_the_runners_spec_is_private_while_the_actions_run_and_gone_once_the_command_starts(
    agent: RunningAgent, client: httpx.Client
) -> None:
    spec_dir = agent.data_dir / "prestart"
    process = start(
        client,
        [action("run_command", command=["sh", "-c", f"stat -c %a {spec_dir}/p-*.json"])],
        env={"API_KEY": "s3cret"},
    )

    report(client, process["id"])

    assert "600" in log_lines(client, process["id"])
    assert not (spec_dir / f"{process['id']}.json").exists()
    assert mode_of(spec_dir) == 0o700


# -- failures -------------------------------------------------------------------------------------


def test_a_failing_command_ends_the_process_with_exit_3_naming_the_action(
    client: httpx.Client, workdir: Path
) -> None:
    process = start(
        client,
        [
            action("log", message="starting"),
            action("run_command", command=["sh", "-c", "echo disk full >&2; exit 4"]),
            action("write_file", filename="never.txt", body=""),
        ],
        cwd=str(workdir),
    )

    ended = wait_for_state(client, process["id"], "exited")

    assert ended["exit_code"] == prestart.EXIT_FAILED == 3
    assert ended["log_tail"].splitlines()[-2:] == [
        "disk full",
        "pre-start action 2 (run_command) failed: sh -c 'echo disk full >&2; exit 4' exited with "
        "code 4",
    ]
    assert not (workdir / "never.txt").exists()


@pytest.mark.parametrize(
    ("failing", "reason"),
    [
        (
            action("run_command", command=["nexus-no-such-command"]),
            "nexus-no-such-command not found",
        ),
        (
            action("write_file", filename="missing/dir/file.txt", body=""),
            "No such file or directory",
        ),
        (action("mkdir", path="plain-file/sub"), "Not a directory"),
    ],
    ids=["command-not-found", "write-into-missing-dir", "mkdir-under-a-file"],
)
def test_an_action_that_cannot_be_done_fails_the_start_with_the_reason(
    client: httpx.Client, workdir: Path, failing: dict[str, Any], reason: str
) -> None:
    (workdir / "plain-file").write_text("")

    process = start(client, [failing], cwd=str(workdir))

    ended = wait_for_state(client, process["id"], "exited")
    last = ended["log_tail"].splitlines()[-1]
    assert ended["exit_code"] == 3
    assert last.startswith(f"pre-start action 1 ({failing['action']}) failed: ")
    assert reason in last


def test_a_command_an_action_was_to_make_but_did_not_fails_with_exit_3(
    client: httpx.Client, workdir: Path
) -> None:
    process = start(
        client, [action("log", message="forgot the script")], argv=["./start.sh"], cwd=str(workdir)
    )

    ended = wait_for_state(client, process["id"], "exited")

    assert ended["exit_code"] == 3
    assert ended["log_tail"].splitlines()[-1] == (
        "pre-start: cannot run ./start.sh: No such file or directory: ./start.sh"
    )


def test_a_script_written_by_an_action_can_be_the_command(
    client: httpx.Client, workdir: Path
) -> None:
    process = start(
        client,
        [action("write_file", filename="start.sh", body="#!/bin/sh\necho started $1\n", mode=755)],
        argv=["./start.sh", "fine"],
        cwd=str(workdir),
    )

    ended = wait_for_state(client, process["id"], "exited")

    assert (ended["exit_code"], ended["log_tail"].splitlines()[-1]) == (0, "started fine")


def test_stopping_during_a_run_command_stops_the_runner_and_the_command(
    client: httpx.Client,
) -> None:
    process = start(
        client, [action("run_command", command=["sh", "-c", "echo slow; exec sleep 60"])]
    )
    wait_for_log(client, process["id"], "slow")
    # The shell has written "slow" and may not have exec'd sleep yet (seen in a CI rehearsal).
    sleeper = wait_until(
        lambda: next(
            (c for c in psutil.Process(process["pid"]).children() if c.name() == "sleep"), None
        ),
        timeout_s=WAIT_S,
        what="the run_command's shell never became sleep",
    )

    stopped = client.delete(f"/agent/v1/processes/{process['id']}", params={"grace": 5}).json()

    assert (stopped["state"], stopped["exit_code"]) == ("stopped", -15)
    wait_until(
        lambda: gone(sleeper.pid),
        timeout_s=WAIT_S,
        what="the run_command's child ends with the group",
    )


def test_a_started_command_is_stopped_and_reports_its_own_exit_code(
    client: httpx.Client,
) -> None:
    process = start(client, [action("log", message="hello")])
    report(client, process["id"])

    stopped = client.delete(f"/agent/v1/processes/{process['id']}", params={"grace": 5}).json()

    assert (stopped["state"], stopped["exit_code"]) == ("stopped", 0)
    assert gone(process["pid"])


# -- refusals -------------------------------------------------------------------------------------

WRITE = {"filename": "x.txt", "body": ""}


@pytest.mark.parametrize(
    ("actions", "message"),
    [
        ({}, "pre_start_actions: must be a list of actions"),
        (["mkdir"], "pre_start_actions[0]: must be an object with action and args"),
        (
            [action("mkdir", path="x"), action("rm", path="x")],
            "pre_start_actions[1].action: must be one of: "
            "write_file, write_tempfile, run_command, mkdir, log",
        ),
        ([{"args": {}}], "pre_start_actions[0].action: required"),
        ([{"action": "log"}], "pre_start_actions[0].args: required"),
        ([{"action": "log", "args": ["hi"]}], "pre_start_actions[0].args: must be an object"),
        (
            [{"action": "log", "args": {"message": "hi"}, "ref": "x"}],
            "pre_start_actions[0].ref: unknown field",
        ),
        ([action("log", msg="hi")], "pre_start_actions[0].args.msg: unknown field"),
        ([action("write_file", body="")], "pre_start_actions[0].args.filename: required"),
        (
            [action("write_file", **WRITE, mode="rw-r--r--")],
            'pre_start_actions[0].args.mode: must be an octal permission like "0644"',
        ),
        (
            [action("write_file", **WRITE, mode=999)],
            'pre_start_actions[0].args.mode: must be an octal permission like "0644"',
        ),
        (
            [action("write_file", **WRITE, append="yes")],
            "pre_start_actions[0].args.append: must be true or false",
        ),
        ([action("log", message=7)], "pre_start_actions[0].args.message: must be a string"),
        ([action("mkdir", path="")], "pre_start_actions[0].args.path: must be a non-empty path"),
        (
            [action("run_command", command=[])],
            "pre_start_actions[0].args.command: must be a non-empty string or list of strings",
        ),
        (
            [action("run_command", command=["ls", 1])],
            "pre_start_actions[0].args.command[1]: must be a string without NUL characters",
        ),
        (
            [action("run_command", command="echo 'unbalanced")],
            "pre_start_actions[0].args.command: cannot be split into arguments: "
            "No closing quotation",
        ),
    ],
)
def test_a_malformed_action_is_refused_with_400_naming_it_and_nothing_starts(
    agent: RunningAgent, client: httpx.Client, actions: Any, message: str
) -> None:
    before = client.get("/agent/v1/processes").json()["data"]
    logs_before = sorted((agent.data_dir / "logs").iterdir())

    response = client.post(
        "/agent/v1/processes", json={"argv": python("print(1)"), "pre_start_actions": actions}
    )

    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": message,
        "type": "invalid_request_error",
        "code": "invalid_request",
    }
    assert client.get("/agent/v1/processes").json()["data"] == before
    assert sorted((agent.data_dir / "logs").iterdir()) == logs_before


def test_a_command_not_on_path_is_refused_before_the_actions_run(
    client: httpx.Client, workdir: Path
) -> None:
    response = client.post(
        "/agent/v1/processes",
        json={
            "argv": ["nexus-no-such-command"],
            "cwd": str(workdir),
            "pre_start_actions": [action("write_file", filename="x.txt", body="")],
        },
    )

    assert response.status_code == 400
    assert response.json()["error"]["message"] == "argv[0]: nexus-no-such-command not found"
    assert list(workdir.iterdir()) == []


@pytest.mark.parametrize(
    ("actions", "field", "path"),
    [
        (
            [action("write_file", filename="/etc/nexus-test", body="")],
            "filename",
            "/etc/nexus-test",
        ),
        ([action("mkdir", path="../../../outside")], "path", None),
        ([action("log", message="ok"), action("mkdir", path="/tmp/nexus-elsewhere")], "path", None),
    ],
    ids=["absolute", "relative-escaping-cwd", "second-action"],
)
def test_a_path_outside_the_allowed_directories_is_refused_with_403(
    client: httpx.Client,
    workdir: Path,
    actions: list[dict[str, Any]],
    field: str,
    path: str | None,
) -> None:
    before = client.get("/agent/v1/processes").json()["data"]

    response = client.post(
        "/agent/v1/processes",
        json={"argv": python("print(1)"), "cwd": str(workdir), "pre_start_actions": actions},
    )

    assert response.status_code == 403
    error = response.json()["error"]
    index = len(actions) - 1
    assert error["code"] == "path_not_allowed"
    assert error["message"].startswith(f"pre_start_actions[{index}].args.{field}: ")
    assert "is outside the directories this agent may use" in error["message"]
    if path is not None:
        assert f": {path} is outside" in error["message"]
    assert client.get("/agent/v1/processes").json()["data"] == before


def test_a_path_in_another_allowed_directory_than_the_cwd_is_accepted(
    agent: RunningAgent, client: httpx.Client, shared_dir: Path
) -> None:
    # The cwd is the data dir; the file goes to the other allowed directory.
    target = shared_dir / "from-elsewhere.txt"

    process = start(client, [action("write_file", filename=str(target), body="ok")])

    report(client, process["id"])
    assert process["cwd"] == str(agent.data_dir)
    assert target.read_text() == "ok"


def test_a_process_without_actions_is_started_directly(client: httpx.Client) -> None:
    process = client.post("/agent/v1/processes", json={"argv": python(REPORT_AND_WAIT)}).json()

    report(client, process["id"])

    assert process["pre_start_actions"] == 0
    assert not any(line.startswith("pre-start") for line in log_lines(client, process["id"]))


def test_the_agent_knows_the_same_actions_and_arguments_as_the_model_definition() -> None:
    def shape(table: Any, required: object) -> dict[str, dict[str, tuple[str, object]]]:
        return {
            kind: {
                name: (arg_kind, "required" if default is required else default)
                for name, (arg_kind, default) in args.items()
            }
            for kind, args in table.items()
        }

    assert shape(prestart.ACTION_ARGS, prestart.REQUIRED) == shape(
        model_definition.ACTION_ARGS, model_definition.REQUIRED
    )
