"""Resolve what a revision runs (its `spec`, see `Revision`) from what the launcher was given.

The runtime variant decides where the command comes from:

- a variant with a built-in command (vllm, sglang, nim, modular-max, llama-cpp, simulator):
  `nodes.runtimes` builds it from the variables in `environ`, listening on `${PORT}`
  (the agent allocates the port), probed at the variant's health path;
- custom with a pasted command: `serving.definitions.command_import` reads it (runtime, port,
  health path, mount, served name);
- custom without one: the folder's model-definition.yaml (or the file `model_definition_path`
  names), whose first model is served.

For every variant, the folder's service-definition.toml supplies defaults for that variant's
variables and resource slots; what the launcher was given wins. Every problem found is reported
at once in one `LaunchError`, each at its file (empty for the launcher's own fields) and key path.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nexus.ports import controller_ports
from nodes.runtimes import (
    BACKEND_MODEL_NAME,
    PORT_PLACEHOLDER,
    RUNTIME_NAMES,
    RUNTIMES,
    ParameterError,
    Runtime,
    RuntimeVariantError,
    build_cluster,
    build_command,
    build_environ,
    checked_parameters,
    concurrency_of,
    runtime,
)
from serving import folders
from serving.definitions import (
    CommandImportError,
    DefinitionError,
    ModelDefinition,
    import_command,
    parse_model_definition,
    parse_service_definition,
)
from serving.definitions.command_import import DEFAULT_MOUNT
from serving.definitions.model_definition import DEFAULT_HEALTH_CHECK
from serving.definitions.values import key_path
from serving.models import FolderUsage, ModelFolder

# The folders a model definition may mount beside its model folder (the reference: general and
# data folders), and how many.
EXTRA_MOUNT_USAGES = (FolderUsage.GENERAL, FolderUsage.DATA)
MAX_EXTRA_MOUNTS = 8

CUSTOM = "custom"
# A replica spans at most this many nodes: one main and its workers.
MAX_CLUSTER_SIZE = 16
# What a pasted command's launch takes besides the command (each derived from it otherwise).
# Of those, the ones that set the health check's timings.
HEALTH_TIMINGS = ("interval", "initial_delay", "max_retries")
COMMAND_SETTINGS = ("port", "health_path", *HEALTH_TIMINGS)
# The variable a process allocated a port by the agent finds it in, for scripts that read $PORT.
PORT_VARIABLE = "PORT"
# Definition files are short text; a larger one is a mistake, not something to read whole.
MAX_DEFINITION_BYTES = 1024 * 1024
# Variants whose parallel sizes come from variables: variant -> prefix of VLLM_TP_SIZE etc.
PARALLEL_PREFIXES: Mapping[str, str] = {"vllm": "VLLM", "sglang": "SGLANG"}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# `$PORT` as a word of its own in a shell script (not `$PORTS`, not `${PORT}`).
_SHELL_PORT = re.compile(r"\$PORT\b")


@dataclass(frozen=True, slots=True)
class LaunchProblem:
    """One reason a service cannot be launched as given.

    `file` names the folder's file the problem is in, relative to the folder; it is empty for
    the launcher's own fields, whose name is then the start of `path` ("environ.VLLM_TP_SIZE").
    """

    file: str
    path: str
    message: str

    @property
    def where(self) -> str:
        """Return the file and key path together, "model-definition.yaml: models[0].port"."""
        return ": ".join(part for part in (self.file, self.path) if part)

    def __str__(self) -> str:
        return f"{self.where}: {self.message}" if self.where else self.message

    def to_dict(self) -> dict[str, str]:
        """Return the problem as JSON-ready values."""
        return {"file": self.file, "path": self.path, "message": self.message}


class LaunchError(ValueError):
    """Settings a service cannot be launched with; carries every problem, not only the first."""

    def __init__(self, problems: Sequence[LaunchProblem]) -> None:
        self.problems = tuple(problems)
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(str(problem) for problem in self.problems)

    def to_dict(self) -> dict[str, Any]:
        """Return every problem as JSON-ready values, with one line per problem in `detail`."""
        return {"detail": str(self), "problems": [p.to_dict() for p in self.problems]}


def problems_of(error: DefinitionError) -> list[LaunchProblem]:
    """Return a definition file's problems as launch problems in that file."""
    return [LaunchProblem(error.file, problem.path, problem.message) for problem in error.problems]


