"""The vLLM and SGLang parameter tabs: every field is a real flag of the pinned server version,
values are checked before anything runs, and multi-node replicas get the servers' own options."""

from __future__ import annotations

import pytest

from nodes.runtimes import (
    PARAMETER_TABLES,
    ParameterError,
    build_cluster,
    build_command,
    checked_parameters,
    concurrency_of,
    fill_cluster_placeholders,
)
from nodes.runtimes.parameters import SGLANG_PARAMETERS, VLLM_PARAMETERS, recorded_flags

LISTEN = ["--host", "127.0.0.1", "--port", "${PORT}"]


@pytest.mark.parametrize("table", PARAMETER_TABLES.values(), ids=lambda table: table.runtime)
def test_every_flag_of_the_tabs_is_one_the_pinned_version_defines(table) -> None:
    # The recorded list was extracted from the version's own argument definitions.
    recorded = recorded_flags(table)

    assert table.flags_file.name == f"{table.runtime}-{table.version}.txt"
    assert len(recorded) > 300, "the recorded list is the whole parser, not a few names"
    assert [flag for flag in table.all_flags() if flag not in recorded] == []


def test_the_tabs_are_the_documents_in_its_order() -> None:
    assert VLLM_PARAMETERS.tabs == (
        "Model Loading",
        "Resource Memory",
        "Serving Performance",
        "Multimodal",
        "Tool Reasoning",
    )
    assert SGLANG_PARAMETERS.tabs == (
        "Model Loading",
        "Resource Memory",
        "Serving Performance",
        "Tool Reasoning",
    )
    model_loading = [p.label for p in VLLM_PARAMETERS.in_tab("Model Loading")]
    assert model_loading == [
        "Model",
        "DType",
        "Quantization",
        "Max Model Length",
        "Served Model Name",
        "Trust Remote Code",
    ]
    assert [p.label for p in SGLANG_PARAMETERS.in_tab("Model Loading")][3] == "Context Length"
    assert all(VLLM_PARAMETERS.in_tab(tab) for tab in VLLM_PARAMETERS.tabs)


def test_parameters_become_the_servers_flags_before_the_extra_arguments() -> None:
    values = checked_parameters(
        "vllm",
        {
            "dtype": "bfloat16",
            "max_num_seqs": "64",
            "gpu_memory_utilization": "0.85",
            "enable_prefix_caching": "off",
            "trust_remote_code": "true",
            "tool_call_parser": "hermes",
            "served_model_name": "chat",
            "max_model_len": "",
        },
    )

    argv = build_command(
        "vllm",
        model_path="/models",
        model_name="llama",
        port="${PORT}",
        env={"VLLM_EXTRA_ARGS": "--max-num-seqs 32"},
        parameters=values,
    )

    assert argv == [
        *("vllm", "serve", "/models", *LISTEN, "--served-model-name", "chat"),
        *("--dtype", "bfloat16", "--trust-remote-code"),
        *("--gpu-memory-utilization", "0.85", "--max-num-seqs", "64"),
        "--no-enable-prefix-caching",
        *("--tool-call-parser", "hermes"),
        *("--max-num-seqs", "32"),
    ]
    # The extra arguments come last, so the server runs with what they say.
    assert concurrency_of("vllm", argv) == 32


def test_sglang_takes_its_own_flags_and_an_off_switch_is_left_out() -> None:
    values = checked_parameters(
        "sglang",
        {"model": "/models/qwen", "context_length": "4096", "disable_radix_cache": "false"},
    )

    argv = build_command(
        "sglang", model_path="/models", model_name="qwen", port="${PORT}", env={}, parameters=values
    )

    assert argv == [
        *("python3", "-m", "sglang.launch_server", "--model-path", "/models/qwen", *LISTEN),
        *("--served-model-name", "qwen", "--context-length", "4096"),
    ]
    assert concurrency_of("sglang", argv) is None


