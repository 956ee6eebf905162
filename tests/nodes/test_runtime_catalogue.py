"""Runtime variants: defaults, built commands and the variables each one honours."""

from __future__ import annotations

import pytest

from nodes.runtimes import (
    RUNTIME_NAMES,
    RUNTIMES,
    RuntimeVariantError,
    build_command,
    build_environ,
    runtime,
)
from serving.runtimes.simulator.config import SimulatorConfig, parse_args

KNOWN = "vllm, sglang, nim, modular-max, llama-cpp, custom, simulator"
LISTEN = ["--host", "127.0.0.1", "--port", "8123"]


def command(name: str, **env: str) -> list[str]:
    return build_command(name, model_path="/models/llama", model_name="llama", port=8123, env=env)


@pytest.mark.parametrize(
    ("name", "label", "port", "health_path"),
    [
        ("vllm", "vLLM", 8000, "/health"),
        ("sglang", "SGLang", 9001, "/health"),
        ("nim", "NVIDIA NIM", 8000, "/v1/health/ready"),
        ("modular-max", "Modular MAX", 8000, "/health"),
        ("llama-cpp", "llama.cpp", 8080, "/openapi.json"),
        ("custom", "Custom", 8000, "/health"),
        ("simulator", "Simulator", 9101, "/health"),
    ],
)
def test_each_variant_fixes_its_port_and_health_path(name, label, port, health_path):
    chosen = runtime(name)

    assert (chosen.label, chosen.port, chosen.health_path) == (label, port, health_path)


def test_the_variants_are_the_seven_in_launcher_order():
    assert ", ".join(RUNTIME_NAMES) == KNOWN
    assert list(RUNTIMES) == list(RUNTIME_NAMES)


@pytest.mark.parametrize("name", ["vLLM", "tgi", "", "llama.cpp"])
def test_an_unknown_name_is_refused_with_the_known_ones(name):
    with pytest.raises(RuntimeVariantError) as caught:
        runtime(name)

    assert str(caught.value) == f"unknown runtime variant {name!r}; known: {KNOWN}"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "vllm",
            ["vllm", "serve", "/models/llama", *LISTEN, "--served-model-name", "llama"],
        ),
        (
            "sglang",
            [
                *("python3", "-m", "sglang.launch_server", "--model-path", "/models/llama"),
                *LISTEN,
                *("--served-model-name", "llama"),
            ],
        ),
        ("nim", ["/opt/nim/start_server.sh"]),
        ("modular-max", ["max", "serve", "--model-path", "/models/llama"]),
        (
            "llama-cpp",
            [
                *("${NEXUS_PYTHON}", "-m", "llama_cpp.server", "--model", "/models/llama"),
                *("--model_alias", "llama", *LISTEN, "--interrupt_requests", "false"),
            ],
        ),
        (
            "simulator",
            ["${NEXUS_PYTHON}", "-m", "serving.runtimes.simulator", *LISTEN, "--model", "llama"],
        ),
    ],
)
def test_each_variant_builds_its_command_listening_on_loopback(name, expected):
    assert command(name) == expected


VLLM_BASE = ["vllm", "serve", "/models/llama", *LISTEN, "--served-model-name"]
SGLANG_BASE = [
    *("python3", "-m", "sglang.launch_server", "--model-path", "/models/llama"),
    *LISTEN,
    "--served-model-name",
]


