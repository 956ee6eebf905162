"""Runtime variants: for each inference server, its port, health path, command and variables.

Pure: nothing here runs a process. Every built command listens on 127.0.0.1, because replicas
are reached only through the node's agent (see nodes/agent/forwarding.py). `port` may be the
``${PORT}`` placeholder that the agent replaces with a port it allocated.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

LOOPBACK = "127.0.0.1"
PORT_PLACEHOLDER = "${PORT}"
BACKEND_MODEL_NAME = "BACKEND_MODEL_NAME"
_SERVED_NAME_MEANING = "the model name the API serves (default: the service's model name)"


class RuntimeVariantError(ValueError):
    """An unknown variant name, or a variable whose value the variant cannot use."""


@dataclass(frozen=True)
class LaunchInput:
    """What every command builder is given."""

    model_path: str
    model_name: str
    port: str
    env: Mapping[str, str]

    def served_name(self) -> str:
        """Return BACKEND_MODEL_NAME when set, else the service's model name."""
        return self.env.get(BACKEND_MODEL_NAME) or self.model_name


@dataclass(frozen=True)
class RuntimeVariant:
    """One inference server a service can run, with the defaults the launcher offers."""

    name: str
    label: str
    port: int
    health_path: str
    # Variable name -> what it does; the variables this variant reads when building its command.
    env_vars: Mapping[str, str]
    # None for Custom: its command comes from the user or from model-definition.yaml.
    command: Callable[[LaunchInput], list[str]] | None
    # Variables the server itself reads, set from the launch input (port, served name).
    environ: Callable[[LaunchInput], dict[str, str]] | None = None
    # Seconds before the first health probe: DESIGN's 60 s lets a large model load; a server
    # that is up at once (the simulator) is probed sooner.
    initial_delay: float = 60.0

    def to_dict(self) -> dict[str, Any]:
        """Return the variant as JSON-ready values."""
        return {
            "name": self.name,
            "label": self.label,
            "port": self.port,
            "health_path": self.health_path,
            "env_vars": dict(self.env_vars),
            "has_command": self.command is not None,
        }


def _positive_integer(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name, "").strip()
    if not value:
        return None
    # isdecimal() alone would pass digits of other scripts, which int() then reads.
    if not (value.isascii() and value.isdecimal()) or int(value) < 1:
        raise RuntimeVariantError(f"{name} must be a positive integer, not {value!r}")
    return str(int(value))


def _extra_args(env: Mapping[str, str], name: str) -> list[str]:
    try:
        return shlex.split(env.get(name, ""))
    except ValueError as error:
        problem = (
            "an unbalanced quote" if "quotation" in str(error) else "a lone backslash at the end"
        )
        raise RuntimeVariantError(f"{name} has {problem}") from None


def _engine_options(launch: LaunchInput, prefix: str, tp_flag: str, pp_flag: str) -> list[str]:
    """Return the parallelism, quantization and extra options vLLM and SGLang share."""
    env = launch.env
    options = []
    if tp := _positive_integer(env, f"{prefix}_TP_SIZE"):
        options += [tp_flag, tp]
    if pp := _positive_integer(env, f"{prefix}_PP_SIZE"):
        options += [pp_flag, pp]
    if quantization := env.get(f"{prefix}_QUANTIZATION", "").strip():
        options += ["--quantization", quantization]
    # Extra arguments go last, so they override anything above (both servers keep the last).
    return options + _extra_args(env, f"{prefix}_EXTRA_ARGS")


def _vllm(launch: LaunchInput) -> list[str]:
    return [
        *("vllm", "serve", launch.model_path),
        *("--host", LOOPBACK, "--port", launch.port),
        *("--served-model-name", launch.served_name()),
        *_engine_options(launch, "VLLM", "--tensor-parallel-size", "--pipeline-parallel-size"),
    ]


def _sglang(launch: LaunchInput) -> list[str]:
    return [
        *("python3", "-m", "sglang.launch_server", "--model-path", launch.model_path),
        *("--host", LOOPBACK, "--port", launch.port),
        *("--served-model-name", launch.served_name()),
        *_engine_options(launch, "SGLANG", "--tp-size", "--pp-size"),
    ]


def _nim(launch: LaunchInput) -> list[str]:
    # A NIM image carries its own server and launcher script; the port and name are variables.
    return ["/opt/nim/start_server.sh"]


def _nim_environ(launch: LaunchInput) -> dict[str, str]:
    return {"NIM_SERVER_PORT": launch.port, "NIM_SERVED_MODEL_NAME": launch.served_name()}


def _max(launch: LaunchInput) -> list[str]:
    return ["max", "serve", "--model-path", launch.model_path]


