"""service-definition.toml: per-variant defaults, memory sizes and every problem's message."""

from __future__ import annotations

import pytest

from nodes.runtimes import RUNTIME_NAMES
from serving.definitions import (
    DefinitionError,
    Environment,
    ServiceDefinition,
    VariantDefaults,
    parse_memory,
    parse_service_definition,
)

GIB = 1024**3
MIB = 1024**2

# The example in the reference's "서비스 정의 파일 생성" section, verbatim.
REFERENCE_EXAMPLE = """\
[vllm.environment]
image        = "example.com/model-server:latest"
architecture = "x86_64"

[vllm.resource_slots]
cpu = 1
mem = "8gb"
"cuda.shares" = "0.5"

[vllm.environ]
MODEL_NAME = "example-model-name"
"""

KNOWN = "vllm, sglang, nim, modular-max, llama-cpp, custom, simulator"


def problems_of(text: str) -> list[str]:
    with pytest.raises(DefinitionError) as caught:
        parse_service_definition(text)
    return [str(problem) for problem in caught.value.problems]


def test_the_reference_example_parses_to_its_values():
    definition = parse_service_definition(REFERENCE_EXAMPLE)

    assert definition == ServiceDefinition(
        variants={
            "vllm": VariantDefaults(
                environment=Environment(
                    image="example.com/model-server:latest", architecture="x86_64"
                ),
                resource_slots={"cpu": 1, "mem": 8 * GIB, "cuda.shares": 0.5},
                environ={"MODEL_NAME": "example-model-name"},
            )
        }
    )
    assert definition.to_dict() == {
        "vllm": {
            "environment": {"image": "example.com/model-server:latest", "architecture": "x86_64"},
            "resource_slots": {"cpu": 1, "mem": 8 * GIB, "cuda.shares": 0.5},
            "environ": {"MODEL_NAME": "example-model-name"},
        }
    }


@pytest.mark.parametrize("name", RUNTIME_NAMES)
def test_every_runtime_variant_may_have_a_section(name):
    text = f'[{name}.environ]\nA = "1"\n'

    defaults = parse_service_definition(text).for_variant(name)

    assert defaults == VariantDefaults(environ={"A": "1"})


def test_each_variant_keeps_its_own_defaults_and_absent_ones_are_none():
    text = """\
[vllm.resource_slots]
cpu = 8
[sglang.resource_slots]
cpu = 4
[sglang.environment]
image = "lmsysorg/sglang:latest"
architecture = "aarch64"
"""

    definition = parse_service_definition(text)

    assert definition.for_variant("vllm") == VariantDefaults(resource_slots={"cpu": 8})
    assert definition.for_variant("sglang") == VariantDefaults(
        environment=Environment(image="lmsysorg/sglang:latest", architecture="aarch64"),
        resource_slots={"cpu": 4},
    )
    assert definition.for_variant("nim") is None


def test_an_empty_file_has_no_defaults():
    assert parse_service_definition("").variants == {}


@pytest.mark.parametrize(
    ("line", "slot", "amount"),
    [
        ("cpu = 2", "cpu", 2),
        ("cpu = 0.5", "cpu", 0.5),
        ('cpu = "4"', "cpu", 4),
        ('mem = "8gb"', "mem", 8 * GIB),
        ('mem = "16g"', "mem", 16 * GIB),
        ('mem = "512m"', "mem", 512 * MIB),
        ('mem = "1.5GiB"', "mem", 1536 * MIB),
        ("mem = 1073741824", "mem", GIB),
        ('"cuda.shares" = "0.5"', "cuda.shares", 0.5),
        ('"cuda.shares" = 1.0', "cuda.shares", 1.0),
        ('"cuda.shares" = "1"', "cuda.shares", 1),
        ('"cuda.device" = 2', "cuda.device", 2),
        ('"rocm.device" = "1"', "rocm.device", 1),
    ],
    ids=lambda value: str(value),
)
def test_each_resource_slot_is_read_as_an_amount(line, slot, amount):
    text = f"[vllm.resource_slots]\n{line}\n"

    slots = parse_service_definition(text).for_variant("vllm").resource_slots

    assert slots == {slot: amount}
    assert type(slots[slot]) is type(amount)


@pytest.mark.parametrize(
    ("value", "size"),
    [
        ("8gb", 8 * GIB),
        ("8GB", 8 * GIB),
        ("8g", 8 * GIB),
        ("8GiB", 8 * GIB),
        ("8 gb", 8 * GIB),
        ("512m", 512 * MIB),
        ("512mb", 512 * MIB),
        ("64k", 64 * 1024),
        ("1t", 1024**4),
        ("2p", 2 * 1024**5),
        ("1.5g", 1536 * MIB),
        ("1024", 1024),
        ("100b", 100),
        (4096, 4096),
    ],
    ids=lambda value: repr(value),
)
def test_parse_memory_reads_binary_sizes(value, size):
    assert parse_memory(value) == size


