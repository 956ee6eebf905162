"""daphne writes no line per request unless NEXUS_ACCESS_LOG asks for one (issue: CPU on the hot
path, and the history records every gateway request already)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.http import LOOPBACK
from tests.support.live import running_nexus


@pytest.mark.parametrize(("setting", "logged"), [("false", False), ("true", True)])
def test_daphne_logs_a_line_per_request_only_when_asked(
    committed_db: None, tmp_path: Path, setting: str, logged: bool
) -> None:
    # Unbuffered: daphne's access log goes to stdout, which a stop by signal would not flush.
    with running_nexus(tmp_path, NEXUS_ACCESS_LOG=setting, PYTHONUNBUFFERED="1") as server:
        for _ in range(3):
            assert (
                LOOPBACK.get(f"{server.url}/healthz?probe=access-log", timeout=5).status_code == 200
            )
        server.stop()  # the log is complete once the process is gone
        log = server.log()

    assert ("/healthz?probe=access-log" in log) is logged, log
