"""The runtime catalogue: one definition of every inference server Nexus runs.

Per runtime: the argv and environment it starts with, its port and health path, the metrics that
tell its load, where its real concurrency is set, its launcher parameters, its install recipe for
deployments, and how it runs as a cluster (one main and workers on other nodes). The controller
(serving's launcher, deployments, managed pools) and the agent (deploy jobs) all read it here.

Pure: no Django, nothing runs a process. Every command listens on 127.0.0.1, because replicas are
reached only through the node's agent (nodes/agent/forwarding.py). Placeholders the agent fills
in: `${PORT}` (a port it allocated), `${DIST_PORT}` (a second one, a cluster main's rendezvous)
and `${NEXUS_PYTHON}` (its own interpreter); the controller fills `${MAIN_HOST}` and
`${NODE_RANK}` when it starts a cluster's parts.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from nodes.runtimes.parameters import (
    SGLANG_PARAMETERS,
    VLLM_PARAMETERS,
    ParameterError,
    ParameterTable,
)

LOOPBACK = "127.0.0.1"
PORT_PLACEHOLDER = "${PORT}"
DIST_PORT_PLACEHOLDER = "${DIST_PORT}"
PYTHON_PLACEHOLDER = "${NEXUS_PYTHON}"
MAIN_HOST_PLACEHOLDER = "${MAIN_HOST}"
NODE_RANK_PLACEHOLDER = "${NODE_RANK}"
BACKEND_MODEL_NAME = "BACKEND_MODEL_NAME"
# The simulator is Nexus's own program; the agent runs it with its own interpreter.
SIMULATOR_MODULE = "serving.runtimes.simulator"
# llama-cpp-python's server answers its OpenAPI document without waiting for the model.
LLAMA_CPP_PYTHON_HEALTH_PATH = "/openapi.json"
# The C++ llama-server's readiness route (503 while it loads the model).
LLAMA_SERVER_HEALTH_PATH = "/health"
_SERVED_NAME_MEANING = "the model name the API serves (default: the service's model name)"


class RuntimeVariantError(ValueError):
    """An unknown runtime name, or a variable or parameter whose value it cannot use."""


@dataclass(frozen=True)
class LaunchInput:
    """What every command builder is given.

    `parameters` are the launcher's checked parameter values by key; `python` is the
    interpreter of Python runtimes (the agent's own unless a deployment installed one).
    """

    model_path: str
    model_name: str
    port: str
    env: Mapping[str, str]
    parameters: Mapping[str, str] = field(default_factory=dict)
    python: str = PYTHON_PLACEHOLDER

    def served_name(self) -> str:
        """Return the served-name parameter, else BACKEND_MODEL_NAME, else the model name."""
        return (
            self.parameters.get("served_model_name")
            or self.env.get(BACKEND_MODEL_NAME)
            or self.model_name
        )

    def model(self) -> str:
        """Return the model parameter when given, else the model path."""
        return self.parameters.get("model") or self.model_path


@dataclass(frozen=True)
class Metrics:
    """The Prometheus gauges of the runtime's own running and waiting requests."""

    running: str
    waiting: str


@dataclass(frozen=True)
class Concurrency:
    """Where a runtime's real concurrency (requests generating at once) is set.

    `flag` sets it on the command line (`parameter` is the launcher's field for it); `default`
    is what the server runs with when the flag is absent, None when it derives it from memory.
    `detected_by` says how a running server tells it, for operators and pools.
    """

    flag: str | None
    default: int | None
    detected_by: str
    parameter: str | None = None


@dataclass(frozen=True)
class Install:
    """How a deploy job installs the runtime on a node: a pip requirement in its own venv."""

    requirement: str
    venv: str
    # The server needs an NVIDIA GPU; a node without one fails the job at once, saying so.
    needs_gpu: bool = False
    # Environment for pip while it builds the requirement (a node's own value of a name wins).
    build_env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ClusterPart:
    """What one part of a cluster replica runs: the main (rank 0) or a worker."""

    argv: list[str]
    pre_start_actions: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Runtime:
    """One inference server, with everything the controller and the agent need to run it."""

    name: str
    label: str
    port: int
    health_path: str
    # Variable name -> what it does; the variables this runtime reads when building its command.
    env_vars: Mapping[str, str]
    # None for Custom: its command comes from the user or from model-definition.yaml.
    command: Callable[[LaunchInput], list[str]] | None
    # Variables the server itself reads, set from the launch input (port, served name).
    environ: Callable[[LaunchInput], dict[str, str]] | None = None
    # Seconds before the first health probe: DESIGN's 60 s lets a large model load; a server
    # that is up at once (the simulator) is probed sooner.
    initial_delay: float = 60.0
    metrics: Metrics | None = None
    concurrency: Concurrency | None = None
    parameters: ParameterTable | None = None
    install: Install | None = None
    # Deploy jobs can put it on a node (docs/nodes.md, "Deploy jobs").
    deployable: bool = False
    # How long a started server may take to answer (a deploy job's wait, a rollout's patience).
    ready_timeout_s: float = 120.0
    # (input, role) -> what one part of a multi-node replica runs; None: single node only.
    cluster: Callable[[LaunchInput, bool, int], ClusterPart] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the runtime as JSON-ready values."""
        return {
            "name": self.name,
            "label": self.label,
            "port": self.port,
            "health_path": self.health_path,
            "env_vars": dict(self.env_vars),
            "has_command": self.command is not None,
            "multi_node": self.cluster is not None,
            "parameter_tabs": list(self.parameters.tabs) if self.parameters else [],
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


def _engine_options(
    launch: LaunchInput, prefix: str, tp_flag: str, pp_flag: str, table: ParameterTable
) -> list[str]:
    """Return the parallelism, quantization, parameter and extra options of vLLM and SGLang."""
    env = launch.env
    options = []
    if tp := _positive_integer(env, f"{prefix}_TP_SIZE"):
        options += [tp_flag, tp]
    if pp := _positive_integer(env, f"{prefix}_PP_SIZE"):
        options += [pp_flag, pp]
    if quantization := env.get(f"{prefix}_QUANTIZATION", "").strip():
        options += ["--quantization", quantization]
    options += table.flags(launch.parameters)
    # Extra arguments go last, so they override anything above (both servers keep the last).
    return options + _extra_args(env, f"{prefix}_EXTRA_ARGS")


def _vllm(launch: LaunchInput) -> list[str]:
    return [
        *("vllm", "serve", launch.model()),
        *("--host", LOOPBACK, "--port", launch.port),
        *("--served-model-name", launch.served_name()),
        *_engine_options(
            launch, "VLLM", "--tensor-parallel-size", "--pipeline-parallel-size", VLLM_PARAMETERS
        ),
    ]


def _vllm_cluster(launch: LaunchInput, main: bool, size: int) -> ClusterPart:
    """Ray: the main starts a Ray head and serves with TP×PP spread over the Ray nodes; each
    worker joins the head and blocks (stopping it leaves the cluster)."""
    address = f"{MAIN_HOST_PLACEHOLDER}:{DIST_PORT_PLACEHOLDER}"
    if not main:
        return ClusterPart(["ray", "start", "--block", "--address", address])
    head = ["ray", "start", "--head", "--node-ip-address", MAIN_HOST_PLACEHOLDER]
    head += ["--port", DIST_PORT_PLACEHOLDER]
    return ClusterPart(
        [*_vllm(launch), "--distributed-executor-backend", "ray"],
        [{"action": "run_command", "args": {"command": head}}],
    )


def _sglang(launch: LaunchInput) -> list[str]:
    return [
        *("python3", "-m", "sglang.launch_server", "--model-path", launch.model()),
        *("--host", LOOPBACK, "--port", launch.port),
        *("--served-model-name", launch.served_name()),
        *_engine_options(launch, "SGLANG", "--tp-size", "--pp-size", SGLANG_PARAMETERS),
    ]


def _distributed(size: int) -> list[str]:
    """Return SGLang's (and the simulator's) multi-node options: size, rank, the main's address."""
    return [
        *("--nnodes", str(size), "--node-rank", NODE_RANK_PLACEHOLDER),
        *("--dist-init-addr", f"{MAIN_HOST_PLACEHOLDER}:{DIST_PORT_PLACEHOLDER}"),
    ]


