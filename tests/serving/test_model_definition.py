"""model-definition.yaml: every key, every default, every problem with its exact message."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from serving.definitions import (
    DefinitionError,
    HealthCheck,
    ModelDefinition,
    ModelSpec,
    PreStartAction,
    Problem,
    ServiceSpec,
    parse_model_definition,
)

# The example in the reference's "모델 정의 파일 생성하기" section, verbatim.
REFERENCE_EXAMPLE = """\
models:
  - name: "simple-http-server"
    model_path: "/models"
    service:
      start_command:
        - python
        - -m
        - http.server
        - --directory
        - /home/work
        - "8000"
      port: 8000
      health_check:
        path: /
        interval: 10.0
        max_retries: 10
        max_wait_time: 15.0
        expected_status_code: 200
        initial_delay: 60.0
"""

# Every pre-start action the reference describes, with each of its arguments.
ACTIONS_EXAMPLE = """\
models:
  - name: llama
    model_path: /models/llama
    service:
      pre_start_actions:
        - action: mkdir
          args:
            path: /home/work/config
        - action: write_file
          args:
            filename: /home/work/config/server.json
            body: '{"max_batch": 8}'
            mode: "0600"
            append: false
        - action: write_tempfile
          args:
            body: print("warm up")
            mode: "0755"
        - action: run_command
          args:
            command: ["python3", "-m", "http.server", "8080"]
        - action: log
          args:
            message: starting llama
            debug: true
      start_command: vllm serve /models/llama --port 8000
      port: 8000
      health_check:
        path: /health
