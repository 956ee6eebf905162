"""Pre-start actions: checked when a process is submitted, run just before its command starts.

A process spec's `pre_start_actions` are checked by `parse_actions` (the agent answers 400 naming
the field). A process with actions is started as `python -I prestart.py <spec.json>` instead of its
command: this runner performs the actions in order, one line each into the process's log, then
replaces itself with the command (`os.execvpe`), so the pid, the process group, stopping and the
exit code stay the command's own. A failing action ends it with EXIT_FAILED and a line
"pre-start action 2 (run_command) failed: …", the last line of the log.

`write_tempfile` writes `<tempdir>/<random>.py`; later actions, argv and env values may name it as
`${NEXUS_TEMPFILE}` (the latest) or `${NEXUS_TEMPFILE_<n>}` (the n-th), and the command and later
`run_command`s get both as environment variables.

Standard library only: the runner starts in isolated mode (-I, by file path), where neither the
command's PYTHON* variables nor a `nodes` folder in its working directory can disturb it.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn, TextIO

# The exit code of a process whose pre-start actions failed (or whose command could not be run).
EXIT_FAILED = 3
# Each action's arguments: name -> (kind, default), REQUIRED for those without one; the same
# table as serving/definitions/model_definition.py's, which the agent cannot import (it is
# installed without the controller). Kinds: "path" a non-empty string, "text" any string,
# "boolean", "mode" an octal permission, "command" a list of strings or a string split like a
# shell would.
REQUIRED = object()
ACTION_ARGS: Mapping[str, Mapping[str, tuple[str, object]]] = {
    "write_file": {
        "filename": ("path", REQUIRED),
        "body": ("text", REQUIRED),
        "mode": ("mode", 0o644),
        "append": ("boolean", False),
    },
    "write_tempfile": {"body": ("text", REQUIRED), "mode": ("mode", 0o644)},
    "run_command": {"command": ("command", REQUIRED)},
    "mkdir": {"path": ("path", REQUIRED)},
    "log": {"message": ("text", REQUIRED), "debug": ("boolean", False)},
}
ACTION_KEYS = frozenset({"action", "args"})
TEMPFILE_VARIABLE = "NEXUS_TEMPFILE"
# How an action writes its line into the log ("pre-start action 2 (mkdir): …").
Say = Callable[[str], None]
# "644", "0644" and "0o644": three or four octal digits (an integer's digits are read as octal).
_OCTAL_MODE = re.compile(r"(?:0o|0)?([0-7]{3,4})")


class ActionError(ValueError):
    """A pre-start action the agent refuses, with the field at fault."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def parse_actions(value: Any, field: str = "pre_start_actions") -> list[dict[str, Any]]:
    """Return the actions checked, defaults filled in: modes as ints, commands as lists.

    Raise ActionError naming the first field that is wrong (`pre_start_actions[1].action`).
    """
    if value is None:
        return []
    if not isinstance(value, list):
        raise ActionError(field, "must be a list of actions")
    return [_parse_action(item, f"{field}[{index}]") for index, item in enumerate(value)]


def path_args(action: Mapping[str, Any]) -> list[str]:
    """Return the names of an action's arguments that are file system paths."""
    specs = ACTION_ARGS[action["action"]]
    return [name for name, (kind, _default) in specs.items() if kind == "path"]


def _parse_action(item: Any, field: str) -> dict[str, Any]:
    if not isinstance(item, Mapping):
        raise ActionError(field, "must be an object with action and args")
    for key in item:
        if key not in ACTION_KEYS:
            raise ActionError(f"{field}.{key}", "unknown field")
    kind = item.get("action")
    if kind is None:
        raise ActionError(f"{field}.action", "required")
    if kind not in ACTION_ARGS:
        raise ActionError(f"{field}.action", f"must be one of: {', '.join(ACTION_ARGS)}")
    args = item.get("args")
    if args is None:
        raise ActionError(f"{field}.args", "required")
    if not isinstance(args, Mapping):
        raise ActionError(f"{field}.args", "must be an object")
    specs = ACTION_ARGS[kind]
    for name in args:
        if name not in specs:
            raise ActionError(f"{field}.args.{name}", "unknown field")
    checked: dict[str, Any] = {}
    for name, (arg_kind, default) in specs.items():
        if name in args:
            checked[name] = _parse_arg(arg_kind, args[name], f"{field}.args.{name}")
        elif default is REQUIRED:
            raise ActionError(f"{field}.args.{name}", "required")
        else:
            checked[name] = default
    return {"action": kind, "args": checked}