def _sglang_cluster(launch: LaunchInput, main: bool, size: int) -> ClusterPart:
    # Every rank runs the same server; only rank 0 serves HTTP, the others join it.
    return ClusterPart([*_sglang(launch), *_distributed(size)])


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
    # llama-cpp-python's server: what `pip install 'nexus[llama]'` and deploy jobs install.
    return [
        *(launch.python, "-m", "llama_cpp.server", "--model", launch.model_path),
        *("--model_alias", launch.served_name()),
        *("--host", LOOPBACK, "--port", launch.port),
        # By default that server ends a stream early, without its finish reason, whenever
        # another request waits for the model (a health probe, a listing): the gateway already
        # sends a replica one request at a time, so a request waits instead.
        *("--interrupt_requests", "false"),
    ]


def _simulator(launch: LaunchInput) -> list[str]:
    return [
        *(launch.python, "-m", SIMULATOR_MODULE),
        *("--host", LOOPBACK, "--port", launch.port, "--model", launch.served_name()),
    ]


def _simulator_cluster(launch: LaunchInput, main: bool, size: int) -> ClusterPart:
    if main:
        return ClusterPart([*_simulator(launch), *_distributed(size)])
    # A worker serves no HTTP: it joins the main over TCP and stays until the main goes.
    return ClusterPart(
        [
            launch.python,
            "-m",
            SIMULATOR_MODULE,
            "--model",
            launch.served_name(),
            *_distributed(size),
        ]
    )