@dataclass(frozen=True)
class Launch:
    """A resolved launch: the revision's spec, and the facts the launcher shows about it.

    `source` is where the command came from: "variant", "command" or "model-definition".
    `runtime` is the server recognised (a pasted vLLM command is "vllm" under Custom).
    `resource_slots` are the service definition's defaults for the variant (mem in bytes).
    """

    runtime_variant: str
    source: str
    runtime: str
    spec: dict[str, Any]
    mount_destination: str
    model_path: str | None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    image: str | None = None
    resource_slots: dict[str, int | float] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    @property
    def command_line(self) -> str:
        """Return the command as one line, quoted so that a shell splits it back the same way."""
        return shlex.join(self.spec["argv"])

    @property
    def worker_command_line(self) -> str:
        """Return a multi-node replica's worker command as one line ("" on a single node)."""
        cluster = self.spec.get("cluster")
        return shlex.join(cluster["worker_argv"]) if cluster else ""

    def to_dict(self) -> dict[str, Any]:
        """Return the launch as JSON-ready values."""
        return {
            "runtime_variant": self.runtime_variant,
            "source": self.source,
            "runtime": self.runtime,
            "port": self.spec["port"],
            "model_name": self.spec["model_name"],
            "model_path": self.model_path,
            "mount_destination": self.mount_destination,
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "command_line": self.command_line,
            "health_check": self.spec["health_check"],
            "image": self.image,
            "resource_slots": dict(self.resource_slots),
            "warnings": list(self.warnings),
            "spec": self.spec,
        }


@dataclass
class _Defaults:
    """What service-definition.toml says for the chosen variant, and where it says it."""

    file: str = ""
    environ: dict[str, str] = field(default_factory=dict)
    resource_slots: dict[str, int | float] = field(default_factory=dict)
    image: str | None = None


def resolve_launch(
    *,
    model_folder: ModelFolder,
    runtime_variant: str,
    mount_destination: str = DEFAULT_MOUNT,
    model_definition_path: str = "",
    command: str = "",
    environ: Mapping[str, str] | None = None,
    model_name: str = "",
    runtime_parameters: Mapping[str, Any] | None = None,
    cluster_size: int = 1,
    command_settings: Mapping[str, Any] | None = None,
    extra_mounts: Sequence[Mapping[str, Any]] | None = None,
) -> Launch:
    """Return the resolved launch for these launcher settings; raise LaunchError listing why not.

    `command_settings` ({"port", "health_path", "interval", "initial_delay", "max_retries"},
    any of them)
    override what a pasted command (Custom) gives or defaults to.

    `model_name` is the name the server serves the model as, unless BACKEND_MODEL_NAME, the
    command or the model definition says otherwise; it defaults to the folder's name.
    `runtime_parameters` are the launcher's vLLM/SGLang tabs (nodes.runtimes.parameters);
    a `cluster_size` above 1 runs each replica as one main and workers on other nodes.
    `extra_mounts` ([{"folder", "destination"}], a model definition's only) mount more folders
    (general or data ones) beside the model folder; the spec keeps them as checked.
    """
    problems: list[LaunchProblem] = []
    try:
        chosen = runtime(runtime_variant)
    except RuntimeVariantError as unknown:
        raise LaunchError([LaunchProblem("", "runtime_variant", str(unknown))]) from None
    given = _checked_environ(environ, problems)
    parameters = _checked_parameters(chosen, runtime_parameters, problems)
    _check_cluster(chosen, cluster_size, problems)
    _check_mount(mount_destination, problems)
    before_mode = len(problems)
    _check_mode(chosen, command, model_definition_path, problems)
    overrides = _checked_command_settings(command_settings, command, problems)
    definition_mode = chosen.command is None and not command.strip()
    mounts = _checked_extra_mounts(extra_mounts, mount_destination, definition_mode, problems)
    try:
        folders.folder_root(model_folder)
    except folders.FolderError as missing:
        problems.append(LaunchProblem("", "model_folder", str(missing)))
        raise LaunchError(problems) from None
    defaults = _service_defaults(model_folder, chosen.name, problems)
    if len(problems) > before_mode and not _in_file(problems[before_mode:]):
        raise LaunchError(problems)  # the mode is unclear: what to resolve is too
    # Resolved even when other settings or service-definition.toml have problems, so that the
    # command's or model definition's problems are reported with theirs, all at once.
    name = model_name or model_folder.name
    try:
        if chosen.command is not None:
            launch = _from_variant(
                chosen,
                model_folder,
                mount_destination,
                given,
                defaults,
                name,
                parameters,
                cluster_size,
            )
        elif command.strip():
            launch = _from_command(command, mount_destination, given, defaults, name, overrides)
        else:
            launch = _from_model_definition(
                model_folder, model_definition_path, mount_destination, given, defaults
            )
    except LaunchError as refused:
        problems.extend(refused.problems)
    if problems:
        raise LaunchError(problems)
    if mounts:
        launch.spec["extra_mounts"] = mounts
    return launch