"""

DROP = object()


def document(model: dict[str, Any] | None = None, **service: Any) -> dict[str, Any]:
    """Return a valid one-model document with `model` keys and `service` keys changed.

    A value of DROP removes the key.
    """
    service_data: dict[str, Any] = {"start_command": ["python", "-m", "server"], "port": 8000}
    service_data.update(service)
    model_data: dict[str, Any] = {"name": "m", "model_path": "/models", "service": service_data}
    model_data.update(model or {})
    for data in (service_data, model_data):
        for key in [key for key, value in data.items() if value is DROP]:
            del data[key]
    return {"models": [model_data]}


def dump(data: object) -> str:
    return yaml.safe_dump(data, sort_keys=False)


def problems_of(text: str) -> list[str]:
    with pytest.raises(DefinitionError) as caught:
        parse_model_definition(text)
    return [str(problem) for problem in caught.value.problems]


# What a valid file becomes


def test_the_reference_example_parses_to_its_values():
    definition = parse_model_definition(REFERENCE_EXAMPLE)

    assert definition == ModelDefinition(
        models=(
            ModelSpec(
                name="simple-http-server",
                model_path="/models",
                service=ServiceSpec(
                    start_command=(
                        "python",
                        "-m",
                        "http.server",
                        "--directory",
                        "/home/work",
                        "8000",
                    ),
                    port=8000,
                    pre_start_actions=(),
                    health_check=HealthCheck(
                        path="/",
                        interval=10.0,
                        max_retries=10,
                        max_wait_time=15.0,
                        expected_status_code=200,
                        initial_delay=60.0,
                    ),
                ),
            ),
        )
    )


def test_every_pre_start_action_keeps_its_order_and_checked_arguments():
    service = parse_model_definition(ACTIONS_EXAMPLE).models[0].service

    assert service is not None
    assert [(action.action, dict(action.args)) for action in service.pre_start_actions] == [
        ("mkdir", {"path": "/home/work/config"}),
        (
            "write_file",
            {
                "filename": "/home/work/config/server.json",
                "body": '{"max_batch": 8}',
                "mode": 0o600,
                "append": False,
            },
        ),
        ("write_tempfile", {"body": 'print("warm up")', "mode": 0o755}),
        ("run_command", {"command": ("python3", "-m", "http.server", "8080")}),
        ("log", {"message": "starting llama", "debug": True}),
    ]
    assert service.start_command == ("vllm", "serve", "/models/llama", "--port", "8000")
    assert service.health_check == HealthCheck(path="/health")


def test_a_health_check_with_only_a_path_takes_the_documented_defaults():
    text = dump(document(health_check={"path": "/health"}))

    check = parse_model_definition(text).models[0].service.health_check

    assert check == HealthCheck(
        path="/health",
        interval=10.0,
        max_retries=10,
        max_wait_time=15.0,
        expected_status_code=200,
        initial_delay=60.0,
    )


def test_a_model_without_service_and_a_service_without_options_are_valid():
    text = dump(
        {
            "models": [
                {"name": "weights-only", "model_path": "/models/a"},
                {
                    "name": "served",
                    "model_path": "/models/b",
                    "service": {"start_command": "serve", "port": 9000},
                },
            ]
        }
    )

    definition = parse_model_definition(text)

    assert definition.models[0] == ModelSpec(name="weights-only", model_path="/models/a")
    assert definition.models[1].service == ServiceSpec(
        start_command=("serve",), port=9000, pre_start_actions=(), health_check=None
    )


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("interval", 2.5, 2.5),
        ("interval", 3, 3.0),
        ("max_retries", 0, 0),
        ("max_retries", 4.0, 4),
        ("max_wait_time", 1, 1.0),
        ("expected_status_code", 204, 204),
        ("expected_status_code", 100, 100),
        ("expected_status_code", 599, 599),
        ("initial_delay", 0, 0.0),
        ("initial_delay", 300.0, 300.0),
    ],
    ids=lambda value: str(value),
)
def test_each_health_check_key_is_read(key, value, expected):
    text = dump(document(health_check={"path": "/v1/health", key: value}))

    check = parse_model_definition(text).models[0].service.health_check

    assert getattr(check, key) == expected
    assert type(getattr(check, key)) is type(expected)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (["vllm", "serve", "/models/a"], ("vllm", "serve", "/models/a")),
        ("vllm serve /models/a --port 8000", ("vllm", "serve", "/models/a", "--port", "8000")),
        ("python -c 'print(1 + 1)'", ("python", "-c", "print(1 + 1)")),
        ('serve --name "my model"', ("serve", "--name", "my model")),
        ("serve my\\ model", ("serve", "my model")),
        (["sh", "-c", "a && b"], ("sh", "-c", "a && b")),
    ],
    ids=["list", "string", "single-quotes", "double-quotes", "escaped-space", "list-kept-as-is"],
)
def test_a_start_command_is_a_list_or_a_string_split_like_a_shell(value, expected):
    text = dump(document(start_command=value))

    assert parse_model_definition(text).models[0].service.start_command == expected


@pytest.mark.parametrize(("port"), [1, 8000, 65535, 8000.0], ids=str)
def test_a_port_from_1_to_65535_is_accepted(port):
    assert parse_model_definition(dump(document(port=port))).models[0].service.port == int(port)


@pytest.mark.parametrize(
    ("written", "bits"),
    [
        ('"0644"', 0o644),
        ('"644"', 0o644),
        ('"0o600"', 0o600),
        ('"1777"', 0o1777),
        ("644", 0o644),
        # YAML 1.1 would read 0644 as the number 420; it means 0644 here, as in YAML 1.2.
        ("0644", 0o644),
        ("0755", 0o755),
    ],
    ids=["quoted", "quoted-no-zero", "0o-prefix", "sticky-bit", "bare", "leading-zero", "0755"],
)
def test_a_file_mode_is_octal_however_it_is_written(written, bits):
    text = f"""\
models:
  - name: m
    model_path: /models
    service:
      pre_start_actions:
        - action: write_tempfile
          args: {{body: "", mode: {written}}}
      start_command: serve
      port: 8000
"""

    action = parse_model_definition(text).models[0].service.pre_start_actions[0]

    assert action.args["mode"] == bits


@pytest.mark.parametrize(
    ("action", "args", "expected"),
    [
        (
            "write_file",
            {"filename": "a.txt", "body": "x"},
            {"filename": "a.txt", "body": "x", "mode": 0o644, "append": False},
        ),
        (
            "write_file",
            {"filename": "a.txt", "body": "", "append": True},
            {"filename": "a.txt", "body": "", "mode": 0o644, "append": True},
        ),
        ("write_tempfile", {"body": "print(1)"}, {"body": "print(1)", "mode": 0o644}),
        ("run_command", {"command": "echo 'a b'"}, {"command": ("echo", "a b")}),
        ("run_command", {"command": ["echo", "a b"]}, {"command": ("echo", "a b")}),
        ("mkdir", {"path": "/tmp/cache"}, {"path": "/tmp/cache"}),
        ("log", {"message": "hi"}, {"message": "hi", "debug": False}),
        ("log", {"message": "", "debug": True}, {"message": "", "debug": True}),
    ],
    ids=[
        "write_file-defaults",
        "write_file-append",
        "write_tempfile-default-mode",
        "run_command-string",
        "run_command-list",
        "mkdir",
        "log-defaults",
        "log-debug",
    ],
)
def test_each_action_fills_its_defaults(action, args, expected):
    text = dump(document(pre_start_actions=[{"action": action, "args": args}]))

    parsed = parse_model_definition(text).models[0].service.pre_start_actions[0]

    assert parsed == PreStartAction(action=action, args=expected)


def test_yaml_yes_and_no_are_booleans():
    text = """\
