"""Launch specs: what a revision runs, resolved from a runtime variant, a pasted command or the
folder's model definition, with service-definition.toml's defaults; and every way it can fail."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pytest_django.fixtures import Settings

from serving.launch import LaunchError, resolve_launch
from serving.models import ModelFolder

HEALTH_DEFAULTS = {
    "interval": 10.0,
    "max_retries": 10,
    "max_wait_time": 15.0,
    "expected_status_code": 200,
    "initial_delay": 60.0,
}
LISTEN = ["--host", "127.0.0.1", "--port", "${PORT}"]
AGENT_PORT = {"PORT": "${PORT}"}
MODEL_DEFINITION = """\
models:
  - name: simple-http-server
    model_path: /models
    service:
      pre_start_actions:
        - action: mkdir
          args: {path: /home/work/config}
      start_command: ["python", "-m", "http.server", "--directory", "/models", "8001"]
      port: 8001
      health_check:
        path: /
        initial_delay: 5.0
"""
SERVICE_DEFINITION = """\
[vllm.environment]
image = "vllm/vllm-openai:latest"
architecture = "x86_64"

[vllm.resource_slots]
cpu = 2
mem = "8gb"
"cuda.shares" = "0.5"

[vllm.environ]
VLLM_TP_SIZE = "2"
BACKEND_MODEL_NAME = "from-toml"
"""


def health(path: str, **overrides: Any) -> dict[str, Any]:
    return {"path": path, **HEALTH_DEFAULTS, **overrides}


@dataclass(frozen=True)
class Case:
    """Launcher settings for a folder holding `files`, and the spec they resolve to."""

    id: str
    settings: Mapping[str, Any]
    spec: Mapping[str, Any]
    files: Mapping[str, str] = field(default_factory=dict)


@pytest.fixture
def folder(settings: Settings, tmp_path: Path) -> ModelFolder:
    """A model folder named llama, its directory empty; no database row is needed."""
    settings.DATA_DIR = tmp_path / "data"
    folder = ModelFolder(name="llama")
    folder.path.mkdir(parents=True)
    return folder


def put(folder: ModelFolder, files: Mapping[str, str]) -> None:
    for relative, text in files.items():
        path = folder.path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


VARIANT_CASES = [
    Case(
        "vllm with nothing set listens on the agent's port and serves the folder",
        {"runtime_variant": "vllm"},
        {
            "argv": ["vllm", "serve", "/models", *LISTEN, "--served-model-name", "llama"],
            "env": AGENT_PORT,
            "port": None,
            "model_name": "llama",
            "health_check": health("/health"),
            "pre_start_actions": [],
            "capacity": 128,
        },
    ),
    Case(
        "vllm honours its parallelism, quantization and served name variables",
        {
            "runtime_variant": "vllm",
            "environ": {
                "VLLM_TP_SIZE": "2",
                "VLLM_PP_SIZE": "1",
                "VLLM_QUANTIZATION": "awq",
                "BACKEND_MODEL_NAME": "chat",
            },
        },
        {
            "argv": [
                *("vllm", "serve", "/models", *LISTEN, "--served-model-name", "chat"),
                *("--tensor-parallel-size", "2", "--pipeline-parallel-size", "1"),
                *("--quantization", "awq"),
            ],
            "env": {
                "VLLM_TP_SIZE": "2",
                "VLLM_PP_SIZE": "1",
                "VLLM_QUANTIZATION": "awq",
                "BACKEND_MODEL_NAME": "chat",
                **AGENT_PORT,
            },
            "port": None,
            "model_name": "chat",
            "health_check": health("/health"),
            "pre_start_actions": [],
            "capacity": 128,
        },
    ),
    Case(
        "sglang uses its own flags",
        {"runtime_variant": "sglang", "environ": {"SGLANG_TP_SIZE": "4"}},
        {
            "argv": [
                *("python3", "-m", "sglang.launch_server", "--model-path", "/models", *LISTEN),
                *("--served-model-name", "llama", "--tp-size", "4"),
            ],
            "env": {"SGLANG_TP_SIZE": "4", **AGENT_PORT},
            "port": None,
            "model_name": "llama",
            "health_check": health("/health"),
            "pre_start_actions": [],
        },
    ),
    Case(
        "NIM takes its port and name from variables and is probed at its readiness path",
        {"runtime_variant": "nim"},
        {
            "argv": ["/opt/nim/start_server.sh"],
            "env": {
                "NIM_SERVER_PORT": "${PORT}",
                "NIM_SERVED_MODEL_NAME": "llama",
                **AGENT_PORT,
            },
            "port": None,
            "model_name": "llama",
            "health_check": health("/v1/health/ready"),
            "pre_start_actions": [],
        },
    ),
    Case(
        "Modular MAX is told where to listen through variables",
        {"runtime_variant": "modular-max"},
        {
            "argv": ["max", "serve", "--model-path", "/models"],
            "env": {"MAX_SERVE_HOST": "127.0.0.1", "MAX_SERVE_PORT": "${PORT}", **AGENT_PORT},
            "port": None,
            "model_name": "llama",
            "health_check": health("/health"),
            "pre_start_actions": [],
        },
    ),
    Case(
        "llama.cpp is given the folder's first .gguf file",
        {"runtime_variant": "llama-cpp"},
        {
            "argv": [
                *("${NEXUS_PYTHON}", "-m", "llama_cpp.server"),
                *("--model", "/models/weights/model-00001-of-00002.gguf"),
                *("--model_alias", "llama", *LISTEN, "--interrupt_requests", "false"),
            ],
            "env": AGENT_PORT,
            "port": None,
            "model_name": "llama",
            "health_check": health("/openapi.json", initial_delay=5.0),
            "pre_start_actions": [],
            "capacity": 1,
        },
        files={
            "weights/model-00002-of-00002.gguf": "shard",
            "weights/model-00001-of-00002.gguf": "shard",
            "README.md": "hi",
        },
    ),
    Case(
        "the simulator serves the model name it is given",
        {"runtime_variant": "simulator", "model_name": "demo"},
        {
            "argv": [
                *(
                    "${NEXUS_PYTHON}",
                    "-m",
                    "serving.runtimes.simulator",
                    *LISTEN,
                    "--model",
                    "demo",
                ),
            ],
            "env": AGENT_PORT,
            "port": None,
            "model_name": "demo",
            "health_check": health("/health", initial_delay=1.0),
            "pre_start_actions": [],
            "capacity": 8,
        },
    ),
    Case(
        "another mount destination is the model path",
        {"runtime_variant": "vllm", "mount_destination": "/weights"},
        {
            "argv": ["vllm", "serve", "/weights", *LISTEN, "--served-model-name", "llama"],
            "env": AGENT_PORT,
            "port": None,
            "model_name": "llama",
            "health_check": health("/health"),
            "pre_start_actions": [],
            "capacity": 128,
        },
    ),
    Case(
        "service-definition.toml's variables are defaults the launcher's override",
        {"runtime_variant": "vllm", "environ": {"BACKEND_MODEL_NAME": "given"}},
        {
            "argv": [
                *("vllm", "serve", "/models", *LISTEN, "--served-model-name", "given"),
                *("--tensor-parallel-size", "2"),
            ],
            "env": {"VLLM_TP_SIZE": "2", "BACKEND_MODEL_NAME": "given", **AGENT_PORT},
            "port": None,
            "model_name": "given",
            "health_check": health("/health"),
            "pre_start_actions": [],
            "capacity": 128,
        },
        files={"service-definition.toml": SERVICE_DEFINITION},
    ),
    Case(
        "service-definition.toml's sections for other variants are not used",
        {"runtime_variant": "sglang"},
        {
            "argv": [
                *("python3", "-m", "sglang.launch_server", "--model-path", "/models", *LISTEN),
                *("--served-model-name", "llama"),
            ],
            "env": AGENT_PORT,
            "port": None,
            "model_name": "llama",
            "health_check": health("/health"),
            "pre_start_actions": [],
        },
        files={"service-definition.toml": SERVICE_DEFINITION},
    ),
]

COMMAND_CASES = [
    Case(
        "a pasted command's health path, interval, first delay and retries set in the launcher",
        {
            "runtime_variant": "custom",
            "command": "python -m http.server ${PORT} --directory /models",
            "command_settings": {
                "health_path": "/",
                "interval": 2,
                "initial_delay": 0.5,
                "max_retries": 3,
            },
        },
        {
            "argv": ["python", "-m", "http.server", "${PORT}", "--directory", "/models"],
            "env": AGENT_PORT,
            "port": None,
            "model_name": "llama",
            "health_check": health("/", interval=2.0, initial_delay=0.5, max_retries=3),
            "pre_start_actions": [],
        },
    ),
    Case(
        "a pasted command's port set in the launcher",
        {
            "runtime_variant": "custom",
            "command": "./serve --listen 0.0.0.0:8002",
            "command_settings": {"port": 8002},
        },
        {
            "argv": ["./serve", "--listen", "0.0.0.0:8002"],
            "env": {},
            "port": 8002,
            "model_name": "llama",
            "health_check": health("/health"),
            "pre_start_actions": [],
        },
    ),
    Case(
        "a pasted vLLM command keeps its own port, which is then fixed",
        {"runtime_variant": "custom", "command": "vllm serve /models/my-model --tp 2 --port 8001"},
        {
            "argv": ["vllm", "serve", "/models/my-model", "--tp", "2", "--port", "8001"],
            "env": {},
            "port": 8001,
            "model_name": "llama",
            "health_check": health("/health"),
            "pre_start_actions": [],
            "capacity": 128,
        },
    ),
    Case(
        "a pasted command's served name and port are read",
        {
            "runtime_variant": "custom",
            "command": "python -m sglang.launch_server --model-path /models "
            "--served-model-name qwen --port 30001",
        },
        {
            "argv": [
                *("python", "-m", "sglang.launch_server", "--model-path", "/models"),
                *("--served-model-name", "qwen", "--port", "30001"),
            ],
            "env": {},
            "port": 30001,
            "model_name": "qwen",
            "health_check": health("/health"),
            "pre_start_actions": [],
        },
    ),
    Case(
        "a command on ${PORT} leaves the port to the agent",
        {"runtime_variant": "custom", "command": "my-server --port ${PORT}"},
        {
            "argv": ["my-server", "--port", "${PORT}"],
            "env": AGENT_PORT,
            "port": None,
            "model_name": "llama",
            "health_check": health("/health"),
            "pre_start_actions": [],
        },
    ),
    Case(
        "a bare $PORT word becomes the agent's placeholder",
        {"runtime_variant": "custom", "command": "my-server --port $PORT"},
        {
            "argv": ["my-server", "--port", "${PORT}"],
            "env": AGENT_PORT,
            "port": None,
            "model_name": "llama",
            "health_check": health("/health"),
            "pre_start_actions": [],
        },
    ),
    Case(
        "a shell script reading $PORT finds the agent's port in its environment",
        {
            "runtime_variant": "custom",
            "command": "sh -c 'pip install x && vllm serve /models --port $PORT'",
        },
        {
            "argv": ["sh", "-c", "pip install x && vllm serve /models --port $PORT"],
            "env": AGENT_PORT,
            "port": None,
            "model_name": "llama",
            "health_check": health("/health"),
            "pre_start_actions": [],
            "capacity": 128,
        },
    ),
    Case(
        "docker run is unwrapped: its volume is the mount, its -e variables the environment",
        {
            "runtime_variant": "custom",
            "command": "docker run --gpus all -v /srv/m:/weights -e HF_HOME=/tmp "
            "vllm/vllm-openai --model /weights/x --port 9000",
            "environ": {"HF_HOME": "/cache"},
        },
        {
            "argv": ["vllm", "serve", "--model", "/weights/x", "--port", "9000"],
            "env": {"HF_HOME": "/cache"},
            "port": 9000,
            "model_name": "llama",
            "health_check": health("/health"),
            "pre_start_actions": [],
            "capacity": 128,
        },
    ),
]

DEFINITION_CASES = [
    Case(
        "the folder's model-definition.yaml: its first model's command, port, checks, actions",
        {"runtime_variant": "custom"},
        {
            "argv": ["python", "-m", "http.server", "--directory", "/models", "8001"],
            "env": {},
            "port": 8001,
            "model_name": "simple-http-server",
            "health_check": health("/", initial_delay=5.0),
            "pre_start_actions": [{"action": "mkdir", "args": {"path": "/home/work/config"}}],
        },
        files={"model-definition.yaml": MODEL_DEFINITION},
    ),
    Case(
        "the .yml spelling is found too",
        {"runtime_variant": "custom"},
        {
            "argv": ["python", "-m", "http.server", "--directory", "/models", "8001"],
            "env": {},
            "port": 8001,
            "model_name": "simple-http-server",
            "health_check": health("/", initial_delay=5.0),
            "pre_start_actions": [{"action": "mkdir", "args": {"path": "/home/work/config"}}],
        },
        files={"model-definition.yml": MODEL_DEFINITION},
    ),
    Case(
        "a definition file elsewhere in the folder, with no health check",
        {"runtime_variant": "custom", "model_definition_path": "defs/serve.yaml"},
        {
            "argv": ["./serve", "--port", "${PORT}"],
            "env": {"TOKEN": "x", **AGENT_PORT},
            "port": None,
            "model_name": "m",
            "health_check": None,
            "pre_start_actions": [],
        },
        files={
            "defs/serve.yaml": "models:\n  - name: m\n    model_path: /models\n    service:\n"
            "      start_command: ./serve --port ${PORT}\n      port: 8000\n",
            "service-definition.toml": '[custom.environ]\nTOKEN = "x"\n',
        },
    ),
]


@pytest.mark.parametrize(
    "case", VARIANT_CASES + COMMAND_CASES + DEFINITION_CASES, ids=lambda case: case.id
)
def test_it_resolves_the_spec(folder: ModelFolder, case: Case) -> None:
    put(folder, case.files)

    spec = resolve_launch(model_folder=folder, **case.settings).spec

    assert spec == case.spec


@dataclass(frozen=True)
class Refusal:
    """Launcher settings for a folder holding `files`, and every problem they have."""

    id: str
    settings: Mapping[str, Any]
    problems: list[tuple[str, str, str]]
    files: Mapping[str, str] = field(default_factory=dict)


KNOWN = "vllm, sglang, nim, modular-max, llama-cpp, custom, simulator"
REFUSALS = [
    Refusal(
        "an unknown runtime variant, listing the known ones",
        {"runtime_variant": "tgi"},
        [("", "runtime_variant", f"unknown runtime variant 'tgi'; known: {KNOWN}")],
    ),
    Refusal(
        "a variable the variant cannot use, at its key",
        {"runtime_variant": "vllm", "environ": {"VLLM_TP_SIZE": "two"}},
        [("", "environ.VLLM_TP_SIZE", "must be a positive integer, not 'two'")],
    ),
    Refusal(
        "a variable from service-definition.toml the variant cannot use, in that file",
        {"runtime_variant": "vllm"},
        [
            (
                "service-definition.toml",
                "vllm.environ.VLLM_TP_SIZE",
                "must be a positive integer, not '0'",
            )
        ],
        files={"service-definition.toml": '[vllm.environ]\nVLLM_TP_SIZE = "0"\n'},
    ),
    Refusal(
        "extra arguments with an unbalanced quote",
        {"runtime_variant": "sglang", "environ": {"SGLANG_EXTRA_ARGS": "--chat-template 'x"}},
        [("", "environ.SGLANG_EXTRA_ARGS", "has an unbalanced quote")],
    ),
    Refusal(
        "malformed TOML, naming the file, line and column",
        {"runtime_variant": "vllm"},
        [
            (
                "service-definition.toml",
                "",
                "not valid TOML at line 1, column 14: expected ']' at the end of a table "
                "declaration",
            )
        ],
        files={"service-definition.toml": "[vllm.environ\nA = 1\n"},
    ),
    Refusal(
        "a service definition with every problem at its key path",
        {"runtime_variant": "vllm"},
        [
            ("service-definition.toml", "tgi", f"unknown runtime variant; known: {KNOWN}"),
            (
                "service-definition.toml",
                "vllm.environ.PORT",
                'must be a string (quote numbers: "8000")',
            ),
        ],
        files={"service-definition.toml": "[tgi]\n[vllm.environ]\nPORT = 8000\n"},
    ),
    Refusal(
        "malformed YAML, naming the file, line and column",
        {"runtime_variant": "custom"},
        [
            (
                "model-definition.yaml",
                "",
                "not valid YAML at line 3, column 4: expected <block end>, but found "
                "'<block mapping start>'",
            )
        ],
        files={"model-definition.yaml": "models:\n  - name: x\n   model_path: /models\n"},
    ),
    Refusal(
        "a model definition's port out of range, at its key path",
        {"runtime_variant": "custom"},
        [
            (
                "model-definition.yaml",
                "models[0].service.port",
                "must be an integer between 1 and 65535",
            )
        ],
        files={
            "model-definition.yaml": "models:\n  - name: x\n    model_path: /models\n"
            "    service:\n      start_command: [serve]\n      port: 80000\n"
        },
    ),
    Refusal(
        "a model definition's fixed port that Nexus's web server uses",
        {"runtime_variant": "custom"},
        [
            (
                "model-definition.yaml",
                "models[0].service.port",
                "port 8000 is Nexus's own, used by the web server (NEXUS_PORT); listen on "
                "${PORT} (a port the agent allocates) or on another port",
            )
        ],
        files={
            "model-definition.yaml": "models:\n  - name: x\n    model_path: /models\n"
            "    service:\n      start_command: [serve, '8000']\n      port: 8000\n"
        },
    ),
    Refusal(
        "a pasted command on the local agent's port",
        {"runtime_variant": "custom", "command": "vllm serve /models --port 7100"},
        [
            (
                "",
                "command",
                "port 7100 is Nexus's own, used by the local agent (NEXUS_AGENT_PORT); listen on "
                "${PORT} (a port the agent allocates) or on another port",
            )
        ],
    ),
    Refusal(
        "problems in service-definition.toml and model-definition.yaml, all at once",
        {"runtime_variant": "custom"},
        [
            (
                "service-definition.toml",
                "custom.resource_slots.mem",
                'must be a size like "8gb" or "512m"',
            ),
            (
                "model-definition.yaml",
                "models[0].service.port",
                "must be an integer between 1 and 65535",
            ),
        ],
        files={
            "service-definition.toml": '[custom.resource_slots]\nmem = "lots"\n',
            "model-definition.yaml": "models:\n  - name: x\n    model_path: /models\n"
            "    service:\n      start_command: [serve]\n      port: 80000\n",
        },
    ),
    Refusal(
        "a pasted command's settings out of bounds, each at its key",
        {
            "runtime_variant": "custom",
            "command": "./serve",
            "command_settings": {
                "port": 0,
                "health_path": "health",
                "interval": 0,
                "initial_delay": -1,
                "max_retries": 1.5,
                "timeout": 3,
            },
        },
        [
            ("", "command_settings.port", "must be an integer between 1 and 65535"),
            ("", "command_settings.health_path", 'must start with "/"'),
            ("", "command_settings.interval", "must be a number greater than 0"),
            ("", "command_settings.initial_delay", "must be a number, 0 or more"),
            ("", "command_settings.max_retries", "must be an integer, 0 or more"),
            (
                "",
                "command_settings.timeout",
                "unknown setting; expected one of: port, health_path, interval, initial_delay, "
                "max_retries",
            ),
        ],
    ),
    Refusal(
        "a port set for a command that listens on ${PORT}",
        {
            "runtime_variant": "custom",
            "command": "./serve --port ${PORT}",
            "command_settings": {"port": 8002},
        },
        [
            (
                "",
                "command_settings.port",
                "the command listens on ${PORT}, which the agent allocates; leave it empty",
            )
        ],
    ),
    Refusal(
        "command settings without a pasted command",
        {"runtime_variant": "vllm", "command_settings": {"health_path": "/"}},
        [
            (
                "",
                "command_settings",
                "only a pasted command (Custom) takes these",
            )
        ],
    ),
    Refusal(
        "a first model that is not servable",
        {"runtime_variant": "custom", "model_definition_path": "defs/m.yaml"},
        [("defs/m.yaml", "models[0].service", "required: the first model is served")],
        files={"defs/m.yaml": "models:\n  - name: x\n    model_path: /models\n"},
    ),
    Refusal(
        "a pasted command's port out of range",
        {"runtime_variant": "custom", "command": "vllm serve /models --port 70000"},
        [("", "command", "--port must be a port number between 1 and 65535, not '70000'")],
    ),
    Refusal(
        "a pasted command with an unbalanced quote",
        {"runtime_variant": "custom", "command": "vllm serve '/models"},
        [("", "command", "unbalanced quote: a quote is opened and never closed")],
    ),
    Refusal(
        "Custom in a folder without a model definition and no command",
        {"runtime_variant": "custom"},
        [
            (
                "",
                "model_definition_path",
                "the model folder 'llama' has no model-definition.yaml; upload one, or paste a "
                "command",
            )
        ],
    ),
    Refusal(
        "a model definition path naming no file",
        {"runtime_variant": "custom", "model_definition_path": "nope.yaml"},
        [("", "model_definition_path", "No file 'nope.yaml' in model folder 'llama'.")],
    ),
    Refusal(
        "a model definition path leading out of the folder",
        {"runtime_variant": "custom", "model_definition_path": "../other/model-definition.yaml"},
        [
            (
                "",
                "model_definition_path",
                "'../other/model-definition.yaml' contains '..'; paths must stay inside the model "
                "folder.",
            )
        ],
    ),
    Refusal(
        "a command and a definition path together",
        {"runtime_variant": "custom", "command": "serve", "model_definition_path": "m.yaml"},
        [("", "command", "give a command or a model definition path, not both")],
    ),
    Refusal(
        "a command for a variant that builds its own",
        {"runtime_variant": "vllm", "command": "vllm serve /models", "model_definition_path": "x"},
        [
            (
                "",
                "command",
                "only the custom runtime variant takes one; vllm builds its own command",
            ),
            (
                "",
                "model_definition_path",
                "only the custom runtime variant takes one; vllm builds its own command",
            ),
        ],
    ),
    Refusal(
        "llama.cpp in a folder without a .gguf file",
        {"runtime_variant": "llama-cpp"},
        [
            (
                "",
                "model_folder",
                "llama.cpp serves a .gguf file and the model folder 'llama' holds none; upload one",
            )
        ],
    ),
    Refusal(
        "bad variables and a relative mount, all at once",
        {
            "runtime_variant": "vllm",
            "environ": {"1BAD": "x", "TP": 2, "OK": "fine"},
            "mount_destination": "models",
        },
        [
            ("", "environ.1BAD", "is not a valid variable name (letters, digits and _)"),
            ("", "environ.TP", 'must be a string (quote numbers: "2")'),
            ("", "mount_destination", "must be an absolute path like /models"),
        ],
    ),
    Refusal(
        "a mount at the root",
        {"runtime_variant": "vllm", "mount_destination": "/"},
        [("", "mount_destination", "must name a directory below / without '..', like /models")],
    ),
]


@pytest.mark.parametrize("refusal", REFUSALS, ids=lambda refusal: refusal.id)
def test_it_refuses_with_every_problem_at_its_path(folder: ModelFolder, refusal: Refusal) -> None:
    put(folder, refusal.files)

    with pytest.raises(LaunchError) as refused:
        resolve_launch(model_folder=folder, **refusal.settings)

    assert [(p.file, p.path, p.message) for p in refused.value.problems] == refusal.problems


def test_the_error_prints_one_line_per_problem(folder: ModelFolder) -> None:
    with pytest.raises(LaunchError) as refused:
        resolve_launch(model_folder=folder, runtime_variant="vllm", environ={"1X": "", "2Y": ""})

    assert str(refused.value) == (
        "environ.1X: is not a valid variable name (letters, digits and _)\n"
        "environ.2Y: is not a valid variable name (letters, digits and _)"
    )


def test_a_folder_missing_from_disk_is_named(folder: ModelFolder) -> None:
    folder.path.rmdir()

    with pytest.raises(LaunchError) as refused:
        resolve_launch(model_folder=folder, runtime_variant="vllm")

    assert [(p.path, p.message) for p in refused.value.problems] == [
        ("model_folder", f"The directory of model folder 'llama' is missing: {folder.path}.")
    ]


def test_the_launch_tells_what_the_launcher_shows(folder: ModelFolder) -> None:
    put(folder, {"service-definition.toml": SERVICE_DEFINITION})

    launch = resolve_launch(model_folder=folder, runtime_variant="vllm")

    summary = launch.to_dict()
    del summary["spec"]
    assert summary == {
        "runtime_variant": "vllm",
        "source": "variant",
        "runtime": "vllm",
        "port": None,
        "model_name": "from-toml",
        "model_path": "/models",
        "mount_destination": "/models",
        "tensor_parallel_size": 2,
        "pipeline_parallel_size": None,
        "command_line": "vllm serve /models --host 127.0.0.1 --port '${PORT}' "
        "--served-model-name from-toml --tensor-parallel-size 2",
        "health_check": health("/health"),
        "image": "vllm/vllm-openai:latest",
        "resource_slots": {"cpu": 2, "mem": 8 << 30, "cuda.shares": 0.5},
        "warnings": [],
    }


def test_a_pasted_command_reports_the_runtime_it_recognised(folder: ModelFolder) -> None:
    launch = resolve_launch(
        model_folder=folder,
        runtime_variant="custom",
        command="docker run -v /srv/m:/weights vllm/vllm-openai --model /weights/x --pp 2"
        " --port 8001",
    )

    assert (launch.runtime, launch.source, launch.mount_destination, launch.model_path) == (
        "vllm",
        "command",
        "/weights",
        "/weights/x",
    )
    assert launch.pipeline_parallel_size == 2
    assert launch.image == "vllm/vllm-openai"
    assert launch.warnings == (
        "the command runs as a process on the node; the image vllm/vllm-openai is not pulled",
    )


def test_a_model_definition_reports_its_model_path_sizes_and_ignored_models(
    folder: ModelFolder,
) -> None:
    put(
        folder,
        {
            "model-definition.yaml": "models:\n"
            "  - name: a\n    model_path: /models/a\n    service:\n"
            "      start_command: vllm serve /models/a --tensor-parallel-size 4\n      port: 8001\n"
            "  - name: b\n    model_path: /models/b\n"
        },
    )

    launch = resolve_launch(model_folder=folder, runtime_variant="custom")

    assert (launch.source, launch.model_path, launch.tensor_parallel_size) == (
        "model-definition",
        "/models/a",
        4,
    )
    assert launch.warnings == ("only the first model, a, is served; ignored: b",)


def test_several_gguf_files_are_named_in_a_warning(folder: ModelFolder) -> None:
    put(folder, {"a.gguf": "x", "b.gguf": "y"})

    launch = resolve_launch(model_folder=folder, runtime_variant="llama-cpp")

    assert launch.model_path == "/models/a.gguf"
    assert launch.warnings == ("the folder holds 2 .gguf files; serving a.gguf",)