def _checked_extra_mounts(
    values: Sequence[Mapping[str, Any]] | None,
    mount_destination: str,
    definition_mode: bool,
    problems: list[LaunchProblem],
) -> list[dict[str, str]]:
    """Return the extra mounts as the spec keeps them, recording those that cannot be used: a
    general or data folder (never a model folder), each at its own absolute path outside the
    model folder's mount; only a model definition takes them, as the reference says."""
    if not values:
        return []
    if not definition_mode:
        message = "only a model definition (Custom, definition file) mounts more folders"
        problems.append(LaunchProblem("", "extra_mounts", message))
        return []
    if len(values) > MAX_EXTRA_MOUNTS:
        problems.append(LaunchProblem("", "extra_mounts", f"at most {MAX_EXTRA_MOUNTS}"))
        return []
    main = mount_destination.rstrip("/")
    taken: list[str] = []
    checked: list[dict[str, str]] = []
    for index, mount in enumerate(values):
        path = f"extra_mounts[{index}]"
        name = str(mount.get("folder") or "") if isinstance(mount, Mapping) else ""
        destination = str(mount.get("destination") or "") if isinstance(mount, Mapping) else ""
        folder = ModelFolder.objects.filter(name=name).first()
        if folder is None:
            problems.append(LaunchProblem("", path, f"no folder is named {name!r}"))
            continue
        if folder.usage not in EXTRA_MOUNT_USAGES:
            message = f"{name} is a {folder.get_usage_display().lower()} folder; only general "
            problems.append(LaunchProblem("", path, message + "and data folders are mounted"))
            continue
        inner: list[LaunchProblem] = []
        _check_mount(destination, inner)
        if inner:
            problems.append(LaunchProblem("", path, f"destination {inner[0].message}"))
            continue
        destination = destination.rstrip("/")
        overlapping = [main, *taken]
        if any(
            destination == other
            or destination.startswith(other + "/")
            or other.startswith(destination + "/")
            for other in overlapping
        ):
            message = f"{destination} overlaps another mount ({', '.join(overlapping)})"
            problems.append(LaunchProblem("", path, message))
            continue
        taken.append(destination)
        checked.append({"folder": name, "destination": destination})
    return checked


def _checked_command_settings(
    values: Mapping[str, Any] | None, command: str, problems: list[LaunchProblem]
) -> dict[str, Any]:
    """Return the pasted command's overridden settings, recording those that cannot be used."""
    if not values:
        return {}
    if not isinstance(values, Mapping):
        problems.append(LaunchProblem("", "command_settings", "must be a mapping"))
        return {}
    if not command.strip():
        message = "only a pasted command (Custom) takes these"
        problems.append(LaunchProblem("", "command_settings", message))
        return {}
    checked: dict[str, Any] = {}
    for key, value in values.items():
        path = key_path("command_settings", str(key))
        number = not isinstance(value, bool) and isinstance(value, int | float)
        if key == "port":
            if not (number and float(value).is_integer() and 1 <= value <= 65535):
                problems.append(LaunchProblem("", path, "must be an integer between 1 and 65535"))
                continue
            value = int(value)
        elif key == "health_path":
            if not isinstance(value, str) or not value.startswith("/"):
                problems.append(LaunchProblem("", path, 'must start with "/"'))
                continue
        elif key == "interval":
            if not number or value <= 0:
                problems.append(LaunchProblem("", path, "must be a number greater than 0"))
                continue
            value = float(value)
        elif key == "initial_delay":
            if not number or value < 0:
                problems.append(LaunchProblem("", path, "must be a number, 0 or more"))
                continue
            value = float(value)
        elif key == "max_retries":
            if not (number and float(value).is_integer() and value >= 0):
                problems.append(LaunchProblem("", path, "must be an integer, 0 or more"))
                continue
            value = int(value)
        else:
            known = ", ".join(COMMAND_SETTINGS)
            problems.append(LaunchProblem("", path, f"unknown setting; expected one of: {known}"))
            continue
        checked[key] = value
    return checked


