"""The published JSON Schema of model-definition.yaml agrees with the parser, key for key.

jsonschema is not a dependency, so a small validator for the keywords the schema uses checks
documents here; a guard test fails if the schema starts using a keyword it does not know.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from serving.definitions import DefinitionError, parse_model_definition
from serving.definitions.model_definition import (
    ACTION_ARGS,
    ACTIONS,
    DEFAULT_HEALTH_CHECK,
    HEALTH_CHECK_KEYS,
    MODEL_KEYS,
    REQUIRED,
    SERVICE_KEYS,
    TOP_LEVEL_KEYS,
)
from serving.definitions.schema import MODEL_DEFINITION_SCHEMA as SCHEMA
from tests.serving.test_model_definition import ACTIONS_EXAMPLE, REFERENCE_EXAMPLE

DEFS = SCHEMA["$defs"]
KNOWN_KEYWORDS = {
    "$schema", "$defs", "$ref", "title", "description", "default", "type", "properties",
    "required", "additionalProperties", "items", "minItems", "minLength", "minimum", "maximum",
    "exclusiveMinimum", "pattern", "const", "oneOf",
}  # fmt: skip
TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "integer": lambda v: (
        isinstance(v, int | float) and not isinstance(v, bool) and float(v).is_integer()
    ),
}


def valid(instance: Any, schema: dict[str, Any]) -> bool:
    """Return whether the instance satisfies the schema (the keywords in KNOWN_KEYWORDS)."""
    if "$ref" in schema:
        return valid(instance, DEFS[schema["$ref"].removeprefix("#/$defs/")])
    if "oneOf" in schema and sum(valid(instance, option) for option in schema["oneOf"]) != 1:
        return False
    if "const" in schema and instance != schema["const"]:
        return False
    if "type" in schema and not TYPES[schema["type"]](instance):
        return False
    if isinstance(instance, str):
        if len(instance) < schema.get("minLength", 0):
            return False
        if "pattern" in schema and not re.search(schema["pattern"], instance):
            return False
    if TYPES["number"](instance):
        if instance < schema.get("minimum", float("-inf")):
            return False
        if instance > schema.get("maximum", float("inf")):
            return False
        if "exclusiveMinimum" in schema and instance <= schema["exclusiveMinimum"]:
            return False
    if isinstance(instance, list):
        if len(instance) < schema.get("minItems", 0):
            return False
        if "items" in schema and not all(valid(item, schema["items"]) for item in instance):
            return False
    if isinstance(instance, dict):
        properties = schema.get("properties", {})
        if any(key not in instance for key in schema.get("required", [])):
            return False
        if schema.get("additionalProperties") is False and set(instance) - set(properties):
            return False
        for key, value in instance.items():
            if key in properties and not valid(value, properties[key]):
                return False
    return True


def subschemas(schema: Any):
    """Yield every schema object nested in the schema, itself included."""
    if isinstance(schema, dict):
        yield schema
        for key, value in schema.items():
            if key in ("properties", "$defs"):
                for child in value.values():
                    yield from subschemas(child)
            elif key in ("items",):
                yield from subschemas(value)
            elif key == "oneOf":
                for child in value:
                    yield from subschemas(child)


def action_schema(name: str) -> dict[str, Any]:
    [found] = [
        option
        for option in DEFS["pre_start_action"]["oneOf"]
        if option["properties"]["action"]["const"] == name
    ]
    return found


# The schema itself


def test_the_schema_is_draft_2020_12_and_serialisable():
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert json.loads(json.dumps(SCHEMA)) == SCHEMA


def test_the_schema_uses_only_keywords_the_test_validator_knows():
    used = {key for schema in subschemas(SCHEMA) for key in schema}

    assert used <= KNOWN_KEYWORDS


# Key for key, required for required, default for default


@pytest.mark.parametrize(
    ("schema", "keys"),
    [
        (SCHEMA, TOP_LEVEL_KEYS),
        (DEFS["model"], MODEL_KEYS),
        (DEFS["service"], SERVICE_KEYS),
        (DEFS["health_check"], HEALTH_CHECK_KEYS),
    ],
    ids=["top-level", "model", "service", "health_check"],
)
def test_each_block_has_exactly_the_parsers_keys_and_no_others(schema, keys):
    assert list(schema["properties"]) == list(keys)
    assert schema["additionalProperties"] is False


@pytest.mark.parametrize(
    ("schema", "required"),
    [
        (SCHEMA, ["models"]),
        (DEFS["model"], ["name", "model_path"]),
        (DEFS["service"], ["start_command", "port"]),
        (DEFS["health_check"], ["path"]),
    ],
    ids=["top-level", "model", "service", "health_check"],
)
def test_the_required_keys_are_those_the_parser_reports_missing(schema, required):
    assert schema["required"] == required


def test_the_parser_reports_exactly_those_keys_missing():
    text = "models:\n  - service:\n      health_check: {}\n"

    with pytest.raises(DefinitionError) as caught:
        parse_model_definition(text)

    assert [problem.path for problem in caught.value.problems] == [
        "models[0].name",
        "models[0].model_path",
        "models[0].service.start_command",
        "models[0].service.port",
        "models[0].service.health_check.path",
    ]


def test_the_health_check_defaults_are_the_parsers():
    properties = DEFS["health_check"]["properties"]

    assert {key: properties[key]["default"] for key in DEFAULT_HEALTH_CHECK} == (
        DEFAULT_HEALTH_CHECK
    )
    assert DEFAULT_HEALTH_CHECK == {
        "interval": 10.0,
        "max_retries": 10,
        "max_wait_time": 15.0,
        "expected_status_code": 200,
        "initial_delay": 60.0,
    }


def test_the_actions_are_the_parsers_in_order():
    options = DEFS["pre_start_action"]["oneOf"]

    assert tuple(option["properties"]["action"]["const"] for option in options) == ACTIONS


@pytest.mark.parametrize("action", ACTIONS)
def test_each_actions_arguments_required_and_defaults_are_the_parsers(action):
    args = action_schema(action)["properties"]["args"]
    specs = ACTION_ARGS[action]

    assert list(args["properties"]) == list(specs)
    assert args["additionalProperties"] is False
    assert args["required"] == [name for name, (_, default) in specs.items() if default is REQUIRED]
    for name, (kind, default) in specs.items():
        if default is REQUIRED:
            assert "default" not in args["properties"][name]
        elif kind == "mode":
            assert int(args["properties"][name]["default"], 8) == default
        else:
            assert args["properties"][name]["default"] == default


# The schema and the parser accept and refuse the same documents


SERVICE = {"start_command": ["serve"], "port": 8000}


def model(**service: Any) -> dict[str, Any]:
    return {"models": [{"name": "m", "model_path": "/models", "service": {**SERVICE, **service}}]}


AGREEMENT_CASES = [
    # Accepted by both
    ("reference-example", yaml.safe_load(REFERENCE_EXAMPLE), True),
    ("every-action", yaml.safe_load(ACTIONS_EXAMPLE), True),
    ("no-service", {"models": [{"name": "m", "model_path": "/m"}]}, True),
    ("string-command", model(start_command="vllm serve /m"), True),
    ("integral-float-port", model(port=8000.0), True),
    ("zero-retries", model(health_check={"path": "/", "max_retries": 0, "initial_delay": 0}), True),
    ("bare-mode", model(pre_start_actions=[{"action": "mkdir", "args": {"path": "/a"}}]), True),
    (
        "integer-mode",
        model(pre_start_actions=[{"action": "write_tempfile", "args": {"body": "", "mode": 755}}]),
        True,
    ),
    # Refused by both
    ("empty-document", {}, False),
    ("no-models", {"models": []}, False),
    ("unknown-top-key", {**model(), "version": 1}, False),
    ("no-name", {"models": [{"model_path": "/m"}]}, False),
    ("empty-name", {"models": [{"name": "", "model_path": "/m"}]}, False),
    ("unknown-model-key", {"models": [{"name": "m", "model_path": "/m", "x": 1}]}, False),
    (
        "no-port",
        {"models": [{"name": "m", "model_path": "/m", "service": {"start_command": "s"}}]},
        False,
    ),
    ("port-zero", model(port=0), False),
    ("port-too-big", model(port=65536), False),
    ("port-string", model(port="8000"), False),
    ("port-boolean", model(port=True), False),
    ("port-fraction", model(port=80.5), False),
    ("empty-command", model(start_command=[]), False),
    ("number-in-command", model(start_command=["serve", 1]), False),
    ("command-number", model(start_command=5), False),
    ("unknown-service-key", model(shell="/bin/sh"), False),
    ("no-health-path", model(health_check={}), False),
    ("relative-health-path", model(health_check={"path": "health"}), False),
    ("zero-interval", model(health_check={"path": "/", "interval": 0}), False),
    ("negative-delay", model(health_check={"path": "/", "initial_delay": -1}), False),
    ("fraction-retries", model(health_check={"path": "/", "max_retries": 1.5}), False),
    ("status-99", model(health_check={"path": "/", "expected_status_code": 99}), False),
    ("unknown-health-key", model(health_check={"path": "/", "timeout": 1}), False),
    ("actions-not-list", model(pre_start_actions={"action": "log"}), False),
    ("unknown-action", model(pre_start_actions=[{"action": "chmod", "args": {}}]), False),
    ("action-without-args", model(pre_start_actions=[{"action": "mkdir"}]), False),
    ("missing-arg", model(pre_start_actions=[{"action": "mkdir", "args": {}}]), False),
    (
        "unknown-arg",
        model(pre_start_actions=[{"action": "log", "args": {"message": "", "x": 1}}]),
        False,
    ),
    (
        "bad-mode",
        model(pre_start_actions=[{"action": "write_tempfile", "args": {"body": "", "mode": "rw"}}]),
        False,
    ),
    (
        "string-boolean",
        model(pre_start_actions=[{"action": "log", "args": {"message": "", "debug": "yes"}}]),
        False,
    ),
]


@pytest.mark.parametrize(
    ("document", "accepted"),
    [case[1:] for case in AGREEMENT_CASES],
    ids=[case[0] for case in AGREEMENT_CASES],
)
def test_the_schema_and_the_parser_agree(document, accepted):
    try:
        parse_model_definition(yaml.safe_dump(document))
        parsed = True
    except DefinitionError:
        parsed = False

    assert (parsed, valid(document, SCHEMA)) == (accepted, accepted)


@pytest.mark.parametrize("text", [REFERENCE_EXAMPLE, ACTIONS_EXAMPLE], ids=["reference", "actions"])
def test_what_to_dict_writes_is_valid_against_the_schema(text):
    assert valid(parse_model_definition(text).to_dict(), SCHEMA)
