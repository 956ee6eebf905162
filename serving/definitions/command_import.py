"""Read a pasted server command line into the launcher's fields.

`import_command("vllm serve /models/my-model --tp 2")` recognises the runtime, its port, model
path, served name, parallel sizes and variables, unwrapping `docker run` (its `-e`, `-v` and `-p`
are read, the image names the runtime) and `sh -c`. Nothing is run; the line is only split like a
shell would split it. What could not be used is listed in `warnings`.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from nodes.runtimes import LLAMA_SERVER_HEALTH_PATH, PORT_PLACEHOLDER
from nodes.runtimes import runtime as variant

DEFAULT_MOUNT = "/models"
PORT_OPTIONS = ("--port", "-p")
TENSOR_PARALLEL_OPTIONS = ("--tensor-parallel-size", "--tp", "-tp", "--tp-size")
PIPELINE_PARALLEL_OPTIONS = ("--pipeline-parallel-size", "--pp", "-pp", "--pp-size")
# Per runtime: the options naming the model's path, and those naming the served model.
MODEL_OPTIONS: Mapping[str, tuple[str, ...]] = {
    "vllm": ("--model",),
    "sglang": ("--model-path", "--model"),
    "nim": (),
    "modular-max": ("--model-path", "--model"),
    "llama-cpp": ("--model", "-m"),
    "custom": ("--model", "--model-path"),
    # The simulator serves no files; its --model is the served name.
    "simulator": (),
}
NAME_OPTIONS: Mapping[str, tuple[str, ...]] = {
    "vllm": ("--served-model-name",),
    "sglang": ("--served-model-name",),
    "nim": (),
    "modular-max": ("--served-model-name",),
    # llama-server's and llama-cpp-python's server's.
    "llama-cpp": ("--alias", "-a", "--model_alias"),
    "custom": ("--served-model-name",),
    "simulator": ("--model",),
}
# Where a server listens when its command names no port; SGLang's own default (30000) is not
# the port the SGLang variant launches on (9001), so it is listed here.
SERVER_DEFAULT_PORTS: Mapping[str, int] = {"sglang": 30000}
# Variables some servers read their port and served name from.
PORT_VARIABLES: Mapping[str, str] = {"nim": "NIM_SERVER_PORT", "modular-max": "MAX_SERVE_PORT"}
NAME_VARIABLES: Mapping[str, str] = {"nim": "NIM_SERVED_MODEL_NAME"}
# Python modules that are servers: `python -m <module>`.
PYTHON_MODULES: Mapping[str, str] = {
    "vllm.entrypoints.openai.api_server": "vllm",
    "sglang.launch_server": "sglang",
    "llama_cpp.server": "llama-cpp",
    "serving.runtimes.simulator": "simulator",
}
# docker run options that take a value; every other option is a flag. Grouped by topic.
# fmt: off
DOCKER_VALUE_OPTIONS = frozenset({
    "-e", "--env", "--env-file", "-v", "--volume", "--volume-driver", "--volumes-from", "--mount",
    "--tmpfs", "-p", "--publish", "--expose", "--entrypoint", "-w", "--workdir", "-u", "--user",
    "--name", "-h", "--hostname", "--domainname", "-l", "--label", "--label-file", "--annotation",
    "--network", "--net", "--network-alias", "--net-alias", "--ip", "--ip6", "--link",
    "--link-local-ip", "--mac-address", "--add-host", "--dns", "--dns-option", "--dns-search",
    "--gpus", "--device", "--device-cgroup-rule", "--device-read-bps", "--device-read-iops",
    "--device-write-bps", "--device-write-iops", "--runtime", "--ipc", "--pid", "--uts",
    "--userns", "--cgroupns", "--cgroup-parent", "--isolation", "--platform", "--pull",
    "--restart", "-m", "--memory", "--memory-reservation", "--memory-swap", "--memory-swappiness",
    "--kernel-memory", "--shm-size", "-c", "--cpu-shares", "--cpus", "--cpu-period",
    "--cpu-quota", "--cpu-rt-period", "--cpu-rt-runtime", "--cpuset-cpus", "--cpuset-mems",
    "--blkio-weight", "--blkio-weight-device", "--pids-limit", "--ulimit", "--oom-score-adj",
    "--storage-opt", "--sysctl", "--cap-add", "--cap-drop", "--security-opt", "--group-add",
    "--log-driver", "--log-opt", "--health-cmd", "--health-interval", "--health-retries",
    "--health-start-interval", "--health-start-period", "--health-timeout", "--stop-signal",
    "--stop-timeout", "--cidfile", "-a", "--attach", "--detach-keys",
})
DOCKER_FLAGS = frozenset({
    "-d", "--detach", "-i", "--interactive", "-t", "--tty", "--rm", "--init", "--privileged",
    "-P", "--publish-all", "-q", "--quiet", "--read-only", "--sig-proxy", "--no-healthcheck",
    "--oom-kill-disable", "--disable-content-trust", "--use-api-socket",
})
# fmt: on
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.DOTALL)
_SHELL_OPERATORS = frozenset({"&&", "||", ";", "|", "&"})


class CommandImportError(ValueError):
    """A command line that cannot be read; the message says why in plain words."""


@dataclass(frozen=True)
class ImportedCommand:
    """What a pasted command line says about the service that runs it.

    `argv` is the server's command after `docker run` and `sh -c` are unwrapped (a known image
    contributes its entrypoint); the parallel sizes are None when the command does not set them.
    """

    runtime: str
    port: int
    health_path: str
    mount: str
    model_path: str | None
    served_model_name: str | None
    tensor_parallel_size: int | None
    pipeline_parallel_size: int | None
    env: Mapping[str, str]
    argv: tuple[str, ...]
    image: str | None = None
    warnings: tuple[str, ...] = field(default=())

    @property
    def command_line(self) -> str:
        """Return argv as one line, quoted so that a shell splits it back the same way."""
        return shlex.join(self.argv)

    def to_dict(self) -> dict[str, Any]:
        """Return the imported fields as JSON-ready values."""
        return {
            "runtime": self.runtime,
            "port": self.port,
            "health_path": self.health_path,
            "mount": self.mount,
            "model_path": self.model_path,
            "served_model_name": self.served_model_name,
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "env": dict(self.env),
            "argv": list(self.argv),
            "command_line": self.command_line,
            "image": self.image,
            "warnings": list(self.warnings),
        }


@dataclass
class _Container:
    """What `docker run` said besides the server's command."""

    image: str
    runtime: str = "custom"
    volumes: list[str] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)