def _in_file(problems: Sequence[LaunchProblem]) -> bool:
    """Say whether every problem is in one of the folder's files (none is the launcher's)."""
    return all(problem.file for problem in problems)


def _checked_parameters(
    chosen: Runtime, values: Mapping[str, Any] | None, problems: list[LaunchProblem]
) -> dict[str, str]:
    """Return the runtime's checked parameter values, recording every one it cannot use."""
    if not values:
        return {}
    if not isinstance(values, Mapping):
        problems.append(LaunchProblem("", "runtime_parameters", "must be a mapping of values"))
        return {}
    checked: dict[str, str] = {}
    for key, value in values.items():
        try:
            checked.update(checked_parameters(chosen, {key: value}))
        except ParameterError as refused:
            path = key_path("runtime_parameters", str(refused.key))
            problems.append(LaunchProblem("", path, refused.message))
    return checked


def _check_cluster(chosen: Runtime, size: object, problems: list[LaunchProblem]) -> None:
    """Record a cluster size that is not a whole number of nodes the runtime can span."""
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_CLUSTER_SIZE:
        message = f"must be a number of nodes from 1 to {MAX_CLUSTER_SIZE}, not {size!r}"
        problems.append(LaunchProblem("", "cluster_size", message))
    elif size > 1 and chosen.cluster is None:
        multi = ", ".join(name for name, found in RUNTIMES.items() if found.cluster is not None)
        message = f"{chosen.label} runs on a single node; multi-node runtimes: {multi}"
        problems.append(LaunchProblem("", "cluster_size", message))


def _checked_environ(
    environ: Mapping[str, str] | None, problems: list[LaunchProblem]
) -> dict[str, str]:
    """Return the launcher's variables, recording names and values a process cannot take."""
    if environ is None:
        return {}
    if not isinstance(environ, Mapping):
        problems.append(LaunchProblem("", "environ", "must be a mapping of names to values"))
        return {}
    checked: dict[str, str] = {}
    for name, value in environ.items():
        path = key_path("environ", name)
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            problems.append(
                LaunchProblem("", path, "is not a valid variable name (letters, digits and _)")
            )
        elif not isinstance(value, str):
            problems.append(LaunchProblem("", path, 'must be a string (quote numbers: "2")'))
        elif "\x00" in value:
            problems.append(LaunchProblem("", path, "may not contain a NUL character"))
        else:
            checked[name] = value
    return checked


def _check_mount(mount_destination: str, problems: list[LaunchProblem]) -> None:
    """Record a mount destination that is not a plain absolute directory path."""
    if not isinstance(mount_destination, str) or not mount_destination.startswith("/"):
        message = "must be an absolute path like /models"
    elif mount_destination == "/" or ".." in mount_destination.split("/"):
        message = "must name a directory below / without '..', like /models"
    elif any(character.isspace() or character == "\x00" for character in mount_destination):
        message = "may not contain spaces or control characters"
    else:
        return
    problems.append(LaunchProblem("", "mount_destination", message))


def _check_mode(
    chosen: Runtime,
    command: str,
    model_definition_path: str,
    problems: list[LaunchProblem],
) -> None:
    """Record a command or model definition given where it would not be used."""
    if chosen.command is not None:
        # Silently ignoring them would launch something other than what was pasted.
        for path, value in (("command", command), ("model_definition_path", model_definition_path)):
            if value.strip():
                problems.append(
                    LaunchProblem(
                        "",
                        path,
                        f"only the custom runtime variant takes one; {chosen.name} builds its "
                        "own command",
                    )
                )
    elif command.strip() and model_definition_path.strip():
        problems.append(
            LaunchProblem("", "command", "give a command or a model definition path, not both")
        )


