"""model-definition.yaml: the models a folder serves, how each is started and health-checked.

`parse_model_definition` checks the whole file and raises one `DefinitionError` listing every
problem, each at its key path ("models[0].service.port: required").
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import yaml

from .errors import DefinitionError, Problem
from .values import (
    NO_VALUE,
    Problems,
    check_boolean,
    check_integer,
    check_keys,
    check_mapping,
    check_number,
    check_string,
    item_path,
    key_path,
    require,
)

DEFAULT_FILE = "model-definition.yaml"

TOP_LEVEL_KEYS = ("models",)
MODEL_KEYS = ("name", "model_path", "service")
SERVICE_KEYS = ("pre_start_actions", "start_command", "port", "health_check")
HEALTH_CHECK_KEYS = (
    "path",
    "interval",
    "max_retries",
    "max_wait_time",
    "expected_status_code",
    "initial_delay",
)
ACTION_KEYS = ("action", "args")
# Files written by write_file and write_tempfile get these permissions unless `mode` says.
DEFAULT_FILE_MODE = 0o644
# Each pre-start action's arguments: name -> (kind, default), REQUIRED as the default for those
# without one. Kinds: "path" is a non-empty string, "text" any string (empty too), "boolean"
# true or false, "mode" an octal permission, "command" a list of strings or a string split like
# a shell would.
REQUIRED = object()
ACTION_ARGS: Mapping[str, Mapping[str, tuple[str, object]]] = {
    "write_file": {
        "filename": ("path", REQUIRED),
        "body": ("text", REQUIRED),
        "mode": ("mode", DEFAULT_FILE_MODE),
        "append": ("boolean", False),
    },
    "write_tempfile": {"body": ("text", REQUIRED), "mode": ("mode", DEFAULT_FILE_MODE)},
    "run_command": {"command": ("command", REQUIRED)},
    "mkdir": {"path": ("path", REQUIRED)},
    "log": {"message": ("text", REQUIRED), "debug": ("boolean", False)},
}
ACTIONS = tuple(ACTION_ARGS)
# "644", "0644" and "0o644": three or four octal digits.
_OCTAL_MODE = re.compile(r"(?:0o|0)?([0-7]{3,4})")


@dataclass(frozen=True)
class HealthCheck:
    """How a replica is probed; times are in seconds."""

    path: str
    interval: float = 10.0
    max_retries: int = 10
    max_wait_time: float = 15.0
    expected_status_code: int = 200
    initial_delay: float = 60.0

    def to_dict(self) -> dict[str, Any]:
        """Return the health check as JSON-ready values, defaults filled in."""
        return {key: getattr(self, key) for key in HEALTH_CHECK_KEYS}


DEFAULT_HEALTH_CHECK = {key: getattr(HealthCheck, key) for key in HEALTH_CHECK_KEYS[1:]}


@dataclass(frozen=True)
class PreStartAction:
    """One step run before the start command, with its checked arguments, defaults filled in.

    `mode` arguments are permission bits (0o644); `command` arguments are tuples of strings.
    """

    action: str
    args: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """Return the action as JSON-ready values; a mode is written as octal ("0644")."""
        args: dict[str, Any] = {}
        for name, value in self.args.items():
            kind = ACTION_ARGS[self.action][name][0]
            if kind == "mode":
                args[name] = f"{value:04o}"
            elif kind == "command":
                args[name] = list(value)
            else:
                args[name] = value
        return {"action": self.action, "args": args}


@dataclass(frozen=True)
class ServiceSpec:
    """How a model's server process is prepared, started and checked."""

    start_command: tuple[str, ...]
    port: int
    pre_start_actions: tuple[PreStartAction, ...] = ()
    health_check: HealthCheck | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the service as JSON-ready values; an absent health check is left out."""
        data: dict[str, Any] = {
            "pre_start_actions": [action.to_dict() for action in self.pre_start_actions],
            "start_command": list(self.start_command),
            "port": self.port,
        }
        if self.health_check is not None:
            data["health_check"] = self.health_check.to_dict()
        return data


@dataclass(frozen=True)
class ModelSpec:
    """One model of the folder: its name, where it lies, and how it is served."""

    name: str
    model_path: str
    service: ServiceSpec | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the model as JSON-ready values; an absent service is left out."""
        data: dict[str, Any] = {"name": self.name, "model_path": self.model_path}
        if self.service is not None:
            data["service"] = self.service.to_dict()
        return data


