"""The agent's process manager: real commands started, watched, stopped, and re-adopted."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from nodes.agent.errors import AgentError
from nodes.agent.processes import (
    LOST_MESSAGE,
    UNKNOWN_EXIT_MESSAGE,
    ProcessManager,
    kill_all,
)
from tests.support.ports import free_port
from tests.support.waiting import eventually

# The agent's process manager, under test here, starts the processes: every test is live.
pytestmark = pytest.mark.live

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
IGNORE_SIGTERM = """
    import signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("ready")
    time.sleep(60)
"""
SLEEP = "print('ready'); import time; time.sleep(60)"


def python(code: str) -> list[str]:
    """Return the argv that runs `code` with unbuffered output, so the log shows it at once."""
    return [sys.executable, "-u", "-c", textwrap.dedent(code)]


async def ended(manager: ProcessManager, process_id: str) -> dict[str, Any]:
    """Wait until the manager reports the process ended and return its record."""

    def reported() -> dict[str, Any] | None:
        record = manager.get(process_id)
        return record if record["state"] != "running" else None

    return await eventually(reported, timeout_s=WAIT_S, what=f"{process_id} ends")


async def logged(manager: ProcessManager, process_id: str, text: str) -> None:
    await eventually(
        lambda: text in manager.log_tail(process_id, 100),
        timeout_s=WAIT_S,
        what=f"{text!r} in the log",
    )


def gone(pid: int) -> bool:
    """Return whether the process has ended (a zombie waiting to be reaped has)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def children() -> set[int]:
    return {child.pid for child in psutil.Process().children() if not gone(child.pid)}


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "agent"
    yield path
    kill_all(path)


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path


@pytest.fixture
async def manager(data_dir: Path, models_dir: Path) -> AsyncIterator[ProcessManager]:
    manager = ProcessManager(data_dir, [models_dir])
    yield manager
    await manager.close()


@pytest.fixture
def saved(data_dir: Path) -> Callable[[], dict[str, dict[str, Any]]]:
    """Return a reader of processes.json, by process id."""

    def read() -> dict[str, dict[str, Any]]:
        text = (data_dir / "processes.json").read_text()
        return {record["id"]: record for record in json.loads(text)["processes"]}

    return read


async def test_it_starts_a_command_and_records_it_without_env_values(
    manager: ProcessManager, data_dir: Path, saved: Callable[[], dict[str, dict[str, Any]]]
) -> None:
    record = await manager.start(
        {
            "argv": python(SLEEP),
            "env": {"API_KEY": "s3cret-value"},
            "name": "tiny",
            "model": {"id": "tiny-model", "runtime": "simulator"},
            "resources": {"gpus": [0], "memory_bytes": 1024},
        }
    )

    assert re.fullmatch(r"p-[0-9a-f]{8}", record["id"])
    assert record["name"] == "tiny"
    assert record["argv"] == python(SLEEP)
    assert record["env_keys"] == ["API_KEY"]
    assert record["cwd"] == str(data_dir.resolve())
    assert record["state"] == "running"
    assert (record["port"], record["exit_code"], record["ended_at"]) == (None, None, None)
    assert record["log_tail"] is None
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["started_at"])
    assert record["model"] == {
        "id": "tiny-model",
        "runtime": "simulator",
        "digest": None,
        "health_path": None,
    }
    assert record["resources"] == {"cpu_count": 0, "memory_bytes": 1024, "gpus": [0]}
    assert not gone(record["pid"])
    assert os.getpgid(record["pid"]) == record["pid"]
    assert manager.list() == [record]
    assert manager.running() == [record]
    assert manager.get(record["id"]) == record

    on_disk = saved()[record["id"]]
    assert on_disk["create_time"] == psutil.Process(record["pid"]).create_time()
    assert {key: value for key, value in on_disk.items() if key != "create_time"} == record
    assert "s3cret-value" not in (data_dir / "processes.json").read_text()
    assert sorted(path.name for path in data_dir.iterdir()) == ["logs", "processes.json"]