@dataclass
class _Reading:
    """What has been read so far."""

    env: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    container: _Container | None = None
    # The server's own health route, where its variant's is not the one it answers.
    health_path: str | None = None


def import_command(line: str) -> ImportedCommand:
    """Return what the command line says; raise CommandImportError when it cannot be read."""
    reading = _Reading()
    argv = _assignments(_split(line), reading)
    if len(argv) >= 2 and _program(argv[0]) in ("docker", "podman"):
        argv = _docker(argv, reading)
    argv, recognised = _shell(argv, reading)
    if recognised:
        runtime, options, positional_model = _recognise(recognised)
        if _program(recognised[0]) == "llama-server":
            # The variant runs llama-cpp-python's server; the C++ one has a readiness route.
            reading.health_path = LLAMA_SERVER_HEALTH_PATH
    else:
        # Only `docker run` leaves nothing to run: an image given no command, whose own command
        # is not known. Its runtime is the image's.
        assert reading.container is not None
        runtime, options, positional_model = reading.container.runtime, [], None
    return _fields(runtime, argv, options, positional_model, reading)


def _split(line: str) -> list[str]:
    # A backslash at the end of a line continues the command on the next one.
    text = re.sub(r"\\\r?\n", " ", line)
    try:
        argv = shlex.split(text)
    except ValueError as error:
        if "quotation" in str(error):
            raise CommandImportError(
                "unbalanced quote: a quote is opened and never closed"
            ) from None
        raise CommandImportError("the command ends with a lone backslash") from None
    # A pasted shell prompt is not part of the command.
    if argv[:1] == ["$"]:
        argv = argv[1:]
    if not argv:
        raise CommandImportError("the command is empty")
    return argv


def _program(arg: str) -> str:
    return posixpath.basename(arg)


def _assignments(argv: list[str], reading: _Reading) -> list[str]:
    """Take `K=V` assignments (and `env`, `sudo`) off the front of the command into env."""
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg in ("env", "sudo"):
            index += 1
        elif match := _ASSIGNMENT.fullmatch(arg):
            reading.env[match.group(1)] = match.group(2)
            index += 1
        else:
            break
    if index == len(argv):
        raise CommandImportError("the command sets variables but runs nothing")
    return argv[index:]