def _parse_arg(kind: str, value: Any, field: str) -> Any:
    if kind == "path":
        if not isinstance(value, str) or not value or "\0" in value:
            raise ActionError(field, "must be a non-empty path")
        return value
    if kind == "text":
        if not isinstance(value, str):
            raise ActionError(field, "must be a string")
        return value
    if kind == "boolean":
        if not isinstance(value, bool):
            raise ActionError(field, "must be true or false")
        return value
    if kind == "mode":
        return _parse_mode(value, field)
    return _parse_command(value, field)


def _parse_mode(value: Any, field: str) -> int:
    """Return permission bits from "0644", "644", "0o644" or 644 (its digits read as octal)."""
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    match = _OCTAL_MODE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ActionError(field, 'must be an octal permission like "0644"')
    return int(match.group(1), 8)


def _parse_command(value: Any, field: str) -> list[str]:
    """Return a command as argv: a list of strings as is, a string split like a shell would."""
    if isinstance(value, str):
        try:
            value = shlex.split(value)
        except ValueError as error:
            raise ActionError(field, f"cannot be split into arguments: {error}") from None
    if not isinstance(value, list) or not value:
        raise ActionError(field, "must be a non-empty string or list of strings")
    for index, arg in enumerate(value):
        if not isinstance(arg, str) or "\0" in arg:
            raise ActionError(f"{field}[{index}]", "must be a string without NUL characters")
    return list(value)


# -- the runner ------------------------------------------------------------------------------


class _Failed(Exception):
    """An action that could not be done, with the reason the log shows."""


class _Run:
    """The state one run carries from action to action: the environment and the tempfiles."""

    def __init__(self, env: dict[str, str], tempdir: Path) -> None:
        self.env = env
        self.tempdir = tempdir
        self.tempfiles = 0
        # Placeholder -> path, filled in as write_tempfile actions run.
        self.placeholders: dict[str, str] = {}

    def substitute(self, value: Any) -> Any:
        """Return a string (or the strings of a list) with the tempfile placeholders replaced."""
        if isinstance(value, list):
            return [self.substitute(item) for item in value]
        if not isinstance(value, str):
            return value
        for placeholder, path in self.placeholders.items():
            value = value.replace(placeholder, path)
        return value

    def environment(self) -> dict[str, str]:
        """Return the environment for commands, the tempfile placeholders in values replaced."""
        return {name: self.substitute(value) for name, value in self.env.items()}


def _write_file(run: _Run, say: Say, args: dict[str, Any]) -> None:
    path, mode, append = args["filename"], args["mode"], args["append"]
    say(f"{'append to' if append else 'write'} {path} (mode {mode:04o})")
    _write(path, args["body"], mode, append=append)


def _write_tempfile(run: _Run, say: Say, args: dict[str, Any]) -> None:
    run.tempdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    # mkstemp makes the file 0600 and unique; the mode is set before the body is written.
    descriptor, path = tempfile.mkstemp(suffix=".py", dir=run.tempdir)
    os.close(descriptor)
    run.tempfiles += 1
    numbered = f"{TEMPFILE_VARIABLE}_{run.tempfiles}"
    say(f"write {path} (mode {args['mode']:04o}) as ${{{TEMPFILE_VARIABLE}}}, ${{{numbered}}}")
    _write(path, args["body"], args["mode"], append=False)
    for name in (TEMPFILE_VARIABLE, numbered):
        run.env[name] = path
        run.placeholders[f"${{{name}}}"] = path