def _read_definition(
    model_folder: ModelFolder, relative: str, field_name: str, problems: list[LaunchProblem]
) -> str | None:
    """Return a definition file's text from the folder, recording why it cannot be read."""
    try:
        path = folders.existing_file(model_folder, relative)
    except folders.FolderError as refused:
        problems.append(LaunchProblem("", field_name, str(refused)))
        return None
    if path.stat().st_size > MAX_DEFINITION_BYTES:
        problems.append(LaunchProblem(relative, "", "is larger than 1 MiB; is it the right file?"))
        return None
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        problems.append(LaunchProblem(relative, "", "is not UTF-8 text"))
        return None


def _service_defaults(
    model_folder: ModelFolder, variant_name: str, problems: list[LaunchProblem]
) -> _Defaults:
    """Return service-definition.toml's defaults for the variant; none without the file."""
    file = model_folder.service_definition_file
    if file is None:
        return _Defaults()
    text = _read_definition(model_folder, file, "model_folder", problems)
    if text is None:
        return _Defaults()
    try:
        definition = parse_service_definition(text, file=file)
    except DefinitionError as malformed:
        problems.extend(problems_of(malformed))
        return _Defaults()
    found = definition.for_variant(variant_name)
    if found is None:
        return _Defaults(file=file)
    return _Defaults(
        file=file,
        environ=dict(found.environ),
        resource_slots=dict(found.resource_slots),
        image=found.environment.image if found.environment else None,
    )


def _process_env(env: dict[str, str], port: int | None) -> dict[str, str]:
    """Return the env with PORT set to the allocated port when the agent allocates one."""
    # A shell script reads $PORT from its environment; the agent fills `${PORT}` in values too.
    # It wins over a PORT given by hand: the server must listen where the agent allocated.
    return {**env, PORT_VARIABLE: PORT_PLACEHOLDER} if port is None else env


def _health_check(path: str, initial_delay: float | None = None) -> dict[str, Any]:
    """Return a health check at path with DESIGN's default timings (a variant's first delay)."""
    check = {"path": path, **DEFAULT_HEALTH_CHECK}
    if initial_delay is not None:
        check["initial_delay"] = initial_delay
    return check


def _parallel_sizes(chosen: Runtime, env: Mapping[str, str]) -> tuple[int | None, ...]:
    """Return the tensor and pipeline parallel sizes the variant's variables ask for."""
    prefix = PARALLEL_PREFIXES.get(chosen.name)
    if prefix is None:
        return None, None
    # Checked by build_command already: a set value is a positive integer.
    return tuple(
        int(value) if (value := env.get(f"{prefix}_{kind}_SIZE", "").strip()) else None
        for kind in ("TP", "PP")
    )


def _from_variant(
    chosen: Runtime,
    model_folder: ModelFolder,
    mount_destination: str,
    given: dict[str, str],
    defaults: _Defaults,
    model_name: str,
    parameters: dict[str, str],
    cluster_size: int,
) -> Launch:
    """Return the launch of a variant's built-in command, listening on the agent's port."""
    env = {**defaults.environ, **given}
    warnings: list[str] = []
    model_path = _variant_model_path(chosen, model_folder, mount_destination, warnings)
    actions: list[dict[str, Any]] = []
    cluster: dict[str, Any] | None = None
    try:
        argv = build_command(
            chosen,
            model_path=model_path,
            model_name=model_name,
            port=PORT_PLACEHOLDER,
            env=env,
            parameters=parameters,
        )
        if cluster_size > 1:
            main, worker = build_cluster(
                chosen,
                size=cluster_size,
                model_path=model_path,
                model_name=model_name,
                port=PORT_PLACEHOLDER,
                env=env,
                parameters=parameters,
            )
            argv, actions = main.argv, main.pre_start_actions
            cluster = {
                "size": cluster_size,
                "worker_argv": worker.argv,
                "worker_pre_start_actions": worker.pre_start_actions,
            }
    except RuntimeVariantError as unusable:
        raise LaunchError([_variable_problem(str(unusable), chosen, given, defaults)]) from None
    process_env = build_environ(
        chosen, model_path=model_path, model_name=model_name, port=PORT_PLACEHOLDER, env=env
    )
    tensor, pipeline = _parallel_sizes(chosen, env)
    return Launch(
        runtime_variant=chosen.name,
        source="variant",
        runtime=chosen.name,
        spec={
            "argv": argv,
            "env": _process_env(process_env, None),
            "port": None,
            "model_name": parameters.get("served_model_name")
            or env.get(BACKEND_MODEL_NAME)
            or model_name,
            "health_check": _health_check(chosen.health_path, chosen.initial_delay),
            "pre_start_actions": actions,
            **_capacity(chosen.name, argv),
            **({"cluster": cluster} if cluster else {}),
        },
        mount_destination=mount_destination,
        model_path=model_path,
        tensor_parallel_size=tensor,
        pipeline_parallel_size=pipeline,
        image=defaults.image,
        resource_slots=defaults.resource_slots,
        warnings=tuple(warnings),
    )