models:
  - name: m
    model_path: /models
    service:
      pre_start_actions:
        - {action: write_file, args: {filename: a, body: b, append: yes}}
        - {action: log, args: {message: m, debug: no}}
      start_command: serve
      port: 8000
"""

    actions = parse_model_definition(text).models[0].service.pre_start_actions

    assert actions[0].args["append"] is True
    assert actions[1].args["debug"] is False


@pytest.mark.parametrize("text", [REFERENCE_EXAMPLE, ACTIONS_EXAMPLE], ids=["reference", "actions"])
def test_to_dict_writes_the_file_shape_back_with_defaults_filled(text):
    definition = parse_model_definition(text)

    again = parse_model_definition(dump(definition.to_dict()))

    assert again == definition


def test_to_dict_writes_modes_in_octal_and_leaves_absent_blocks_out():
    text = dump(
        document(
            pre_start_actions=[{"action": "write_tempfile", "args": {"body": "x"}}],
            health_check=DROP,
        )
    )

    data = parse_model_definition(text).to_dict()

    assert data == {
        "models": [
            {
                "name": "m",
                "model_path": "/models",
                "service": {
                    "pre_start_actions": [
                        {"action": "write_tempfile", "args": {"body": "x", "mode": "0644"}}
                    ],
                    "start_command": ["python", "-m", "server"],
                    "port": 8000,
                },
            }
        ]
    }


# What is wrong, where, in plain words


ERROR_CASES = [
    # The top level
    ({}, ["models: required"]),
    ({"models": []}, ["models: must be a list of at least one model"]),
    ({"models": "m"}, ["models: must be a list of at least one model"]),
    ({"models": None}, ["models: has no value"]),
    ({**document(), "version": 2}, ["version: unknown key; expected one of: models"]),
    ({"models": ["m"]}, ["models[0]: must be a mapping"]),
    ({"models": [None]}, ["models[0]: has no value"]),
    # A model
    (document({"name": DROP}), ["models[0].name: required"]),
    (document({"name": ""}), ["models[0].name: must not be empty"]),
    (document({"name": 7}), ["models[0].name: must be a string"]),
    (document({"name": None}), ["models[0].name: has no value"]),
    (document({"model_path": DROP}), ["models[0].model_path: required"]),
    (document({"model_path": ["/a"]}), ["models[0].model_path: must be a string"]),
    (
        document({"version": "1"}),
        ["models[0].version: unknown key; expected one of: name, model_path, service"],
    ),
    (
        {"models": [document()["models"][0], document()["models"][0]]},
        ["models[1].name: another model has this name"],
    ),
    (document({"service": "vllm"}), ["models[0].service: must be a mapping"]),
    # The service
    (document(start_command=DROP), ["models[0].service.start_command: required"]),
    (document(start_command=[]), ["models[0].service.start_command: must not be empty"]),
    (document(start_command=""), ["models[0].service.start_command: must not be empty"]),
    (document(start_command="   "), ["models[0].service.start_command: must not be empty"]),
    (
        document(start_command=8000),
        ["models[0].service.start_command: must be a string or a list of strings"],
    ),
    (document(start_command=None), ["models[0].service.start_command: has no value"]),
    (
        document(start_command=["python", "-m", "http.server", 8000]),
        ['models[0].service.start_command[3]: must be a string (quote numbers: "8000")'],
    ),
    (
        document(start_command='serve --name "x'),
        ["models[0].service.start_command: has an unbalanced quote"],
    ),
    (
        document(start_command="serve \\"),
        ["models[0].service.start_command: ends with a lone backslash"],
    ),
    (document(port=DROP), ["models[0].service.port: required"]),
    (document(port=None), ["models[0].service.port: has no value"]),
    *(
        (document(port=port), ["models[0].service.port: must be an integer between 1 and 65535"])
        for port in (0, 65536, -1, "8000", 80.5, True)
    ),
    (
        document(shell="/bin/bash"),
        [
            "models[0].service.shell: unknown key; expected one of: "
            "pre_start_actions, start_command, port, health_check"
        ],
    ),
    # The health check
    (document(health_check="/health"), ["models[0].service.health_check: must be a mapping"]),
    (document(health_check={}), ["models[0].service.health_check.path: required"]),
    (
        document(health_check={"path": "health"}),
        ['models[0].service.health_check.path: must start with "/"'],
    ),
    (
        document(health_check={"path": ""}),
        ["models[0].service.health_check.path: must not be empty"],
    ),
    *(
        (
            document(health_check={"path": "/", key: value}),
            [f"models[0].service.health_check.{key}: {message}"],
        )
        for key, values, message in [
            ("interval", (0, -1, "10", True, float("inf")), "must be a number greater than 0"),
            ("max_wait_time", (0, -0.5, "15"), "must be a number greater than 0"),
            ("initial_delay", (-1, "60", False, float("nan")), "must be a number, 0 or more"),
            ("max_retries", (-1, 1.5, "3", True), "must be an integer, 0 or more"),
            ("expected_status_code", (99, 600, "200"), "must be an integer between 100 and 599"),
            ("interval", (None,), "has no value"),
        ]
        for value in values
    ),
    (
        document(health_check={"path": "/", "timeout": 5}),
        [
            "models[0].service.health_check.timeout: unknown key; expected one of: path, "
            "interval, max_retries, max_wait_time, expected_status_code, initial_delay"
        ],
    ),
    # Pre-start actions
    (document(pre_start_actions="mkdir"), ["models[0].service.pre_start_actions: must be a list"]),
    (document(pre_start_actions=None), ["models[0].service.pre_start_actions: has no value"]),
    (
        document(pre_start_actions=["mkdir"]),
        ["models[0].service.pre_start_actions[0]: must be a mapping"],
    ),
    (
        document(pre_start_actions=[{"args": {}}]),
        ["models[0].service.pre_start_actions[0].action: required"],
    ),
    (
        document(pre_start_actions=[{"action": "chmod", "args": {}}]),
        [
            "models[0].service.pre_start_actions[0].action: "
            "must be one of: write_file, write_tempfile, run_command, mkdir, log"
        ],
    ),
    (
        document(pre_start_actions=[{"action": None, "args": {}}]),
        ["models[0].service.pre_start_actions[0].action: has no value"],
    ),
    (
        document(pre_start_actions=[{"action": "mkdir"}]),
        ["models[0].service.pre_start_actions[0].args: required"],
    ),
    (
        document(pre_start_actions=[{"action": "mkdir", "args": "/tmp"}]),
        ["models[0].service.pre_start_actions[0].args: must be a mapping"],
    ),
    (
        document(pre_start_actions=[{"action": "mkdir", "args": {"path": "/a"}, "name": "x"}]),
        ["models[0].service.pre_start_actions[0].name: unknown key; expected one of: action, args"],
    ),
    (
        document(pre_start_actions=[{"action": "mkdir", "args": {"path": "/a", "mode": "0755"}}]),
        ["models[0].service.pre_start_actions[0].args.mode: unknown key; expected one of: path"],
    ),
    (
        document(pre_start_actions=[{"action": "write_file", "args": {}}]),
        [
            "models[0].service.pre_start_actions[0].args.filename: required",
            "models[0].service.pre_start_actions[0].args.body: required",
        ],
    ),
    (
        document(pre_start_actions=[{"action": "write_file", "args": {"filename": "", "body": 1}}]),
        [
            "models[0].service.pre_start_actions[0].args.filename: must not be empty",
            "models[0].service.pre_start_actions[0].args.body: must be a string",
        ],
    ),
    *(
        (
            document(
                pre_start_actions=[{"action": "write_tempfile", "args": {"body": "", "mode": mode}}]
            ),
            [
                "models[0].service.pre_start_actions[0].args.mode: "
                'must be an octal permission like "0644"'
            ],
        )
        for mode in ("rw-r--r--", "0999", 999, "64", "077777", True, 6.44)
    ),
    (
        document(
            pre_start_actions=[
                {"action": "write_file", "args": {"filename": "a", "body": "", "append": "yes"}}
            ]
        ),
        ["models[0].service.pre_start_actions[0].args.append: must be true or false"],
    ),
    (
        document(pre_start_actions=[{"action": "write_tempfile", "args": {}}]),
        ["models[0].service.pre_start_actions[0].args.body: required"],
    ),
    (
        document(pre_start_actions=[{"action": "run_command", "args": {}}]),
        ["models[0].service.pre_start_actions[0].args.command: required"],
    ),
    (
        document(pre_start_actions=[{"action": "run_command", "args": {"command": []}}]),
        ["models[0].service.pre_start_actions[0].args.command: must not be empty"],
    ),
    (
        document(pre_start_actions=[{"action": "run_command", "args": {"command": ["sleep", 1]}}]),
        [
            "models[0].service.pre_start_actions[0].args.command[1]: "
            'must be a string (quote numbers: "8000")'
        ],
    ),
    (
        document(pre_start_actions=[{"action": "mkdir", "args": {}}]),
        ["models[0].service.pre_start_actions[0].args.path: required"],
    ),
    (
        document(pre_start_actions=[{"action": "log", "args": {"debug": True}}]),
        ["models[0].service.pre_start_actions[0].args.message: required"],
    ),
    (
        document(pre_start_actions=[{"action": "log", "args": {"message": "m", "debug": "no"}}]),
        ["models[0].service.pre_start_actions[0].args.debug: must be true or false"],
    ),
]


def _case_id(case: tuple[object, list[str]]) -> str:
    return case[1][0]


@pytest.mark.parametrize(("data", "expected"), ERROR_CASES, ids=[_case_id(c) for c in ERROR_CASES])
def test_each_problem_is_named_at_its_key_path(data, expected):
    assert problems_of(dump(data)) == expected


def test_every_problem_in_the_file_is_reported_at_once():
    text = dump(
        {
            "models": [
                {
                    "name": "",
                    "model_path": "/models",
                    "service": {
                        "start_command": ["serve", 1],
                        "port": "8000",
                        "health_check": {"path": "/h", "interval": 0},
                    },
                },
                {"model_path": "/models", "extra": True},
            ]
        }
    )

    assert problems_of(text) == [
        "models[0].name: must not be empty",
        'models[0].service.start_command[1]: must be a string (quote numbers: "8000")',
        "models[0].service.port: must be an integer between 1 and 65535",
        "models[0].service.health_check.interval: must be a number greater than 0",
        "models[1].extra: unknown key; expected one of: name, model_path, service",
        "models[1].name: required",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 'the file is empty; it must hold a "models" list'),
        ("# nothing yet\n", 'the file is empty; it must hold a "models" list'),
        ("- name: m\n", 'must be a mapping with a "models" list'),
        ("models\n", 'must be a mapping with a "models" list'),
        (
            "models: [\n",
            "not valid YAML at line 2, column 1: expected the node content, but found "
            "'<stream end>'",
        ),
        (
            "models:\n\t- name: m\n",
            "not valid YAML at line 2, column 1: found character '\\t' that cannot start any token",
        ),
        (
            "models:\n  - name: a\n   model_path: /m\n",
            "not valid YAML at line 3, column 4: expected <block end>, but found "
            "'<block mapping start>'",
        ),
        (
            "models:\n  - name: a\n    name: b\n",
            'not valid YAML at line 3, column 5: duplicate key "name"',
        ),
        ("models: *base\n", "not valid YAML at line 1, column 9: found undefined alias 'base'"),
        (
            "!!python/object/apply:os.system [ls]\n",
            "not valid YAML at line 1, column 1: could not determine a constructor for the tag "
            "'tag:yaml.org,2002:python/object/apply:os.system'",
        ),
    ],
    ids=[
        "empty",
        "only-a-comment",
        "a-list",
        "a-word",
        "unclosed-bracket",
        "tab-indent",
        "bad-indent",
        "duplicate-key",
        "undefined-alias",
        "python-tag",
    ],
)
def test_a_file_that_is_not_a_definition_is_one_problem_with_line_and_column(text, expected):
    assert problems_of(text) == [expected]


def test_the_error_names_the_file_on_every_line():
    text = dump(document({"name": DROP}, port=DROP))

    with pytest.raises(DefinitionError) as caught:
        parse_model_definition(text, file="llama/model-definition.yml")

    assert str(caught.value) == (
        "llama/model-definition.yml: models[0].name: required\n"
        "llama/model-definition.yml: models[0].service.port: required"
    )
    assert caught.value.to_dict() == {
        "file": "llama/model-definition.yml",
        "problems": [
            {"path": "models[0].name", "message": "required"},
            {"path": "models[0].service.port", "message": "required"},
        ],
    }
    assert caught.value.problems[0] == Problem("models[0].name", "required")


def test_a_whole_file_problem_has_no_path():
    with pytest.raises(DefinitionError) as caught:
        parse_model_definition("")

    assert caught.value.problems == (
        Problem("", 'the file is empty; it must hold a "models" list'),
    )
    assert str(caught.value) == (
        'model-definition.yaml: the file is empty; it must hold a "models" list'
    )
