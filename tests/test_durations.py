"""The run's order: the longest modules first, each module's tests in their own order, modules of
unknown length last (tests/support/durations.py), and the recorder that measures them."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from tests.support import durations

pytestmark = pytest.mark.unit


def items(*nodeids: str) -> list[pytest.Item]:
    return [cast("pytest.Item", SimpleNamespace(nodeid=nodeid)) for nodeid in nodeids]


def report(nodeid: str, duration: float) -> pytest.TestReport:
    return cast("pytest.TestReport", SimpleNamespace(nodeid=nodeid, duration=duration))


def session(**config: Any) -> pytest.Session:
    return cast("pytest.Session", SimpleNamespace(config=SimpleNamespace(**config)))


def test_the_longest_modules_go_first_each_keeping_its_tests_in_order() -> None:
    run = items(
        "tests/a.py::test_1",
        "tests/new.py::test_1",
        "tests/b.py::test_1@b.py",
        "tests/a.py::test_2",
        "tests/b.py::test_2@b.py",
        "tests/c.py::test_1",
    )

    durations.longest_modules_first(run, {"tests/a.py": 3.0, "tests/b.py": 30.0, "tests/c.py": 1})

    assert [item.nodeid for item in run] == [
        "tests/b.py::test_1@b.py",
        "tests/b.py::test_2@b.py",
        "tests/a.py::test_1",
        "tests/a.py::test_2",
        "tests/c.py::test_1",
        "tests/new.py::test_1",
    ]


def test_the_recorder_adds_each_modules_seconds_to_the_file(tmp_path: Path) -> None:
    path = tmp_path / "durations.json"
    path.write_text(json.dumps({"tests/a.py": 1.0, "tests/old.py": 4.0}))
    recorder = durations.Recorder(path)
    for nodeid, seconds in (
        ("tests/a.py::test_1", 0.25),
        ("tests/a.py::test_1", 0.5),
        ("tests/b.py::test_1@b.py", 7.0),
    ):
        recorder.pytest_runtest_logreport(report(nodeid, seconds))

    recorder.pytest_sessionfinish(session())

    assert json.loads(path.read_text()) == {
        "tests/b.py": 7.0,
        "tests/old.py": 4.0,
        "tests/a.py": 1.8,
    }
    assert list(durations.read(path)) == ["tests/b.py", "tests/old.py", "tests/a.py"]


def test_a_worker_leaves_the_file_to_the_controller(tmp_path: Path) -> None:
    path = tmp_path / "durations.json"
    recorder = durations.Recorder(path)
    recorder.pytest_runtest_logreport(report("tests/a.py::test_1", 1.0))

    recorder.pytest_sessionfinish(session(workerinput={"workerid": "gw0"}))

    assert not path.exists()
    assert durations.read(path) == {}