def _variant_model_path(
    chosen: Runtime, model_folder: ModelFolder, mount_destination: str, warnings: list[str]
) -> str:
    """Return the model path the variant's command gets: the mount, or llama.cpp's .gguf file."""
    if chosen.name != "llama-cpp":
        return mount_destination
    # llama-server loads one file, not a directory; the first of a split model's shards is the
    # one it is given, and sorting puts "-00001-of-" first.
    ggufs = [f.path for f in folders.list_files(model_folder).files if f.path.endswith(".gguf")]
    if not ggufs:
        raise LaunchError(
            [
                LaunchProblem(
                    "",
                    "model_folder",
                    f"llama.cpp serves a .gguf file and the model folder {model_folder.name!r} "
                    "holds none; upload one",
                )
            ]
        )
    if len(ggufs) > 1:
        warnings.append(f"the folder holds {len(ggufs)} .gguf files; serving {ggufs[0]}")
    return posixpath.join(mount_destination, ggufs[0])


def _variable_problem(
    message: str, chosen: Runtime, given: Mapping[str, str], defaults: _Defaults
) -> LaunchProblem:
    """Return the problem of a variable the variant refused, at the place it was set."""
    # RuntimeVariantError's messages start with the variable's name ("VLLM_TP_SIZE must be ...").
    name, _, rest = message.partition(" ")
    if name in given:
        return LaunchProblem("", key_path("environ", name), rest)
    if name in defaults.environ:
        path = key_path(key_path(chosen.name, "environ"), name)
        return LaunchProblem(defaults.file, path, rest)
    return LaunchProblem("", "environ", message)


def _from_command(
    command: str,
    mount_destination: str,
    given: dict[str, str],
    defaults: _Defaults,
    model_name: str,
    overrides: Mapping[str, Any],
) -> Launch:
    """Return the launch of a pasted command line (Custom), with its overridden settings."""
    try:
        imported = import_command(command)
    except CommandImportError as unreadable:
        raise LaunchError([LaunchProblem("", "command", str(unreadable))]) from None
    argv = [PORT_PLACEHOLDER if arg == "$PORT" else arg for arg in imported.argv]
    if _mentions_port(argv):
        if "port" in overrides:
            message = "the command listens on ${PORT}, which the agent allocates; leave it empty"
            raise LaunchError([LaunchProblem("", "command_settings.port", message)])
        port = None
    else:
        port = overrides.get("port", imported.port)
    _refuse_controller_port(port, "", "command_settings.port" if "port" in overrides else "command")
    health_check = _health_check(overrides.get("health_path", imported.health_path))
    health_check.update({key: overrides[key] for key in HEALTH_TIMINGS if key in overrides})
    warnings = list(imported.warnings)
    if imported.image is not None:
        warnings.append(
            f"the command runs as a process on the node; the image {imported.image} is not pulled"
        )
    # A mount the command names (docker's -v) is where its paths point; else the launcher's.
    mount = imported.mount if imported.mount != DEFAULT_MOUNT else mount_destination
    env = {**defaults.environ, **imported.env, **given}
    return Launch(
        runtime_variant=CUSTOM,
        source="command",
        runtime=imported.runtime,
        spec={
            "argv": argv,
            "env": _process_env(env, port),
            "port": port,
            "model_name": imported.served_model_name or model_name,
            "health_check": health_check,
            "pre_start_actions": [],
            **_capacity(imported.runtime, argv),
        },
        mount_destination=mount,
        model_path=imported.model_path,
        tensor_parallel_size=imported.tensor_parallel_size,
        pipeline_parallel_size=imported.pipeline_parallel_size,
        image=imported.image or defaults.image,
        resource_slots=defaults.resource_slots,
        warnings=tuple(warnings),
    )