@pytest.mark.parametrize(
    ("runtime", "values", "message"),
    [
        (
            "vllm",
            {"max_num_seqs": "many"},
            "max_num_seqs: must be an integer of at least 1, not 'many'",
        ),
        ("vllm", {"max_num_seqs": "0"}, "max_num_seqs: must be an integer of at least 1, not '0'"),
        ("vllm", {"max_num_seqs": "٣"}, "max_num_seqs: must be an integer of at least 1, not '٣'"),
        (
            "vllm",
            {"gpu_memory_utilization": "1.5"},
            "gpu_memory_utilization: must be a number from 0.01 to 1, not '1.5'",
        ),
        (
            "vllm",
            {"gpu_memory_utilization": "nan"},
            "gpu_memory_utilization: must be a number from 0.01 to 1, not 'nan'",
        ),
        (
            "vllm",
            {"dtype": "float64"},
            "dtype: must be one of: auto, half, float16, bfloat16, float, float32; not 'float64'",
        ),
        (
            "vllm",
            {"trust_remote_code": "maybe"},
            "trust_remote_code: must be true or false, not 'maybe'",
        ),
        (
            "vllm",
            {"quantization": "awq --api-key x"},
            "quantization: must be one word (letters, digits, _ - .), not 'awq --api-key x'",
        ),
        (
            "vllm",
            {"context_length": "4096"},
            "context_length: unknown parameter for vllm; known: "
            + ", ".join(VLLM_PARAMETERS.by_key),
        ),
        ("vllm", {"max_num_seqs": 64}, 'max_num_seqs: must be a string (quote numbers: "0.9")'),
        ("llama-cpp", {"dtype": "auto"}, "dtype: the llama.cpp runtime takes no parameters"),
    ],
)
def test_a_value_the_server_would_refuse_is_refused_naming_the_parameter(
    runtime: str, values: dict[str, object], message: str
) -> None:
    with pytest.raises(ParameterError) as refused:
        checked_parameters(runtime, values)

    assert str(refused.value) == message


def test_a_vllm_cluster_is_a_ray_head_serving_across_ray_workers() -> None:
    main, worker = build_cluster(
        "vllm",
        size=3,
        model_path="/models",
        model_name="big",
        port="${PORT}",
        env={"VLLM_TP_SIZE": "2", "VLLM_PP_SIZE": "3"},
    )

    assert main.argv == [
        *("vllm", "serve", "/models", *LISTEN, "--served-model-name", "big"),
        *("--tensor-parallel-size", "2", "--pipeline-parallel-size", "3"),
        *("--distributed-executor-backend", "ray"),
    ]
    head = ["ray", "start", "--head", "--node-ip-address", "${MAIN_HOST}", "--port", "${DIST_PORT}"]
    assert main.pre_start_actions == [{"action": "run_command", "args": {"command": head}}]
    assert worker.argv == ["ray", "start", "--block", "--address", "${MAIN_HOST}:${DIST_PORT}"]
    assert worker.pre_start_actions == []
    filled = fill_cluster_placeholders(worker.argv, main_host="10.0.0.5", rank=2, dist_port=6379)
    assert filled[-1] == "10.0.0.5:6379"


def test_sglang_and_the_simulator_name_the_size_rank_and_main_address() -> None:
    distributed = ["--nnodes", "2", "--node-rank", "${NODE_RANK}"]
    distributed += ["--dist-init-addr", "${MAIN_HOST}:${DIST_PORT}"]
    main, worker = build_cluster(
        "sglang", size=2, model_path="/models", model_name="m", port="${PORT}", env={}
    )
    sim_main, sim_worker = build_cluster(
        "simulator", size=2, model_path="/models", model_name="m", port="${PORT}", env={}
    )

    assert main.argv == worker.argv
    assert main.argv[-6:] == distributed
    assert sim_main.argv[-6:] == distributed
    # A simulator worker serves no HTTP: no port of its own.
    assert sim_worker.argv == [
        *("${NEXUS_PYTHON}", "-m", "serving.runtimes.simulator", "--model", "m", *distributed)
    ]
    assert fill_cluster_placeholders(sim_main.argv, main_host="127.0.0.1", rank=0, dist_port=None)[
        -2:
    ] == ["--dist-init-addr", "127.0.0.1:${DIST_PORT}"]


@pytest.mark.parametrize(
    ("runtime", "argv", "expected"),
    [
        ("simulator", ["x", "--concurrency", "3"], 3),
        ("simulator", ["x"], 8),
        ("vllm", ["vllm", "serve", "--max-num-seqs=16"], 16),
        ("llama-cpp", ["python", "-m", "llama_cpp.server"], 1),
        ("custom", ["anything"], None),
    ],
)
def test_the_real_concurrency_is_read_from_the_command(runtime, argv, expected) -> None:
    assert concurrency_of(runtime, argv) == expected