async def test_the_child_sees_the_agent_environment_with_the_spec_env_over_it(
    manager: ProcessManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEXUS_TEST_INHERITED", "from-agent")
    monkeypatch.setenv("NEXUS_TEST_OVERRIDDEN", "from-agent")
    code = (
        "import os; print(os.environ['NEXUS_TEST_INHERITED'], os.environ['NEXUS_TEST_OVERRIDDEN'])"
    )

    record = await manager.start({"argv": python(code), "env": {"NEXUS_TEST_OVERRIDDEN": "spec"}})

    assert (await ended(manager, record["id"]))["log_tail"] == "from-agent spec\n"


async def test_the_child_does_not_inherit_the_node_credential(
    manager: ProcessManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEXUS_AGENT_CREDENTIAL", "node-secret")
    code = "import os; print(os.environ.get('NEXUS_AGENT_CREDENTIAL'))"

    record = await manager.start({"argv": python(code)})

    assert (await ended(manager, record["id"]))["log_tail"] == "None\n"


async def test_it_runs_the_command_in_an_allowed_cwd(
    manager: ProcessManager, models_dir: Path
) -> None:
    record = await manager.start(
        {"argv": python("import os; print(os.getcwd())"), "cwd": str(models_dir)}
    )

    assert record["cwd"] == str(models_dir.resolve())
    assert (await ended(manager, record["id"]))["log_tail"] == f"{models_dir.resolve()}\n"


async def test_log_tail_returns_the_last_lines_of_a_large_log(manager: ProcessManager) -> None:
    code = "import sys; sys.stdout.write(''.join(f'line {i}\\n' for i in range(100_000)))"

    record = await manager.start({"argv": python(code)})
    await ended(manager, record["id"])

    assert manager.log_tail(record["id"], 3) == "line 99997\nline 99998\nline 99999\n"
    lines = manager.log_tail(record["id"], 10_000).splitlines()
    assert (len(lines), lines[0], lines[-1]) == (10_000, "line 90000", "line 99999")


async def test_log_tail_keeps_an_unfinished_last_line_and_returns_short_logs_whole(
    manager: ProcessManager,
) -> None:
    code = "import sys; sys.stdout.write('first\\r\\nsecond\\rprogress\\npartial')"

    record = await manager.start({"argv": python(code)})
    await ended(manager, record["id"])

    assert manager.log_tail(record["id"], 2) == "second\rprogress\npartial\n"
    assert manager.log_tail(record["id"], 100) == "first\r\nsecond\rprogress\npartial\n"


@pytest.mark.parametrize("lines", [0, -1, 10_001, "5", True, 2.0])
async def test_log_tail_refuses_a_line_count_out_of_bounds(
    manager: ProcessManager, lines: Any
) -> None:
    record = await manager.start({"argv": python("print('x')")})

    with pytest.raises(AgentError) as refused:
        manager.log_tail(record["id"], lines)

    assert (refused.value.status, refused.value.code) == (400, "invalid_request")
    assert refused.value.message == "tail: must be an integer from 1 to 10000"


async def test_a_crashing_command_is_reported_with_its_exit_code_and_last_lines(
    manager: ProcessManager,
) -> None:
    code = """
        import sys
        for i in range(30):
            print(f"line {i}")
        print("fatal: model file missing", file=sys.stderr)
        sys.exit(3)
    """

    record = await manager.start({"argv": python(code)})
    crashed = await ended(manager, record["id"])

    assert crashed["state"] == "exited"
    assert crashed["exit_code"] == 3
    expected = "".join(f"line {i}\n" for i in range(11, 30)) + "fatal: model file missing\n"
    assert crashed["log_tail"] == expected
    assert crashed["ended_at"] >= crashed["started_at"]
    assert manager.running() == []


async def test_a_command_killed_by_a_signal_has_a_negative_exit_code(
    manager: ProcessManager,
) -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"

    record = await manager.start({"argv": python(code)})

    assert (await ended(manager, record["id"]))["exit_code"] == -signal.SIGKILL


async def test_stop_lets_a_command_that_traps_sigterm_exit_within_the_grace(
    manager: ProcessManager, saved: Callable[[], dict[str, dict[str, Any]]]
) -> None:
    record = await manager.start({"argv": python(TRAP_SIGTERM)})
    await logged(manager, record["id"], "ready")

    began = time.monotonic()
    stopped = await manager.stop(record["id"], 5)

    assert time.monotonic() - began < 5
    assert (stopped["state"], stopped["exit_code"]) == ("stopped", 0)
    assert stopped["log_tail"] == "ready\nbye\n"
    assert gone(record["pid"])
    assert saved()[record["id"]]["state"] == "stopped"
    assert manager.get(record["id"]) == stopped


async def test_stop_kills_a_command_that_ignores_sigterm_after_the_grace(
    manager: ProcessManager,
) -> None:
    record = await manager.start({"argv": python(IGNORE_SIGTERM)})
    await logged(manager, record["id"], "ready")

    began = time.monotonic()
    stopped = await manager.stop(record["id"], 0.5)

    assert 0.5 <= time.monotonic() - began < WAIT_S
    assert (stopped["state"], stopped["exit_code"]) == ("stopped", -signal.SIGKILL)
    assert gone(record["pid"])


async def test_stop_ends_the_whole_process_group(manager: ProcessManager) -> None:
    code = """
        import subprocess, time
        child = subprocess.Popen(["sleep", "60"])
        print("child", child.pid)
        time.sleep(60)
    """
    record = await manager.start({"argv": python(code)})
    await logged(manager, record["id"], "child ")
    grandchild = int(manager.log_tail(record["id"], 1).split()[1])

    await manager.stop(record["id"], 5)

    await eventually(lambda: gone(grandchild), timeout_s=WAIT_S, what="the grandchild ends")


async def test_stopping_an_ended_process_returns_it_unchanged(manager: ProcessManager) -> None:
    record = await manager.start({"argv": python("print('done')")})
    done = await ended(manager, record["id"])

    assert await manager.stop(record["id"], 5) == done
    assert done["state"] == "exited"


@pytest.mark.parametrize("grace", [-1, 3601, "5", None, float("nan")])
async def test_stop_refuses_a_bad_grace(manager: ProcessManager, grace: Any) -> None:
    record = await manager.start({"argv": python(SLEEP)})

    with pytest.raises(AgentError) as refused:
        await manager.stop(record["id"], grace)

    assert refused.value.message.startswith("grace: ")
    assert manager.get(record["id"])["state"] == "running"


async def test_it_reports_an_unknown_process_as_not_found(manager: ProcessManager) -> None:
    for call in (
        lambda: manager.get("p-00000000"),
        lambda: manager.log_tail("p-00000000", 10),
    ):
        with pytest.raises(AgentError) as missing:
            call()
        assert (missing.value.status, missing.value.code) == (404, "process_not_found")
    with pytest.raises(AgentError) as missing:
        await manager.stop("p-00000000", 1)
    assert missing.value.message == "process p-00000000 does not exist on this node"


async def test_port_placeholders_get_a_free_port_the_command_serves_on(
    manager: ProcessManager,
) -> None:
    argv = [sys.executable, "-m", "http.server", "${PORT}", "--bind", "127.0.0.1"]

    record = await manager.start({"argv": argv, "env": {"SERVED_ON": "port ${PORT}"}})

    port = record["port"]
    assert isinstance(port, int)
    assert record["argv"][3] == str(port)
    assert record["env_keys"] == ["SERVED_ON"]

    async def answers() -> bool:
        try:
            async with httpx.AsyncClient(timeout=1) as client:
                response = await client.get(f"http://127.0.0.1:{port}/")
        except httpx.TransportError:
            return False
        return response.status_code == 200

    deadline = time.monotonic() + WAIT_S
    while not await answers():
        assert time.monotonic() < deadline, f"nothing answered on port {port}"
        await asyncio.sleep(0.1)


async def test_the_env_placeholder_gets_the_same_port(manager: ProcessManager) -> None:
    code = "import os, sys; print(sys.argv[1], os.environ['SERVED_ON'])"

    record = await manager.start(
        {"argv": [*python(code), "${PORT}"], "env": {"SERVED_ON": "port ${PORT}"}}
    )

    port = record["port"]
    assert (await ended(manager, record["id"]))["log_tail"] == f"{port} port {port}\n"


async def test_an_explicit_port_replaces_the_placeholder(manager: ProcessManager) -> None:
    port = free_port()

    record = await manager.start({"argv": [*python(SLEEP), "--port=${PORT}"], "port": port})

    assert (record["port"], record["argv"][-1]) == (port, f"--port={port}")


async def test_a_port_another_running_process_holds_is_refused(manager: ProcessManager) -> None:
    port = free_port()
    first = await manager.start({"argv": python(SLEEP), "port": port})

    with pytest.raises(AgentError) as refused:
        await manager.start({"argv": python(SLEEP), "port": port})

    assert (refused.value.status, refused.value.code) == (409, "port_in_use")
    assert refused.value.message == f"port {port} is used by process {first['id']}"
    assert [record["id"] for record in manager.list()] == [first["id"]]

    await manager.stop(first["id"], 5)
    second = await manager.start({"argv": python(SLEEP), "port": port})
    assert second["port"] == port


async def test_a_reserved_port_is_refused(data_dir: Path, models_dir: Path) -> None:
    reserved = free_port()
    manager = ProcessManager(data_dir, [models_dir], reserved_ports=[reserved])
    try:
        with pytest.raises(AgentError) as refused:
            await manager.start({"argv": python(SLEEP), "port": reserved})
    finally:
        await manager.close()

    assert (refused.value.status, refused.value.code) == (409, "port_in_use")
    assert refused.value.message == f"port {reserved} is reserved for another program on this node"


async def test_a_port_bound_outside_the_agent_is_refused(manager: ProcessManager) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]

        with pytest.raises(AgentError) as refused:
            await manager.start({"argv": python(SLEEP), "port": port})

    assert (refused.value.status, refused.value.code) == (409, "port_in_use")
    assert refused.value.message.startswith(f"port {port} is not free on 127.0.0.1: ")
    assert manager.list() == []


async def test_a_cwd_outside_the_allowed_dirs_is_refused(
    manager: ProcessManager, tmp_path: Path, data_dir: Path
) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    before = children()

    with pytest.raises(AgentError) as refused:
        await manager.start({"argv": python(SLEEP), "cwd": str(outside)})

    assert (refused.value.status, refused.value.code) == (403, "path_not_allowed")
    assert str(outside) in refused.value.message
    assert manager.list() == []
    assert children() == before
    assert list((data_dir / "logs").iterdir()) == []


async def test_a_cwd_that_is_not_a_directory_is_refused(
    manager: ProcessManager, models_dir: Path
) -> None:
    missing = models_dir / "missing"

    with pytest.raises(AgentError) as refused:
        await manager.start({"argv": python(SLEEP), "cwd": str(missing)})

    assert refused.value.message == f"cwd: {missing} is not a directory"
    assert manager.list() == []


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"argv": None}, "argv"),
        ({"argv": []}, "argv"),
        ({"argv": "python -V"}, "argv"),
        ({"argv": [""]}, "argv[0]"),
        ({"argv": [sys.executable, 5]}, "argv[1]"),
        ({"argv": [sys.executable, "a\0b"]}, "argv[1]"),
        ({"env": ["A=1"]}, "env"),
        ({"env": {"": "x"}}, "env"),
        ({"env": {"A=B": "x"}}, "env"),
        ({"env": {"A": 1}}, "env.A"),
        ({"env": {"A": "x\0"}}, "env.A"),
        ({"cwd": 5}, "cwd"),
        ({"cwd": ""}, "cwd"),
        ({"port": 0}, "port"),
        ({"port": 65536}, "port"),
        ({"port": "8080"}, "port"),
        ({"port": True}, "port"),
        ({"port": 8080.0}, "port"),
        ({"name": 5}, "name"),
        ({"name": "n" * 201}, "name"),
        ({"model": "tiny"}, "model"),
        ({"model": {}}, "model.id"),
        ({"model": {"id": ""}}, "model.id"),
        ({"model": {"id": "m", "runtime": 5}}, "model.runtime"),
        ({"model": {"id": "m", "digest": ["sha256:0"]}}, "model.digest"),
        ({"model": {"id": "m", "health_path": "health"}}, "model.health_path"),
        ({"model": {"id": "m", "size": 1}}, "model.size"),
        ({"resources": [1]}, "resources"),
        ({"resources": {"cpu_count": -1}}, "resources.cpu_count"),
        ({"resources": {"cpu_count": "2"}}, "resources.cpu_count"),
        ({"resources": {"memory_bytes": 1.5}}, "resources.memory_bytes"),
        ({"resources": {"memory_bytes": -1}}, "resources.memory_bytes"),
        ({"resources": {"gpus": "0"}}, "resources.gpus"),
        ({"resources": {"gpus": [0, 0]}}, "resources.gpus"),
        ({"resources": {"gpus": [-1]}}, "resources.gpus"),
        ({"resources": {"disk": 1}}, "resources.disk"),
        ({"grace": 5}, "grace"),
    ],
)
async def test_a_bad_spec_is_refused_naming_the_field_and_nothing_is_started(
    manager: ProcessManager, data_dir: Path, tmp_path: Path, spec: dict[str, Any], field: str
) -> None:
    # Were the command run, it would leave this file behind.
    marker = tmp_path / "ran"
    before = children()

    with pytest.raises(AgentError) as refused:
        await manager.start({"argv": python(f"open({str(marker)!r}, 'w')"), **spec})

    assert (refused.value.status, refused.value.code) == (400, "invalid_request")
    assert refused.value.message.startswith(f"{field}: ")
    assert manager.list() == []
    assert children() == before
    assert not marker.exists()
    assert list((data_dir / "logs").iterdir()) == []
    assert not (data_dir / "processes.json").exists()


