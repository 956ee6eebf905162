"""The JSON Schema (draft 2020-12) of model-definition.yaml, published for editors and tools.

It describes what `parse_model_definition` accepts, key for key, with the same defaults; the
test tests/serving/test_definition_schema.py keeps the two in step. A few checks are the
parser's alone: a model name used twice, a key written twice, and an integer `mode` whose digits
are not octal.
"""

from __future__ import annotations

from typing import Any

_NUMBER_ABOVE_ZERO = {"type": "number", "exclusiveMinimum": 0}
_NUMBER_ZERO_OR_MORE = {"type": "number", "minimum": 0}
_NON_EMPTY_STRING = {"type": "string", "minLength": 1}
_COMMAND = {
    "oneOf": [
        {
            "type": "string",
            "minLength": 1,
            "description": "Split into arguments as a shell would, without running a shell.",
        },
        {"type": "array", "items": {"type": "string"}, "minItems": 1},
    ]
}
_MODE = {
    "description": 'File permissions in octal, e.g. "0644" (an unquoted 644 means the same).',
    "default": "0644",
    "oneOf": [
        {"type": "string", "pattern": "^(0o|0)?[0-7]{3,4}$"},
        {"type": "integer", "minimum": 0, "maximum": 7777},
    ],
}


def _action(
    name: str, description: str, args: dict[str, Any], required: list[str]
) -> dict[str, Any]:
    return {
        "type": "object",
        "description": description,
        "properties": {
            "action": {"const": name},
            "args": {
                "type": "object",
                "properties": args,
                "required": required,
                "additionalProperties": False,
            },
        },
        "required": ["action", "args"],
        "additionalProperties": False,
    }


MODEL_DEFINITION_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "model-definition.yaml",
    "description": "The models a model folder serves, and how each is started and health-checked.",
    "type": "object",
    "properties": {
        "models": {
            "type": "array",
            "minItems": 1,
            "items": {"$ref": "#/$defs/model"},
        }
    },
    "required": ["models"],
    "additionalProperties": False,
    "$defs": {
        "model": {
            "type": "object",
            "properties": {
                "name": {
                    **_NON_EMPTY_STRING,
                    "description": "The model's name; unique in the file.",
                },
                "model_path": {
                    **_NON_EMPTY_STRING,
                    "description": "Where the model lies inside the replica, e.g. /models.",
                },
                "service": {"$ref": "#/$defs/service"},
            },
            "required": ["name", "model_path"],
            "additionalProperties": False,
        },
        "service": {
            "type": "object",
            "description": "How the model's server is prepared, started and checked.",
            "properties": {
                "pre_start_actions": {
                    "type": "array",
                    "description": "Steps run in order before the start command.",
                    "default": [],
                    "items": {"$ref": "#/$defs/pre_start_action"},
                },
                "start_command": {
                    **_COMMAND,
                    "description": "The command that runs the server: a string or a list.",
                },
                "port": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 65535,
                    "description": "The port the server listens on, e.g. 8000.",
                },
                "health_check": {"$ref": "#/$defs/health_check"},
            },
            "required": ["start_command", "port"],
            "additionalProperties": False,
        },
        "health_check": {
            "type": "object",
            "description": (
                "Periodic probes; a replica is UNHEALTHY after max_retries + 1 failures in a row."
            ),
            "properties": {
                "path": {
                    "type": "string",
                    "pattern": "^/",
                    "description": "The HTTP path probed, e.g. /health.",
                },
                "interval": {
                    **_NUMBER_ABOVE_ZERO,
                    "default": 10.0,
                    "description": "Seconds between probes.",
                },
                "max_retries": {
                    "type": "integer",
                    "minimum": 0,
                    "default": 10,
                    "description": "Failures in a row tolerated before the replica is UNHEALTHY.",
                },
                "max_wait_time": {
                    **_NUMBER_ABOVE_ZERO,
                    "default": 15.0,
                    "description": "Seconds one probe may take before it counts as failed.",
                },
                "expected_status_code": {
                    "type": "integer",
                    "minimum": 100,
                    "maximum": 599,
                    "default": 200,
                    "description": "The HTTP status of a healthy answer.",
                },
                "initial_delay": {
                    **_NUMBER_ZERO_OR_MORE,
                    "default": 60.0,
                    "description": "Seconds after start before the first probe (model loading).",
                },
            },
            "required": ["path"],
            "additionalProperties": False,
        },
        "pre_start_action": {
            "oneOf": [
                _action(
                    "write_file",
                    "Write body to filename (append adds to the end instead of replacing).",
                    {
                        "filename": _NON_EMPTY_STRING,
                        "body": {"type": "string"},
                        "mode": _MODE,
                        "append": {"type": "boolean", "default": False},
                    },
                    ["filename", "body"],
                ),
                _action(
                    "write_tempfile",
                    "Write body to a new temporary .py file.",
                    {"body": {"type": "string"}, "mode": _MODE},
                    ["body"],
                ),
                _action(
                    "run_command",
                    "Run a command; its output and errors go to the replica's log.",
                    {"command": _COMMAND},
                    ["command"],
                ),
                _action("mkdir", "Create a directory.", {"path": _NON_EMPTY_STRING}, ["path"]),
                _action(
                    "log",
                    "Write a message to the replica's log.",
                    {"message": {"type": "string"}, "debug": {"type": "boolean", "default": False}},
                    ["message"],
                ),
            ]
        },
    },
}