def _engine_vars(prefix: str) -> dict[str, str]:
    return {
        BACKEND_MODEL_NAME: _SERVED_NAME_MEANING,
        f"{prefix}_QUANTIZATION": "quantization method (--quantization), e.g. awq, gptq, fp8",
        f"{prefix}_TP_SIZE": "tensor parallel size: GPUs one replica spans",
        f"{prefix}_PP_SIZE": "pipeline parallel size: stages one replica is split into",
        f"{prefix}_EXTRA_ARGS": "more command-line arguments, split like a shell would, added last",
    }


_RUNTIMES = (
    Runtime(
        "vllm",
        "vLLM",
        8000,
        "/health",
        _engine_vars("VLLM"),
        _vllm,
        metrics=Metrics("vllm:num_requests_running", "vllm:num_requests_waiting"),
        concurrency=Concurrency(
            "--max-num-seqs", 128, "the --max-num-seqs it was started with", "max_num_seqs"
        ),
        parameters=VLLM_PARAMETERS,
        install=Install("vllm", "vllm", needs_gpu=True),
        deployable=True,
        # Weights onto the GPU and kernels compiled first.
        ready_timeout_s=1800.0,
        cluster=_vllm_cluster,
    ),
    Runtime(
        "sglang",
        "SGLang",
        9001,
        "/health",
        _engine_vars("SGLANG"),
        _sglang,
        metrics=Metrics("sglang:num_running_reqs", "sglang:num_queue_reqs"),
        concurrency=Concurrency(
            "--max-running-requests",
            None,
            "the --max-running-requests it was started with, else GET /get_server_info",
            "max_running_requests",
        ),
        parameters=SGLANG_PARAMETERS,
        install=Install("sglang[all]", "sglang", needs_gpu=True),
        deployable=True,
        ready_timeout_s=1800.0,
        cluster=_sglang_cluster,
    ),
    Runtime(
        "nim",
        "NVIDIA NIM",
        8000,
        "/v1/health/ready",
        {BACKEND_MODEL_NAME: _SERVED_NAME_MEANING + "; passed as NIM_SERVED_MODEL_NAME"},
        _nim,
        _nim_environ,
        metrics=Metrics("vllm:num_requests_running", "vllm:num_requests_waiting"),
    ),
    Runtime("modular-max", "Modular MAX", 8000, "/health", {}, _max, _max_environ),
    Runtime(
        "llama-cpp",
        "llama.cpp",
        8080,
        # llama-cpp-python's server has no /health, and its /v1/models waits for the model's
        # lock (behind a whole generation). It loads the model before it listens, so any answer
        # means ready: the OpenAPI document answers at once.
        LLAMA_CPP_PYTHON_HEALTH_PATH,
        {BACKEND_MODEL_NAME: _SERVED_NAME_MEANING + "; passed as --model_alias"},
        _llama_cpp,
        # A memory-mapped GGUF file loads in seconds.
        initial_delay=5.0,
        metrics=Metrics("llamacpp:requests_processing", "llamacpp:requests_deferred"),
        # llama-cpp-python's server runs one request at a time (a lock around the model).
        concurrency=Concurrency(None, 1, "llama-cpp-python's server serves one request at once"),
        # Compiled for any x86-64 with AVX2, not -march=native: a machine may report AMX that its
        # kernel does not let a process use, and a native build dies with SIGILL on its first
        # real prompt (docs/running.md). A node that wants its own flags sets CMAKE_ARGS.
        install=Install(
            "llama-cpp-python[server]",
            "llama-cpp",
            build_env=(("CMAKE_ARGS", "-DGGML_NATIVE=OFF"),),
        ),
        deployable=True,
        # The file is memory-mapped: a small model answers within seconds.
        ready_timeout_s=600.0,
    ),
    Runtime("custom", "Custom", 8000, "/health", {}, None, deployable=True),
    # The simulator's own default port (serving/runtimes/simulator/config.py).
    Runtime(
        "simulator",
        "Simulator",
        9101,
        "/health",
        {BACKEND_MODEL_NAME: _SERVED_NAME_MEANING + "; passed as --model"},
        _simulator,
        initial_delay=1.0,
        metrics=Metrics("vllm:num_requests_running", "vllm:num_requests_waiting"),
        concurrency=Concurrency("--concurrency", 8, "GET /sim/stats, or its --concurrency"),
        deployable=True,
        cluster=_simulator_cluster,
    ),
)
RUNTIMES: Mapping[str, Runtime] = MappingProxyType({r.name: r for r in _RUNTIMES})
RUNTIME_NAMES = tuple(RUNTIMES)
DEPLOYABLE_NAMES = tuple(name for name, runtime in RUNTIMES.items() if runtime.deployable)
# The name llama.cpp had in deployments before the catalogue gave every runtime one name.
FORMER_NAMES: Mapping[str, str] = MappingProxyType({"llama.cpp": "llama-cpp"})