async def test_a_spec_that_is_not_an_object_is_refused(manager: ProcessManager) -> None:
    with pytest.raises(AgentError) as refused:
        await manager.start(["python"])  # type: ignore[arg-type]

    assert refused.value.message == "body: must be a JSON object"


async def test_a_missing_executable_is_refused_and_nothing_is_recorded(
    manager: ProcessManager, data_dir: Path
) -> None:
    with pytest.raises(AgentError) as refused:
        await manager.start({"argv": ["nexus-no-such-command", "--serve"]})

    assert (refused.value.status, refused.value.code) == (400, "invalid_request")
    assert refused.value.message == "argv[0]: nexus-no-such-command not found"
    assert manager.list() == []
    assert list((data_dir / "logs").iterdir()) == []
    assert not (data_dir / "processes.json").exists()


async def test_recover_re_adopts_a_live_process_and_marks_a_vanished_one_lost(
    data_dir: Path, saved: Callable[[], dict[str, dict[str, Any]]]
) -> None:
    # Given an agent that started two processes and then went away, leaving them running,
    first = ProcessManager(data_dir, [])
    live = await first.start({"argv": python(SLEEP), "name": "live"})
    vanished = await first.start({"argv": python(SLEEP), "name": "vanished"})
    await logged(first, vanished["id"], "ready")
    await first.close()
    # and one of them ended while no agent watched it,
    os.killpg(vanished["pid"], signal.SIGKILL)
    await eventually(lambda: gone(vanished["pid"]), timeout_s=WAIT_S, what="the process ends")

    # when a new agent recovers,
    second = ProcessManager(data_dir, [])
    try:
        second.recover()

        # then the live one is running still, and the other is lost (not forgotten).
        assert second.get(live["id"]) == live
        lost = second.get(vanished["id"])
        assert (lost["state"], lost["exit_code"], lost["message"]) == ("lost", None, LOST_MESSAGE)
        assert lost["log_tail"] == "ready\n"
        assert lost["ended_at"] is not None
        assert saved()[vanished["id"]]["state"] == "lost"
        assert [record["id"] for record in second.running()] == [live["id"]]

        # When the re-adopted one ends too, the new agent notices it by itself.
        os.killpg(live["pid"], signal.SIGKILL)
        await eventually(
            lambda: saved()[live["id"]]["state"] == "lost", timeout_s=WAIT_S, what="recorded lost"
        )
        assert second.get(live["id"])["message"] == LOST_MESSAGE
    finally:
        await second.close()