def _max_environ(launch: LaunchInput) -> dict[str, str]:
    # MAX reads where to listen from its MAX_SERVE_* settings.
    return {"MAX_SERVE_HOST": LOOPBACK, "MAX_SERVE_PORT": launch.port}


def _llama_cpp(launch: LaunchInput) -> list[str]:
    return [
        *("llama-server", "-m", launch.model_path),
        *("--host", LOOPBACK, "--port", launch.port),
        *("--alias", launch.served_name()),
    ]


def _simulator(launch: LaunchInput) -> list[str]:
    return [
        # The node agent's interpreter, which has Nexus (and so the simulator) installed.
        *("${NEXUS_PYTHON}", "-m", "serving.runtimes.simulator"),
        *("--host", LOOPBACK, "--port", launch.port, "--model", launch.served_name()),
    ]


def _engine_vars(prefix: str) -> dict[str, str]:
    return {
        BACKEND_MODEL_NAME: _SERVED_NAME_MEANING,
        f"{prefix}_QUANTIZATION": "quantization method (--quantization), e.g. awq, gptq, fp8",
        f"{prefix}_TP_SIZE": "tensor parallel size: GPUs one replica spans",
        f"{prefix}_PP_SIZE": "pipeline parallel size: stages one replica is split into",
        f"{prefix}_EXTRA_ARGS": "more command-line arguments, split like a shell would, added last",
    }


_VARIANTS = (
    RuntimeVariant("vllm", "vLLM", 8000, "/health", _engine_vars("VLLM"), _vllm),
    RuntimeVariant("sglang", "SGLang", 9001, "/health", _engine_vars("SGLANG"), _sglang),
    RuntimeVariant(
        "nim",
        "NVIDIA NIM",
        8000,
        "/v1/health/ready",
        {BACKEND_MODEL_NAME: _SERVED_NAME_MEANING + "; passed as NIM_SERVED_MODEL_NAME"},
        _nim,
        _nim_environ,
    ),
    RuntimeVariant("modular-max", "Modular MAX", 8000, "/health", {}, _max, _max_environ),
    RuntimeVariant(
        "llama-cpp",
        "llama.cpp",
        8080,
        "/health",
        {BACKEND_MODEL_NAME: _SERVED_NAME_MEANING + "; passed as --alias"},
        _llama_cpp,
    ),
    RuntimeVariant("custom", "Custom", 8000, "/health", {}, None),
    # The simulator's own default port (serving/runtimes/simulator/config.py).
    RuntimeVariant(
        "simulator",
        "Simulator",
        9101,
        "/health",
        {BACKEND_MODEL_NAME: _SERVED_NAME_MEANING + "; passed as --model"},
        _simulator,
        initial_delay=1.0,
    ),
)
VARIANTS: Mapping[str, RuntimeVariant] = {variant.name: variant for variant in _VARIANTS}
VARIANT_NAMES = tuple(VARIANTS)


def variant(name: str) -> RuntimeVariant:
    """Return the variant of that name; raise RuntimeVariantError listing the known ones."""
    try:
        return VARIANTS[name]
    except KeyError:
        known = ", ".join(VARIANT_NAMES)
        raise RuntimeVariantError(f"unknown runtime variant {name!r}; known: {known}") from None


def _launch(
    model_path: str, model_name: str, port: int | str, env: Mapping[str, str]
) -> LaunchInput:
    return LaunchInput(model_path=model_path, model_name=model_name, port=str(port), env=env)


def build_command(
    runtime: RuntimeVariant | str,
    *,
    model_path: str,
    model_name: str,
    port: int | str,
    env: Mapping[str, str],
) -> list[str]:
    """Return the argv that serves the model, honouring the variant's variables in `env`.

    Raise RuntimeVariantError for Custom (it has no built-in command) and for a variable the
    command cannot use (VLLM_TP_SIZE=two, an unbalanced quote in VLLM_EXTRA_ARGS).
    """
    chosen = variant(runtime) if isinstance(runtime, str) else runtime
    if chosen.command is None:
        raise RuntimeVariantError(
            f"the {chosen.label} runtime has no built-in command; "
            "give a start command or a model-definition.yaml"
        )
    return chosen.command(_launch(model_path, model_name, port, env))


def build_environ(
    runtime: RuntimeVariant | str,
    *,
    model_path: str,
    model_name: str,
    port: int | str,
    env: Mapping[str, str],
) -> dict[str, str]:
    """Return the variables the server process runs with: `env` plus what the variant sets.

    What the variant sets wins, because the port and served name must match what Nexus probes
    and routes to.
    """
    chosen = variant(runtime) if isinstance(runtime, str) else runtime
    extra = chosen.environ(_launch(model_path, model_name, port, env)) if chosen.environ else {}
    return {**env, **extra}
