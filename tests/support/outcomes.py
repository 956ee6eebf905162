"""Measured outcomes of the fault tests: shown with `pytest -s`, kept for docs/reliability.md."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from django.conf import settings


def record(name: str, outcome: dict[str, Any]) -> None:
    """Write the outcome to stdout and to <data dir>/reliability/<name>.json."""
    text = json.dumps(outcome, sort_keys=True)
    sys.stdout.write(f"\n{name}: {text}\n")
    folder = Path(settings.DATA_DIR) / "reliability"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(text + "\n")


def record_fault(
    fault: str, server: str, sent: int, failed: int, recovery_s: float | None, outcome: str
) -> None:
    """Record one injected fault's row of docs/reliability.md's table.

    sent: requests (or connections) sent during the fault; failed: how many the client saw
    fail; recovery_s: from the fault to normal service again (None: not applicable).
    """
    name = re.sub(r"[^a-z0-9]+", "_", f"{fault} {server}".lower()).strip("_")
    record(
        name,
        {"fault": fault, "server": server, "sent": sent, "failed": failed,
         "recovery_s": None if recovery_s is None else round(recovery_s, 3),
         "outcome": outcome},
    )  # fmt: skip