def _docker(argv: list[str], reading: _Reading) -> list[str]:
    """Return the container's command from `docker run [options] image [args]`."""
    args = argv[1:]
    if args[:2] == ["container", "run"]:
        args = args[1:]
    if args[:1] != ["run"]:
        return argv
    args = args[1:]
    entrypoint: str | None = None
    ignored: list[str] = []
    volumes: list[str] = []
    ports: list[int] = []
    index = 0
    while index < len(args) and args[index].startswith("-") and args[index] != "-":
        option, value, index = _docker_option(args, index)
        if option is None:
            ignored.append(args[index - 1])
        elif option in ("-e", "--env"):
            _docker_env(value, reading)
        elif option in ("-v", "--volume"):
            volumes += _volume_target(value)
        elif option == "--mount":
            volumes += _mount_target(value)
        elif option in ("-p", "--publish"):
            ports += _published_port(value, reading)
        elif option == "--entrypoint":
            entrypoint = value
        elif value is None:
            ignored.append(option)
        else:
            ignored.append(f"{option} {value}")
    if index == len(args):
        raise CommandImportError("docker run needs an image to run")
    if ignored:
        reading.warnings.append(f"docker options ignored: {', '.join(ignored)}")
    image, command = args[index], args[index + 1 :]
    runtime, image_entrypoint = _image_entrypoint(image, command, reading)
    reading.container = _Container(image=image, runtime=runtime, volumes=volumes, ports=ports)
    if entrypoint is not None:
        return [entrypoint, *command]
    return [*image_entrypoint, *command]


def _docker_option(args: Sequence[str], index: int) -> tuple[str | None, str | None, int]:
    """Return (option, value, next index); option is None for one docker does not list."""
    arg = args[index]
    if arg.startswith("--") and "=" in arg:
        option, value = arg.split("=", 1)
        return option, value, index + 1
    if arg in DOCKER_VALUE_OPTIONS:
        if index + 1 == len(args):
            raise CommandImportError(f"docker option {arg} needs a value")
        return arg, args[index + 1], index + 2
    if arg in DOCKER_FLAGS:
        return arg, None, index + 1
    if not arg.startswith("--"):
        # A cluster of short options, as in -it, -dit or -p8000:8000: flags, then maybe one
        # option whose value is the rest of the word or the next word.
        for position, letter in enumerate(arg[1:], start=1):
            short = f"-{letter}"
            if short in DOCKER_FLAGS:
                continue
            if short not in DOCKER_VALUE_OPTIONS:
                break
            rest = arg[position + 1 :]
            if rest:
                return short, rest, index + 1
            if index + 1 == len(args):
                raise CommandImportError(f"docker option {short} needs a value")
            return short, args[index + 1], index + 2
        else:
            return arg, None, index + 1
    # Unknown to this list: read as a flag, since a wrongly taken value would become the image.
    return None, None, index + 1


def _docker_env(value: str | None, reading: _Reading) -> None:
    match = _ASSIGNMENT.fullmatch(value or "")
    if match is None:
        reading.warnings.append(
            f"-e {value} ignored: it passes a variable from your shell, which Nexus cannot see"
        )
    else:
        reading.env[match.group(1)] = match.group(2)


def _volume_target(value: str | None) -> list[str]:
    """Return the container path of `-v host:/container[:options]`; none for a bare path."""
    parts = (value or "").split(":")
    return [parts[1]] if len(parts) >= 2 and parts[1].startswith("/") else []


def _mount_target(value: str | None) -> list[str]:
    """Return the target of `--mount type=bind,source=...,target=/models`."""
    for item in (value or "").split(","):
        key, _, target = item.partition("=")
        if key in ("target", "destination", "dst") and target.startswith("/"):
            return [target]
    return []


def _published_port(value: str | None, reading: _Reading) -> list[int]:
    """Return the container port of `-p [ip:]host:container[/proto]` (or `-p container`)."""
    container_side = (value or "").rsplit(":", 1)[-1].split("/", 1)[0]
    if _is_number(container_side) and 1 <= int(container_side) <= 65535:
        return [int(container_side)]
    reading.warnings.append(f"-p {value} ignored: not a single container port")
    return []


