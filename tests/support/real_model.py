"""The real model for tests marked `llama`: skipped locally when missing, a failure in CI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from serving.real_model import missing_for_real_model, smollm2_gguf


def require_real_model() -> Path:
    """Return the SmolLM2 .gguf file; skip (locally) or fail (CI=true) when it cannot be served.

    `make test` installs both; a developer without them may also deselect with -m "not llama".
    """
    missing = missing_for_real_model()
    if missing:
        message = f"the real-model test needs {missing}; `make test` installs both"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI must run the real-model test: {message}")
        pytest.skip(message)
    path = smollm2_gguf()
    assert path is not None
    return path
