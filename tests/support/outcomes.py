"""Measured outcomes of the fault tests: shown with `pytest -s`, kept for docs/reliability.md."""

from __future__ import annotations

import json
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