@dataclass(frozen=True)
class ModelDefinition:
    """A parsed model-definition.yaml."""

    models: tuple[ModelSpec, ...]

    def to_dict(self) -> dict[str, Any]:
        """Return the definition as JSON-ready values, in the file's own shape."""
        return {"models": [model.to_dict() for model in self.models]}


class _DefinitionLoader(yaml.SafeLoader):
    """YAML's safe loader, stricter where the default would silently lose what was written.

    A key written twice is an error (YAML keeps the last one without a word), and integers with
    a leading zero are decimal as in YAML 1.2, so `mode: 0644` means 644 (octal digits), not
    YAML 1.1's 420.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key; the base class reports it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f'duplicate key "{key}"', key_node.start_mark
                )
        return super().construct_mapping(node, deep=deep)


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node)
    if re.fullmatch(r"[-+]?0[0-7_]+", text):
        return int(text.replace("_", ""), 10)
    return loader.construct_yaml_int(node)


_DefinitionLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def load_yaml(text: str, file: str) -> Any:
    """Return the parsed YAML document; raise DefinitionError naming the line and column."""
    try:
        # A SafeLoader subclass: no Python objects are built from tags.
        return yaml.load(text, Loader=_DefinitionLoader)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        reason = error.problem or error.context or "unreadable"
        raise DefinitionError(file, [Problem("", f"not valid YAML{where}: {reason}")]) from None
    except yaml.YAMLError as error:
        raise DefinitionError(file, [Problem("", f"not valid YAML: {error}")]) from None


def parse_model_definition(text: str, file: str = DEFAULT_FILE) -> ModelDefinition:
    """Return the checked model definition; raise DefinitionError listing every problem."""
    document = load_yaml(text, file)
    problems = Problems(file)
    if document is None:
        problems.add("", 'the file is empty; it must hold a "models" list')
        problems.raise_if_any()
    if not isinstance(document, dict):
        problems.add("", 'must be a mapping with a "models" list')
        problems.raise_if_any()
    check_keys(problems, "", document, TOP_LEVEL_KEYS)
    models: list[ModelSpec] = []
    if require(problems, "", document, "models"):
        models = _models(problems, document["models"])
    problems.raise_if_any()
    return ModelDefinition(models=tuple(models))


def _models(problems: Problems, value: object) -> list[ModelSpec]:
    path = "models"
    if not isinstance(value, list) or not value:
        problems.add(path, NO_VALUE if value is None else "must be a list of at least one model")
        return []
    models = []
    names: set[str] = set()
    for index, item in enumerate(value):
        model = _model(problems, item_path(path, index), item)
        if model is None:
            continue
        if model.name in names:
            problems.add(key_path(item_path(path, index), "name"), "another model has this name")
        names.add(model.name)
        models.append(model)
    return models


def _model(problems: Problems, path: str, value: object) -> ModelSpec | None:
    data = check_mapping(problems, path, value, "mapping")
    if data is None:
        return None
    before = len(problems.found)
    check_keys(problems, path, data, MODEL_KEYS)
    name = model_path = None
    if require(problems, path, data, "name"):
        name = check_string(problems, key_path(path, "name"), data["name"])
    if require(problems, path, data, "model_path"):
        model_path = check_string(problems, key_path(path, "model_path"), data["model_path"])
    service = None
    if "service" in data:
        service = _service(problems, key_path(path, "service"), data["service"])
    if len(problems.found) > before or name is None or model_path is None:
        return None
    return ModelSpec(name=name, model_path=model_path, service=service)


def _service(problems: Problems, path: str, value: object) -> ServiceSpec | None:
    data = check_mapping(problems, path, value, "mapping")
    if data is None:
        return None
    before = len(problems.found)
    check_keys(problems, path, data, SERVICE_KEYS)
    actions: list[PreStartAction] = []
    if "pre_start_actions" in data:
        actions = _actions(problems, key_path(path, "pre_start_actions"), data["pre_start_actions"])
    command = port = None
    if require(problems, path, data, "start_command"):
        command = _command(problems, key_path(path, "start_command"), data["start_command"])
    if require(problems, path, data, "port"):
        port = check_integer(
            problems, key_path(path, "port"), data["port"], minimum=1, maximum=65535
        )
    health_check = None
    if "health_check" in data:
        health_check = _health_check(problems, key_path(path, "health_check"), data["health_check"])
    if len(problems.found) > before or command is None or port is None:
        return None
    return ServiceSpec(
        start_command=command,
        port=port,
        pre_start_actions=tuple(actions),
        health_check=health_check,
    )


def _command(problems: Problems, path: str, value: object) -> tuple[str, ...] | None:
    """Return a command as argv: a list of strings as is, a string split like a shell would."""
    if isinstance(value, str):
        try:
            argv = shlex.split(value)
        except ValueError as error:
            quote = "quotation" in str(error)
            problems.add(path, "has an unbalanced quote" if quote else "ends with a lone backslash")
            return None
        if not argv:
            problems.add(path, "must not be empty")
            return None
        return tuple(argv)
    if isinstance(value, list):
        if not value:
            problems.add(path, "must not be empty")
            return None
        bad = False
        for index, arg in enumerate(value):
            if not isinstance(arg, str):
                # YAML reads 8000 as a number; an argv holds strings only.
                problems.add(item_path(path, index), 'must be a string (quote numbers: "8000")')
                bad = True
        return None if bad else tuple(value)
    problems.add(path, NO_VALUE if value is None else "must be a string or a list of strings")
    return None


def _health_check(problems: Problems, path: str, value: object) -> HealthCheck | None:
    data = check_mapping(problems, path, value, "mapping")
    if data is None:
        return None
    before = len(problems.found)
    check_keys(problems, path, data, HEALTH_CHECK_KEYS)
    checked: dict[str, Any] = {}
    if require(problems, path, data, "path"):
        probe_path = check_string(problems, key_path(path, "path"), data["path"])
        if probe_path is not None and not probe_path.startswith("/"):
            problems.add(key_path(path, "path"), 'must start with "/"')
        checked["path"] = probe_path
    # Seconds between probes and per probe must be above 0; the first probe may start at once.
    for key, positive in (("interval", True), ("max_wait_time", True), ("initial_delay", False)):
        if key in data:
            checked[key] = check_number(problems, key_path(path, key), data[key], positive=positive)
    if "max_retries" in data:
        checked["max_retries"] = check_integer(
            problems, key_path(path, "max_retries"), data["max_retries"], minimum=0
        )
    if "expected_status_code" in data:
        checked["expected_status_code"] = check_integer(
            problems,
            key_path(path, "expected_status_code"),
            data["expected_status_code"],
            minimum=100,
            maximum=599,
        )
    if len(problems.found) > before:
        return None
    return HealthCheck(**checked)


def _actions(problems: Problems, path: str, value: object) -> list[PreStartAction]:
    if not isinstance(value, list):
        problems.add(path, NO_VALUE if value is None else "must be a list")
        return []
    actions = []
    for index, item in enumerate(value):
        action = _action(problems, item_path(path, index), item)
        if action is not None:
            actions.append(action)
    return actions


def _action(problems: Problems, path: str, value: object) -> PreStartAction | None:
    data = check_mapping(problems, path, value, "mapping")
    if data is None:
        return None
    check_keys(problems, path, data, ACTION_KEYS)
    if not require(problems, path, data, "action"):
        return None
    kind = data["action"]
    if kind not in ACTION_ARGS:
        message = NO_VALUE if kind is None else f"must be one of: {', '.join(ACTIONS)}"
        problems.add(key_path(path, "action"), message)
        return None
    args_path = key_path(path, "args")
    if not require(problems, path, data, "args"):
        return None
    args = check_mapping(problems, args_path, data["args"], "mapping")
    if args is None:
        return None
    before = len(problems.found)
    specs = ACTION_ARGS[kind]
    check_keys(problems, args_path, args, tuple(specs))
    checked: dict[str, Any] = {}
    for name, (arg_kind, default) in specs.items():
        arg_path = key_path(args_path, name)
        if name not in args:
            if default is REQUIRED:
                problems.add(arg_path, "required")
            else:
                checked[name] = default
            continue
        checked[name] = _action_arg(problems, arg_path, arg_kind, args[name])
    if len(problems.found) > before:
        return None
    return PreStartAction(action=kind, args=MappingProxyType(checked))


def _action_arg(problems: Problems, path: str, kind: str, value: object) -> Any:
    if kind == "path":
        return check_string(problems, path, value)
    if kind == "text":
        return check_string(problems, path, value, empty=True)
    if kind == "boolean":
        return check_boolean(problems, path, value)
    if kind == "command":
        return _command(problems, path, value)
    return _mode(problems, path, value)


def _mode(problems: Problems, path: str, value: object) -> int | None:
    """Return permission bits from "0644", "644", "0o644" or 644 (its digits read as octal)."""
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    match = _OCTAL_MODE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        problems.add(path, NO_VALUE if value is None else 'must be an octal permission like "0644"')
        return None
    return int(match.group(1), 8)