def runtime(name: str) -> Runtime:
    """Return the runtime of that name; raise RuntimeVariantError listing the known ones."""
    try:
        return RUNTIMES[name]
    except KeyError:
        known = ", ".join(RUNTIME_NAMES)
        raise RuntimeVariantError(f"unknown runtime variant {name!r}; known: {known}") from None


def _chosen(chosen: Runtime | str) -> Runtime:
    return runtime(chosen) if isinstance(chosen, str) else chosen


def checked_parameters(chosen: Runtime | str, values: Mapping[str, Any]) -> dict[str, str]:
    """Return the runtime's parameter values, checked; raise ParameterError naming the one
    that is not usable (a runtime without parameters takes none)."""
    table = _chosen(chosen).parameters
    if table is None:
        if values:
            key = next(iter(values))
            raise ParameterError(key, f"the {_chosen(chosen).label} runtime takes no parameters")
        return {}
    return table.check_values(values)


def _launch(
    model_path: str,
    model_name: str,
    port: int | str,
    env: Mapping[str, str],
    parameters: Mapping[str, str] | None,
    python: str,
) -> LaunchInput:
    return LaunchInput(
        model_path=model_path,
        model_name=model_name,
        port=str(port),
        env=env,
        parameters=dict(parameters or {}),
        python=python,
    )


