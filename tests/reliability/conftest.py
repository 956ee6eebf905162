"""The fault suite: real processes over loopback, every run bounded in time."""

from __future__ import annotations

import pytest

from tests.support import faults


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print every fault's measured outcome as a table (copied into docs/reliability.md)."""
    if faults.measured:
        terminalreporter.section("measured fault outcomes")
        for line in faults.table():
            terminalreporter.write_line(line)