@pytest.mark.parametrize(
    ("name", "env", "expected"),
    [
        ("vllm", {"BACKEND_MODEL_NAME": "chat"}, [*VLLM_BASE, "chat"]),
        ("vllm", {"VLLM_TP_SIZE": "2"}, [*VLLM_BASE, "llama", "--tensor-parallel-size", "2"]),
        ("vllm", {"VLLM_PP_SIZE": "4"}, [*VLLM_BASE, "llama", "--pipeline-parallel-size", "4"]),
        ("vllm", {"VLLM_QUANTIZATION": "awq"}, [*VLLM_BASE, "llama", "--quantization", "awq"]),
        (
            "vllm",
            {"VLLM_EXTRA_ARGS": "--max-model-len 8192 --chat-template '/t/a b.jinja'"},
            [*VLLM_BASE, "llama", "--max-model-len", "8192", "--chat-template", "/t/a b.jinja"],
        ),
        (
            "vllm",
            {
                "VLLM_EXTRA_ARGS": "--enforce-eager",
                "VLLM_QUANTIZATION": "fp8",
                "VLLM_PP_SIZE": "2",
                "VLLM_TP_SIZE": "4",
                "BACKEND_MODEL_NAME": "chat",
            },
            [
                *VLLM_BASE,
                "chat",
                *("--tensor-parallel-size", "4", "--pipeline-parallel-size", "2"),
                *("--quantization", "fp8", "--enforce-eager"),
            ],
        ),
        (
            "vllm",
            {"VLLM_TP_SIZE": " 02 ", "VLLM_QUANTIZATION": " "},
            [*VLLM_BASE, "llama", "--tensor-parallel-size", "2"],
        ),
        ("vllm", {"VLLM_TP_SIZE": "", "BACKEND_MODEL_NAME": ""}, [*VLLM_BASE, "llama"]),
        ("vllm", {"SGLANG_TP_SIZE": "2"}, [*VLLM_BASE, "llama"]),
        ("sglang", {"BACKEND_MODEL_NAME": "chat"}, [*SGLANG_BASE, "chat"]),
        ("sglang", {"SGLANG_TP_SIZE": "2"}, [*SGLANG_BASE, "llama", "--tp-size", "2"]),
        ("sglang", {"SGLANG_PP_SIZE": "2"}, [*SGLANG_BASE, "llama", "--pp-size", "2"]),
        (
            "sglang",
            {"SGLANG_QUANTIZATION": "gptq"},
            [*SGLANG_BASE, "llama", "--quantization", "gptq"],
        ),
        (
            "sglang",
            {"SGLANG_EXTRA_ARGS": "--context-length 4096"},
            [*SGLANG_BASE, "llama", "--context-length", "4096"],
        ),
        ("sglang", {"VLLM_TP_SIZE": "2"}, [*SGLANG_BASE, "llama"]),
        (
            "llama-cpp",
            {"BACKEND_MODEL_NAME": "chat"},
            [
                *("${NEXUS_PYTHON}", "-m", "llama_cpp.server", "--model", "/models/llama"),
                *("--model_alias", "chat", *LISTEN, "--interrupt_requests", "false"),
            ],
        ),
        (
            "simulator",
            {"BACKEND_MODEL_NAME": "chat"},
            ["${NEXUS_PYTHON}", "-m", "serving.runtimes.simulator", *LISTEN, "--model", "chat"],
        ),
    ],
    ids=lambda value: repr(value) if isinstance(value, dict) else str(value)[:20],
)
def test_the_command_honours_the_variants_variables(name, env, expected):
    assert command(name, **env) == expected


@pytest.mark.parametrize(
    ("name", "env", "message"),
    [
        ("vllm", {"VLLM_TP_SIZE": "two"}, "VLLM_TP_SIZE must be a positive integer, not 'two'"),
        ("vllm", {"VLLM_TP_SIZE": "0"}, "VLLM_TP_SIZE must be a positive integer, not '0'"),
        ("vllm", {"VLLM_PP_SIZE": "-1"}, "VLLM_PP_SIZE must be a positive integer, not '-1'"),
        ("vllm", {"VLLM_PP_SIZE": "1.5"}, "VLLM_PP_SIZE must be a positive integer, not '1.5'"),
        ("vllm", {"VLLM_EXTRA_ARGS": "--x 'y"}, "VLLM_EXTRA_ARGS has an unbalanced quote"),
        (
            "vllm",
            {"VLLM_EXTRA_ARGS": "--x \\"},
            "VLLM_EXTRA_ARGS has a lone backslash at the end",
        ),
        ("vllm", {"VLLM_TP_SIZE": "²"}, "VLLM_TP_SIZE must be a positive integer, not '²'"),
        ("sglang", {"SGLANG_TP_SIZE": "x"}, "SGLANG_TP_SIZE must be a positive integer, not 'x'"),
        ("sglang", {"SGLANG_PP_SIZE": "0"}, "SGLANG_PP_SIZE must be a positive integer, not '0'"),
        ("sglang", {"SGLANG_EXTRA_ARGS": '"'}, "SGLANG_EXTRA_ARGS has an unbalanced quote"),
        (
            "custom",
            {},
            "the Custom runtime has no built-in command; "
            "give a start command or a model-definition.yaml",
        ),
        ("tgi", {}, f"unknown runtime variant 'tgi'; known: {KNOWN}"),
    ],
    ids=lambda value: str(value)[:30],
)
def test_a_variable_the_command_cannot_use_is_refused(name, env, message):
    with pytest.raises(RuntimeVariantError) as caught:
        command(name, **env)

    assert str(caught.value) == message