def build_command(
    chosen: Runtime | str,
    *,
    model_path: str,
    model_name: str,
    port: int | str,
    env: Mapping[str, str],
    parameters: Mapping[str, str] | None = None,
    python: str = PYTHON_PLACEHOLDER,
) -> list[str]:
    """Return the argv that serves the model, honouring the runtime's variables and parameters.

    Raise RuntimeVariantError for Custom (it has no built-in command) and for a variable the
    command cannot use (VLLM_TP_SIZE=two, an unbalanced quote in VLLM_EXTRA_ARGS).
    """
    found = _chosen(chosen)
    if found.command is None:
        raise RuntimeVariantError(
            f"the {found.label} runtime has no built-in command; "
            "give a start command or a model-definition.yaml"
        )
    return found.command(_launch(model_path, model_name, port, env, parameters, python))


def build_environ(
    chosen: Runtime | str,
    *,
    model_path: str,
    model_name: str,
    port: int | str,
    env: Mapping[str, str],
    parameters: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Return the variables the server process runs with: `env` plus what the runtime sets.

    What the runtime sets wins, because the port and served name must match what Nexus probes
    and routes to.
    """
    found = _chosen(chosen)
    launch = _launch(model_path, model_name, port, env, parameters, PYTHON_PLACEHOLDER)
    extra = found.environ(launch) if found.environ else {}
    return {**env, **extra}


def build_cluster(
    chosen: Runtime | str,
    *,
    size: int,
    model_path: str,
    model_name: str,
    port: int | str,
    env: Mapping[str, str],
    parameters: Mapping[str, str] | None = None,
    python: str = PYTHON_PLACEHOLDER,
) -> tuple[ClusterPart, ClusterPart]:
    """Return what the main and each worker of a `size`-node replica run.

    The parts keep `${MAIN_HOST}`, `${NODE_RANK}` and `${DIST_PORT}` for the controller and
    the main's agent to fill in when the parts start. Raise RuntimeVariantError for a runtime
    without a multi-node mode, or a size below 2.
    """
    found = _chosen(chosen)
    if found.cluster is None:
        raise RuntimeVariantError(f"the {found.label} runtime has no multi-node mode")
    if size < 2:
        raise RuntimeVariantError(f"a multi-node replica spans at least 2 nodes, not {size}")
    launch = _launch(model_path, model_name, port, env, parameters, python)
    return found.cluster(launch, True, size), found.cluster(launch, False, size)


def fill_cluster_placeholders(
    texts: Sequence[str], *, main_host: str, rank: int, dist_port: int | None
) -> list[str]:
    """Return a part's argv with the main's host, the part's rank and (for workers, whose
    main already has it) the main's rendezvous port filled in."""
    filled = []
    for text in texts:
        text = text.replace(MAIN_HOST_PLACEHOLDER, main_host)
        text = text.replace(NODE_RANK_PLACEHOLDER, str(rank))
        if dist_port is not None:
            text = text.replace(DIST_PORT_PLACEHOLDER, str(dist_port))
        filled.append(text)
    return filled


def concurrency_of(chosen: Runtime | str, argv: Sequence[str]) -> int | None:
    """Return the requests the runtime started with `argv` runs at once, when that is known:
    its concurrency flag's (last) value, else its default."""
    found = _chosen(chosen)
    if found.concurrency is None:
        return None
    flag = found.concurrency.flag
    value: int | None = found.concurrency.default
    for index, arg in enumerate(argv):
        given = None
        if flag is not None and arg == flag and index + 1 < len(argv):
            given = argv[index + 1]
        elif flag is not None and arg.startswith(flag + "="):
            given = arg.partition("=")[2]
        if given is not None and given.isascii() and given.isdecimal() and int(given) > 0:
            value = int(given)
    return value


def metric_names() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Return every runtime's running and waiting gauge names, without repeats, in order."""
    running: list[str] = []
    waiting: list[str] = []
    for found in RUNTIMES.values():
        if found.metrics is not None:
            if found.metrics.running not in running:
                running.append(found.metrics.running)
            if found.metrics.waiting not in waiting:
                waiting.append(found.metrics.waiting)
    return tuple(running), tuple(waiting)