def _refuse_controller_port(port: int | None, file: str, path: str) -> None:
    """Refuse a fixed port that one of the controller's own processes listens on."""
    used_by = controller_ports().get(port) if port is not None else None
    if used_by is not None:
        message = (
            f"port {port} is Nexus's own, used by {used_by}; listen on ${{PORT}} (a port the "
            "agent allocates) or on another port"
        )
        raise LaunchError([LaunchProblem(file, path, message)])


def _capacity(runtime_name: str, argv: Sequence[str]) -> dict[str, int]:
    """Return the spec's `capacity`, the requests a replica runs at once, when the runtime's
    command tells it (its pool target then takes no more than that)."""
    known = runtime_name in RUNTIME_NAMES and concurrency_of(runtime_name, argv)
    return {"capacity": known} if known else {}


def _mentions_port(argv: Sequence[str]) -> bool:
    """Return whether the command leaves its port to the agent (`${PORT}`, or $PORT in a script)."""
    return any(PORT_PLACEHOLDER in arg or _SHELL_PORT.search(arg) for arg in argv)


def _from_model_definition(
    model_folder: ModelFolder,
    model_definition_path: str,
    mount_destination: str,
    given: dict[str, str],
    defaults: _Defaults,
) -> Launch:
    """Return the launch of the first model in the folder's model definition (Custom)."""
    problems: list[LaunchProblem] = []
    relative = model_definition_path.strip() or model_folder.model_definition_file
    if relative is None:
        raise LaunchError(
            [
                LaunchProblem(
                    "",
                    "model_definition_path",
                    f"the model folder {model_folder.name!r} has no model-definition.yaml; "
                    "upload one, or paste a command",
                )
            ]
        )
    text = _read_definition(model_folder, relative, "model_definition_path", problems)
    if text is None:
        raise LaunchError(problems)
    try:
        definition = parse_model_definition(text, file=relative)
    except DefinitionError as malformed:
        raise LaunchError(problems_of(malformed)) from None
    return _definition_launch(definition, relative, mount_destination, given, defaults)


def _definition_launch(
    definition: ModelDefinition,
    file: str,
    mount_destination: str,
    given: dict[str, str],
    defaults: _Defaults,
) -> Launch:
    """Return the launch of a parsed model definition's first model."""
    model, *others = definition.models
    service = model.service
    if service is None:
        raise LaunchError(
            [LaunchProblem(file, "models[0].service", "required: the first model is served")]
        )
    warnings = []
    if others:
        ignored = ", ".join(other.name for other in others)
        warnings.append(f"only the first model, {model.name}, is served; ignored: {ignored}")
    argv = list(service.start_command)
    port = None if _mentions_port(argv) else service.port
    _refuse_controller_port(port, file, "models[0].service.port")
    tensor, pipeline = _command_sizes(argv)
    return Launch(
        runtime_variant=CUSTOM,
        source="model-definition",
        runtime=CUSTOM,
        spec={
            "argv": argv,
            "env": _process_env({**defaults.environ, **given}, port),
            "port": port,
            "model_name": model.name,
            "health_check": service.health_check.to_dict() if service.health_check else None,
            "pre_start_actions": [action.to_dict() for action in service.pre_start_actions],
        },
        mount_destination=mount_destination,
        model_path=model.model_path,
        tensor_parallel_size=tensor,
        pipeline_parallel_size=pipeline,
        image=defaults.image,
        resource_slots=defaults.resource_slots,
        warnings=tuple(warnings),
    )


def _command_sizes(argv: Sequence[str]) -> tuple[int | None, int | None]:
    """Return the parallel sizes a start command asks for, as far as the importer can tell."""
    try:
        imported = import_command(shlex.join(argv))
    except CommandImportError:
        # Only shown to the user; the definition's command runs as written either way.
        return None, None
    return imported.tensor_parallel_size, imported.pipeline_parallel_size