async def test_recover_does_not_adopt_a_process_that_reuses_a_recorded_pid(
    data_dir: Path, saved: Callable[[], dict[str, dict[str, Any]]]
) -> None:
    first = ProcessManager(data_dir, [])
    record = await first.start({"argv": python(SLEEP)})
    await first.close()
    # The recorded start time differs from the live process's: the pid now names another process.
    records = saved()
    records[record["id"]]["create_time"] -= 3600
    (data_dir / "processes.json").write_text(json.dumps({"processes": list(records.values())}))

    second = ProcessManager(data_dir, [])
    try:
        second.recover()

        assert second.get(record["id"])["state"] == "lost"
        assert not gone(record["pid"])
    finally:
        # kill_all would spare it, trusting the (doctored) record.
        os.killpg(record["pid"], signal.SIGKILL)


async def test_a_re_adopted_process_can_be_stopped(data_dir: Path) -> None:
    first = ProcessManager(data_dir, [])
    record = await first.start({"argv": python(TRAP_SIGTERM)})
    await logged(first, record["id"], "ready")
    await first.close()

    second = ProcessManager(data_dir, [])
    try:
        second.recover()
        stopped = await second.stop(record["id"], 5)
    finally:
        await second.close()

    assert (stopped["state"], stopped["exit_code"]) == ("stopped", None)
    assert stopped["message"] == UNKNOWN_EXIT_MESSAGE
    assert stopped["log_tail"] == "ready\nbye\n"


async def test_recover_without_a_record_starts_empty(data_dir: Path) -> None:
    manager = ProcessManager(data_dir, [])

    manager.recover()

    assert manager.list() == []


async def test_close_leaves_the_processes_running(manager: ProcessManager) -> None:
    record = await manager.start({"argv": python(SLEEP)})

    await manager.close()

    assert not gone(record["pid"])


async def test_kill_all_kills_every_process_group_the_agent_started(
    manager: ProcessManager, data_dir: Path
) -> None:
    code = """
        import subprocess, time
        child = subprocess.Popen(["sleep", "60"])
        print("child", child.pid)
        time.sleep(60)
    """
    parent = await manager.start({"argv": python(code)})
    other = await manager.start({"argv": python(SLEEP)})
    await logged(manager, parent["id"], "child ")
    grandchild = int(manager.log_tail(parent["id"], 1).split()[1])

    kill_all(data_dir)

    assert gone(parent["pid"])
    assert gone(other["pid"])
    await eventually(lambda: gone(grandchild), timeout_s=WAIT_S, what="the grandchild ends")
    assert (await ended(manager, parent["id"]))["exit_code"] == -signal.SIGKILL
