"""Longest modules first: what each test module took last time it was measured, to order the run.

pytest-xdist hands work out in collection order (with `--no-loadscope-reorder`; by default it
puts the groups with the most tests first), so a module that takes half a minute but holds two
tests used to start near the end and run alone while the other workers sat idle: on the 2-core
machine the side-by-side pass ended with one worker busy for 30-40 s. Sorted longest first, the
long modules start early and the many short tests fill the end.

tests/durations.json maps each module (its path under the repository) to the seconds its tests
took, setup and teardown included, as measured by `make test-durations`. Only the order depends
on it: a module it does not name (a new one) goes last, and a stale figure costs time, not a
result.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS_PATH = Path(__file__).resolve().parents[1] / "durations.json"


def module_of(nodeid: str) -> str:
    """Return the module path of a test's node id (xdist's `@group` suffix aside)."""
    return nodeid.split("::", 1)[0]


def longest_modules_first(items: list[pytest.Item], seconds: dict[str, float]) -> None:
    """Sort the items by their module's recorded seconds, longest first, in place; the sort is
    stable, so each module's tests (and the modules nothing is known of) keep their order."""
    items.sort(key=lambda item: -seconds.get(module_of(item.nodeid), 0.0))


def read(path: Path = DURATIONS_PATH) -> dict[str, float]:
    if not path.exists():
        return {}
    return {str(module): float(s) for module, s in json.loads(path.read_text()).items()}


class Recorder:
    """Adds up each module's reported durations (on xdist's controller, which gets every
    worker's reports) and adds them to the file's figures at the end: `make test-durations`
    empties the file, then its three passes each add theirs (a module may have tests in all)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: defaultdict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[module_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput"):
            return  # a worker: the controller writes
        merged = read(self.path)
        for module, seconds in self.seconds.items():
            merged[module] = round(merged.get(module, 0.0) + seconds, 1)
        ordered = dict(sorted(merged.items(), key=lambda pair: (-pair[1], pair[0])))
        self.path.write_text(json.dumps(ordered, indent=1) + "\n")