def _image_entrypoint(
    image: str, command: Sequence[str], reading: _Reading
) -> tuple[str, list[str]]:
    """Return the image's runtime and the server command it runs before the arguments after it."""
    repository = _repository(image)
    last = repository.rsplit("/", 1)[-1]
    if last == "vllm-openai":
        return "vllm", ["vllm", "serve"]
    if last.startswith("max-") and repository.split("/")[-2:-1] == ["modular"]:
        return "modular-max", ["max", "serve"]
    if last == "llama.cpp":
        return "llama-cpp", ["llama-server"]
    if repository.startswith("nvcr.io/nim/"):
        return "nim", [] if command else ["/opt/nim/start_server.sh"]
    if last == "sglang":
        # SGLang's images run what they are given: the arguments are the whole command.
        if not command:
            reading.warnings.append(f"the image {image} was given no command to run")
        return "sglang", []
    if command:
        reading.warnings.append(
            f"the image {image} is not one Nexus knows; only the command after it was kept"
        )
    else:
        reading.warnings.append(
            f"the image {image} is not one Nexus knows and no command follows it"
        )
    return "custom", []


def _repository(image: str) -> str:
    """Return an image's repository without tag, digest or the default registry."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        name = name[:colon]
    for prefix in ("docker.io/", "index.docker.io/", "library/"):
        name = name.removeprefix(prefix)
    return name


def _shell(argv: list[str], reading: _Reading) -> tuple[list[str], list[str]]:
    """Unwrap `sh -c "script"`: return (argv to run, the command to recognise).

    A one-command script becomes that command. A longer one (`pip install x && vllm serve ...`)
    is kept whole as argv, and its last command is the one recognised.
    """
    if len(argv) < 3 or _program(argv[0]) not in ("sh", "bash") or not _is_c_flag(argv[1]):
        return argv, argv
    try:
        lexer = shlex.shlex(argv[2], posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = list(lexer)
    except ValueError:
        raise CommandImportError("unbalanced quote in the sh -c script") from None
    commands: list[list[str]] = [[]]
    for word in words:
        if word in _SHELL_OPERATORS:
            commands.append([])
        else:
            commands[-1].append(word)
    commands = [command for command in commands if command]
    if not commands:
        raise CommandImportError("the sh -c script is empty")
    if len(commands) == 1:
        unwrapped = _assignments(commands[0], reading)
        return unwrapped, unwrapped
    return argv, _assignments(commands[-1], reading)


def _is_c_flag(arg: str) -> bool:
    return arg.startswith("-") and not arg.startswith("--") and arg.endswith("c")


def _recognise(argv: list[str]) -> tuple[str, list[str], str | None]:
    """Return (runtime, its options, the model given as a positional argument, if any)."""
    program = _program(argv[0])
    if program == "vllm" and argv[1:2] == ["serve"]:
        rest = argv[2:]
        if rest and not rest[0].startswith("-"):
            return "vllm", rest[1:], rest[0]
        return "vllm", rest, None
    if _PYTHON.fullmatch(program) and len(argv) >= 3 and argv[1] == "-m":
        runtime = PYTHON_MODULES.get(argv[2])
        if runtime is not None:
            return runtime, argv[3:], None
    if program == "max" and argv[1:2] == ["serve"]:
        return "modular-max", argv[2:], None
    if program == "llama-server":
        return "llama-cpp", argv[1:], None
    if program == "start_server.sh" and argv[0].startswith("/opt/nim/"):
        return "nim", argv[1:], None
    return "custom", argv[1:], None


def _fields(
    runtime: str,
    argv: list[str],
    options: list[str],
    positional_model: str | None,
    reading: _Reading,
) -> ImportedCommand:
    values = _option_values(options, runtime, reading)
    env = reading.env
    model_path = values["model"][1] if "model" in values else positional_model
    served_name = values["name"][1] if "name" in values else None
    if served_name is None and runtime in NAME_VARIABLES:
        served_name = env.get(NAME_VARIABLES[runtime])
    container = reading.container
    return ImportedCommand(
        runtime=runtime,
        port=_port(runtime, values.get("port"), reading),
        health_path=reading.health_path or variant(runtime).health_path,
        mount=_mount(model_path, container.volumes if container else [], reading),
        model_path=model_path,
        served_model_name=served_name,
        tensor_parallel_size=_size(values.get("tp")),
        pipeline_parallel_size=_size(values.get("pp")),
        env=MappingProxyType(dict(env)),
        argv=tuple(argv),
        image=container.image if container else None,
        warnings=tuple(reading.warnings),
    )


def _port(runtime: str, given: tuple[str, str] | None, reading: _Reading) -> int:
    """Return where the server listens: its port option, its port variable, else its default.

    `--port ${PORT}` leaves the port to the agent, which allocates one; the variant's default is
    declared then. A port docker publishes is the container's port, so it is the answer only
    when the server's own is unknown (Custom); otherwise a difference is a warning.
    """
    published = reading.container.ports if reading.container else []
    if given is not None and given[1] in (PORT_PLACEHOLDER, "$PORT"):
        return variant(runtime).port
    port = None
    if given is not None:
        port = _port_number(*given)
    elif runtime in PORT_VARIABLES and PORT_VARIABLES[runtime] in reading.env:
        name = PORT_VARIABLES[runtime]
        port = _port_number(name, reading.env[name])
    elif runtime == "custom" and published:
        port = published[0]
    if port is None:
        port = SERVER_DEFAULT_PORTS.get(runtime, variant(runtime).port)
    if published and port not in published:
        listed = ", ".join(str(number) for number in published)
        reading.warnings.append(
            f"docker publishes container port {listed} but the server listens on {port}; "
            f"using {port}"
        )
    return port


def _is_number(text: str) -> bool:
    """Return whether the text is ASCII digits (str.isdigit also passes "²", which int refuses)."""
    return text.isascii() and text.isdigit()


def _port_number(option: str, value: str) -> int:
    if _is_number(value) and 1 <= int(value) <= 65535:
        return int(value)
    raise CommandImportError(f"{option} must be a port number between 1 and 65535, not {value!r}")


def _size(given: tuple[str, str] | None) -> int | None:
    if given is None:
        return None
    option, value = given
    if _is_number(value) and int(value) >= 1:
        return int(value)
    raise CommandImportError(f"{option} must be a positive integer, not {value!r}")


def _mount(model_path: str | None, volumes: list[str], reading: _Reading) -> str:
    """Return where the model folder is mounted: the docker volume holding the model, else
    the first volume, else /models."""
    absolute = model_path if model_path and model_path.startswith("/") else None
    mount = DEFAULT_MOUNT
    if volumes:
        holding = [volume for volume in volumes if absolute and _under(absolute, volume)]
        mount = holding[0] if holding else volumes[0]
        if not holding and len(volumes) > 1:
            reading.warnings.append(
                f"several volumes are mounted; {mount} is taken as the model folder's mount"
            )
    if absolute and not _under(absolute, mount):
        reading.warnings.append(f"the model path {absolute} is not under the mount {mount}")
    return mount


def _under(path: str, folder: str) -> bool:
    path, folder = posixpath.normpath(path), posixpath.normpath(folder)
    return folder == "/" or path == folder or path.startswith(folder + "/")


def _option_values(
    options: list[str], runtime: str, reading: _Reading
) -> dict[str, tuple[str, str]]:
    """Return the known options' values by field: field -> (option as written, value).

    Options unknown here are skipped whether or not they take a value: none of their values can
    be mistaken for a known option. The last occurrence wins, as with the servers' own parsers.
    """
    fields = {
        **dict.fromkeys(PORT_OPTIONS, "port"),
        **dict.fromkeys(TENSOR_PARALLEL_OPTIONS, "tp"),
        **dict.fromkeys(PIPELINE_PARALLEL_OPTIONS, "pp"),
        **dict.fromkeys(MODEL_OPTIONS[runtime], "model"),
        **dict.fromkeys(NAME_OPTIONS[runtime], "name"),
    }
    values: dict[str, tuple[str, str]] = {}
    index = 0
    while index < len(options):
        arg = options[index]
        option, has_value, value = arg.partition("=")
        index += 1
        if option not in fields:
            continue
        if not has_value:
            if index == len(options):
                raise CommandImportError(f"{option} needs a value")
            value = options[index]
            index += 1
        name = fields[option]
        values[name] = (option, value)
        if name == "name":
            # vLLM and SGLang take several served names; the first is the one shown.
            extra = []
            while index < len(options) and not options[index].startswith("-"):
                extra.append(options[index])
                index += 1
            if extra:
                reading.warnings.append(
                    f"{option}: using {value!r}; other names ignored: {', '.join(extra)}"
                )
    return values
