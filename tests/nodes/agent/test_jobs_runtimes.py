"""The runtime table: where each runtime is installed and the argv that serves a model (pure)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from nodes.agent.download import amount
from nodes.agent.runtimes import (
    STAMP_FILE,
    RuntimeSpec,
    installed,
    pip_build,
    serve_argv,
    serve_env,
)

DATA = Path("/data")
MODEL = Path("/data/models/model.gguf")
LISTEN = ["--host", "127.0.0.1", "--port", "${PORT}"]


def test_the_simulator_needs_no_install_and_serves_the_model_name() -> None:
    runtime = RuntimeSpec("simulator")

    assert runtime.venv(DATA) is None
    assert runtime.requirements() == ()
    # The agent's own interpreter, filled in when the process starts.
    assert serve_argv(runtime, None, MODEL, "demo") == [
        "${NEXUS_PYTHON}",
        *("-m", "serving.runtimes.simulator", *LISTEN, "--model", "demo"),
    ]


def test_llama_cpp_runs_its_server_module_from_its_environment() -> None:
    runtime = RuntimeSpec("llama-cpp")
    venv = DATA / "runtimes" / "llama-cpp"

    assert runtime.venv(DATA) == venv
    assert runtime.requirements() == ("llama-cpp-python[server]",)
    assert serve_argv(runtime, venv, MODEL, "demo") == [
        str(venv / "bin" / "python"),
        *("-m", "llama_cpp.server", "--model", str(MODEL), "--model_alias", "demo", *LISTEN),
        *("--interrupt_requests", "false"),
    ]


def test_llama_cpp_is_built_for_any_x86_64_unless_the_node_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    portable = {"CMAKE_ARGS": "-DGGML_NATIVE=OFF"}
    assert RuntimeSpec("llama-cpp").build_env() == portable
    assert RuntimeSpec("simulator").build_env() == {}

    monkeypatch.delenv("CMAKE_ARGS", raising=False)
    # Built afresh: pip's wheel cache would hand back a native wheel built before.
    assert pip_build(portable) == (["--no-cache-dir"], portable)
    assert pip_build({}) == ([], {})
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_CUDA=on")
    assert pip_build(portable) == (["--no-cache-dir"], {"CMAKE_ARGS": "-DGGML_CUDA=on"})


def test_an_environment_built_with_other_flags_is_not_taken_as_installed(tmp_path: Path) -> None:
    requirements = ["llama-cpp-python[server]"]
    # What an agent before the portable build wrote: its native build is built again.
    (tmp_path / STAMP_FILE).write_text(json.dumps({"requirements": requirements}))
    assert installed(tmp_path, requirements)
    assert not installed(tmp_path, requirements, {"CMAKE_ARGS": "-DGGML_NATIVE=OFF"})


def test_vllm_serves_the_model_under_its_name() -> None:
    runtime = RuntimeSpec("vllm")
    venv = DATA / "runtimes" / "vllm"

    assert runtime.venv(DATA) == venv
    assert runtime.requirements() == ("vllm",)
    # `vllm` resolves to the environment's own: serve_env puts its bin first on PATH.
    assert serve_argv(runtime, venv, MODEL, "demo") == [
        *("vllm", "serve", str(MODEL), *LISTEN, "--served-model-name", "demo"),
    ]


def test_sglang_launches_its_server_with_the_model_path() -> None:
    runtime = RuntimeSpec("sglang")
    venv = DATA / "runtimes" / "sglang"

    assert runtime.venv(DATA) == venv
    assert serve_argv(runtime, venv, MODEL, "demo") == [
        *("python3", "-m", "sglang.launch_server", "--model-path", str(MODEL)),
        *(*LISTEN, "--served-model-name", "demo"),
    ]


def test_a_custom_command_gets_the_model_path_and_name_and_keeps_the_port_for_later() -> None:
    runtime = RuntimeSpec(
        "custom", argv=("/opt/serve", "--model=${MODEL_PATH}", "${MODEL_NAME}", ":${PORT}")
    )

    assert runtime.venv(DATA) is None
    assert serve_argv(runtime, None, MODEL, "demo") == [
        "/opt/serve",
        f"--model={MODEL}",
        "demo",
        ":${PORT}",
    ]


def test_a_custom_requirement_gets_an_environment_of_its_own(tmp_path: Path) -> None:
    requirement = "mlc-llm==0.1"
    runtime = RuntimeSpec("custom", requirement=requirement, argv=("mlc_llm", "serve", "${PORT}"))
    venv = tmp_path / "runtimes" / f"custom-{hashlib.sha256(requirement.encode()).hexdigest()[:12]}"
    other = RuntimeSpec("custom", requirement="mlc-llm==0.2", argv=runtime.argv)

    assert runtime.venv(tmp_path) == venv
    assert other.venv(tmp_path) != venv
    assert runtime.requirements() == (requirement,)
    # A bare command the requirement installed runs from the environment...
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "mlc_llm").touch()
    assert serve_argv(runtime, venv, MODEL, "demo")[0] == str(venv / "bin" / "mlc_llm")
    assert serve_env(venv)["VIRTUAL_ENV"] == str(venv)
    assert serve_env(venv)["PATH"].startswith(f"{venv / 'bin'}:")
    # ...and one it did not install is left to PATH.
    plain = RuntimeSpec("custom", requirement=requirement, argv=("java", "${PORT}"))
    assert serve_argv(plain, venv, MODEL, "demo")[0] == "java"


@pytest.mark.parametrize(
    ("name", "timeout"),
    [("simulator", 120), ("custom", 120), ("llama-cpp", 600), ("vllm", 1800), ("sglang", 1800)],
)
def test_each_runtime_has_a_bounded_time_to_list_its_model(name: str, timeout: float) -> None:
    assert RuntimeSpec(name).ready_timeout_s() == timeout


@pytest.mark.parametrize(
    ("done", "total", "text"),
    [
        (12 * 2**20, 48 * 2**20, "12.0 of 48.0 MiB"),
        (512, 2048, "0.5 of 2.0 KiB"),
        (3 * 2**30, None, "3.0 GiB"),
        (10, 100, "10 of 100 B"),
    ],
)
def test_progress_reads_in_the_unit_of_the_total(done: int, total: int | None, text: str) -> None:
    assert amount(done, total) == text