def _run_command(run: _Run, say: Say, args: dict[str, Any]) -> None:
    command = args["command"]
    say(f"run {shlex.join(command)}")
    try:
        # Its output goes straight into the process's log, between this line and the next.
        done = subprocess.run(command, env=run.environment(), stdin=subprocess.DEVNULL, check=False)
    except FileNotFoundError:
        raise _Failed(f"{command[0]} not found") from None
    except PermissionError:
        raise _Failed(f"{command[0]} is not executable") from None
    if done.returncode != 0:
        raise _Failed(f"{shlex.join(command)} exited with {_status(done.returncode)}")


def _mkdir(run: _Run, say: Say, args: dict[str, Any]) -> None:
    say(f"mkdir {args['path']}")
    Path(args["path"]).mkdir(parents=True, exist_ok=True)


def _log(run: _Run, say: Say, args: dict[str, Any]) -> None:
    say(f"debug: {args['message']}" if args["debug"] else args["message"])


_RUNNERS: Mapping[str, Callable[[_Run, Say, dict[str, Any]], None]] = {
    "write_file": _write_file,
    "write_tempfile": _write_tempfile,
    "run_command": _run_command,
    "mkdir": _mkdir,
    "log": _log,
}


def _write(path: str, body: str, mode: int, *, append: bool) -> None:
    """Write (or append) a body, the file's mode set first: a secret never sits in a wider one."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    descriptor = os.open(path, flags, mode)
    with open(descriptor, "wb") as file:
        os.fchmod(descriptor, mode)
        file.write(body.encode())


def _status(returncode: int) -> str:
    return f"signal {-returncode}" if returncode < 0 else f"code {returncode}"


def _say(line: str, stream: TextIO | None = None) -> None:
    # Flushed at once: a run_command's output and the command after exec share the log file.
    stream = stream or sys.stdout
    stream.write(line + "\n")
    stream.flush()


def _announce(prefix: str, text: str) -> None:
    _say(f"{prefix}: {text}")


def _fail(line: str) -> NoReturn:
    _say(line, sys.stderr)
    sys.exit(EXIT_FAILED)


def run(spec_path: Path) -> NoReturn:
    """Perform the spec's actions in order, then exec its command; exit EXIT_FAILED on failure.

    The spec (argv, env, actions, tempdir) is deleted before the exec: its bodies and environment
    may hold secrets, and nothing needs it once the actions are done.
    """
    try:
        spec = json.loads(spec_path.read_text())
    except (OSError, ValueError) as error:
        _fail(f"pre-start: cannot read {spec_path}: {error}")
    state = _Run(dict(spec["env"]), Path(spec["tempdir"]))
    for number, action in enumerate(spec["actions"], start=1):
        kind = action["action"]
        args = {name: state.substitute(value) for name, value in action["args"].items()}
        say = functools.partial(_announce, f"pre-start action {number} ({kind})")
        try:
            _RUNNERS[kind](state, say, args)
        except _Failed as error:
            _fail(f"pre-start action {number} ({kind}) failed: {error}")
        except (OSError, ValueError) as error:
            _fail(f"pre-start action {number} ({kind}) failed: {_describe(error)}")
    spec_path.unlink(missing_ok=True)
    argv = state.substitute(spec["argv"])
    _say(f"pre-start: {len(spec['actions'])} actions done, starting {argv[0]}")
    try:
        os.execvpe(argv[0], argv, state.environment())
    except OSError as error:
        _fail(f"pre-start: cannot run {argv[0]}: {_describe(error)}")


def _describe(error: Exception) -> str:
    if isinstance(error, OSError) and error.strerror:
        target = f": {error.filename}" if error.filename else ""
        return f"{error.strerror}{target}"
    return str(error)


if __name__ == "__main__":
    run(Path(sys.argv[1]))