@pytest.mark.parametrize(
    "value", ["", "gb", "8 lb", "-1g", "0", "0gb", "1e3", "8 g b", "eight", True, None, 0, -5, [8]]
)
def test_parse_memory_refuses_what_is_not_a_size(value):
    with pytest.raises(ValueError, match='must be a size like "8gb" or "512m"'):
        parse_memory(value)


ERROR_CASES = [
    ("[ollama.environ]\nA = '1'\n", [f"ollama: unknown runtime variant; known: {KNOWN}"]),
    ("vllm = 1\n", ["vllm: must be a table"]),
    (
        "[vllm.resources]\ncpu = 1\n",
        ["vllm.resources: unknown key; expected one of: environment, resource_slots, environ"],
    ),
    ('[vllm]\nenvironment = "x"\n', ["vllm.environment: must be a table"]),
    (
        '[vllm.environment]\narchitecture = "x86_64"\n',
        ["vllm.environment.image: required"],
    ),
    ('[vllm.environment]\nimage = "i"\n', ["vllm.environment.architecture: required"]),
    (
        '[vllm.environment]\nimage = ""\narchitecture = 64\n',
        [
            "vllm.environment.image: must not be empty",
            "vllm.environment.architecture: must be a string",
        ],
    ),
    (
        '[vllm.environment]\nimage = "i"\narchitecture = "x86_64"\ntag = "latest"\n',
        ["vllm.environment.tag: unknown key; expected one of: image, architecture"],
    ),
    ('[vllm]\nresource_slots = "cpu=1"\n', ["vllm.resource_slots: must be a table"]),
    *(
        (f"[vllm.resource_slots]\ncpu = {value}\n", ["vllm.resource_slots.cpu: " + message])
        for value, message in [
            ("0", "must be a number greater than 0"),
            ("-1", "must be a number greater than 0"),
            ('"many"', "must be a number greater than 0"),
            ('"nan"', "must be a number greater than 0"),
            ("true", "must be a number greater than 0"),
            ("[1]", "must be a number greater than 0"),
        ]
    ),
    *(
        (
            f"[vllm.resource_slots]\nmem = {value}\n",
            ['vllm.resource_slots.mem: must be a size like "8gb" or "512m"'],
        )
        for value in ('"8 lb"', "0", '"0gb"', "true", "-5")
    ),
    (
        "[vllm.resource_slots]\ncuda.shares = 0.5\n",
        ['vllm.resource_slots.cuda: must be a number; quote a dotted slot name: "cuda.shares" = 1'],
    ),
    (
        '[vllm.resource_slots]\n"cuda.shares" = "half"\n',
        ['vllm.resource_slots."cuda.shares": must be a number greater than 0'],
    ),
    ('[vllm]\nenviron = ["A=1"]\n', ["vllm.environ: must be a table"]),
    (
        "[vllm.environ]\nPORT = 8000\nDEBUG = true\n",
        [
            'vllm.environ.PORT: must be a string (quote numbers: "8000")',
            'vllm.environ.DEBUG: must be a string (quote numbers: "8000")',
        ],
    ),
    (
        '[vllm.environ]\n"1ST" = "a"\n"MY-VAR" = "b"\n',
        [
            "vllm.environ.1ST: is not a valid variable name (letters, digits and _)",
            "vllm.environ.MY-VAR: is not a valid variable name (letters, digits and _)",
        ],
    ),
]


@pytest.mark.parametrize(
    ("text", "expected"), ERROR_CASES, ids=[case[1][0] for case in ERROR_CASES]
)
def test_each_problem_is_named_at_its_key_path(text, expected):
    assert problems_of(text) == expected


def test_every_problem_in_the_file_is_reported_at_once():
    text = """\
[vllm.environment]
image = "i"
[vllm.resource_slots]
cpu = 0
mem = "lots"
[tgi.environ]
A = "1"
[sglang.environ]
B = 2
"""

    assert problems_of(text) == [
        "vllm.environment.architecture: required",
        "vllm.resource_slots.cpu: must be a number greater than 0",
        'vllm.resource_slots.mem: must be a size like "8gb" or "512m"',
        f"tgi: unknown runtime variant; known: {KNOWN}",
        'sglang.environ.B: must be a string (quote numbers: "8000")',
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "[vllm\n",
            "not valid TOML at line 1, column 6: expected ']' at the end of a table declaration",
        ),
        (
            "[vllm.environ]\nA = \n",
            "not valid TOML at line 2, column 5: invalid value",
        ),
        (
            '[vllm.environ]\nA = "1"\nA = "2"\n',
            "not valid TOML at line 3, column 8: cannot overwrite a value",
        ),
        (
            '[vllm.environ]\nA = "unclosed\n',
            "not valid TOML at line 2, column 14: illegal character '\\n'",
        ),
    ],
    ids=["unclosed-table", "missing-value", "duplicate-key", "unclosed-string"],
)
def test_a_file_that_is_not_toml_is_one_problem_with_line_and_column(text, expected):
    assert problems_of(text) == [expected]


def test_the_error_names_the_file():
    with pytest.raises(DefinitionError) as caught:
        parse_service_definition("vllm = 1\n", file="llama/service-definition.toml")

    assert str(caught.value) == "llama/service-definition.toml: vllm: must be a table"