def test_the_port_may_be_the_placeholder_the_agent_fills_in():
    argv = build_command("vllm", model_path="/m", model_name="m", port="${PORT}", env={})

    assert argv[argv.index("--port") + 1] == "${PORT}"


def test_a_variant_object_works_as_well_as_its_name():
    assert build_command(RUNTIMES["vllm"], model_path="/m", model_name="m", port=1, env={}) == (
        build_command("vllm", model_path="/m", model_name="m", port=1, env={})
    )


@pytest.mark.parametrize(
    ("name", "env", "expected"),
    [
        (
            "nim",
            {"NGC_API_KEY": "k"},
            {"NGC_API_KEY": "k", "NIM_SERVER_PORT": "8123", "NIM_SERVED_MODEL_NAME": "llama"},
        ),
        (
            "nim",
            {"BACKEND_MODEL_NAME": "chat", "NIM_SERVER_PORT": "1"},
            {
                "BACKEND_MODEL_NAME": "chat",
                "NIM_SERVER_PORT": "8123",
                "NIM_SERVED_MODEL_NAME": "chat",
            },
        ),
        (
            "modular-max",
            {"HF_TOKEN": "t"},
            {"HF_TOKEN": "t", "MAX_SERVE_HOST": "127.0.0.1", "MAX_SERVE_PORT": "8123"},
        ),
        ("vllm", {"VLLM_TP_SIZE": "2"}, {"VLLM_TP_SIZE": "2"}),
        ("custom", {"A": "1"}, {"A": "1"}),
    ],
)
def test_the_environ_adds_what_the_server_reads_its_port_and_name_from(name, env, expected):
    environ = build_environ(
        name, model_path="/models/llama", model_name="llama", port=8123, env=env
    )

    assert environ == expected


def test_the_vllm_and_sglang_variants_list_the_reference_variables():
    assert list(runtime("vllm").env_vars) == [
        "BACKEND_MODEL_NAME",
        "VLLM_QUANTIZATION",
        "VLLM_TP_SIZE",
        "VLLM_PP_SIZE",
        "VLLM_EXTRA_ARGS",
    ]
    assert list(runtime("sglang").env_vars) == [
        "BACKEND_MODEL_NAME",
        "SGLANG_QUANTIZATION",
        "SGLANG_TP_SIZE",
        "SGLANG_PP_SIZE",
        "SGLANG_EXTRA_ARGS",
    ]
    assert all(meaning for meaning in runtime("vllm").env_vars.values())


def test_the_simulator_command_is_one_its_own_parser_accepts():
    argv = build_command("simulator", model_path="-", model_name="demo", port=9200, env={})

    config = parse_args(argv[3:])

    assert (config.host, config.port, config.model) == ("127.0.0.1", 9200, "demo")
    assert runtime("simulator").port == SimulatorConfig().port


def test_to_dict_describes_the_variant():
    assert runtime("custom").to_dict() == {
        "name": "custom",
        "label": "Custom",
        "port": 8000,
        "health_path": "/health",
        "env_vars": {},
        "has_command": False,
        "multi_node": False,
        "parameter_tabs": [],
    }
    vllm = runtime("vllm").to_dict()
    assert (vllm["has_command"], vllm["multi_node"]) == (True, True)
    assert vllm["parameter_tabs"] == [
        "Model Loading",
        "Resource Memory",
        "Serving Performance",
        "Multimodal",
        "Tool Reasoning",
    ]
