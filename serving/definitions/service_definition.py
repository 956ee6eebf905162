"""service-definition.toml: per runtime variant, the launcher's defaults for a model folder.

Each variant has up to three tables: ``[<variant>.environment]`` (image, architecture),
``[<variant>.resource_slots]`` (cpu, mem, "cuda.shares" and any other slot) and
``[<variant>.environ]`` (variables for the server process).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from types import MappingProxyType
from typing import Any

from nodes.runtimes import RUNTIME_NAMES

from .errors import DefinitionError, Problem
from .values import (
    Problems,
    check_keys,
    check_mapping,
    check_string,
    is_number,
    key_path,
    require,
)

DEFAULT_FILE = "service-definition.toml"
VARIANT_KEYS = ("environment", "resource_slots", "environ")
ENVIRONMENT_KEYS = ("image", "architecture")
MEMORY_SLOT = "mem"
# Memory units; binary multiples, as resource slots count bytes of RAM (8g = 8 GiB).
_MEMORY_UNITS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}
_MEMORY = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(?:i?b)?\s*", re.IGNORECASE)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_memory(value: object) -> int:
    """Return a memory size in bytes: a number of bytes, or "8gb", "8g", "8GiB", "512m", "1.5g".

    Units are binary (k = 1024). Raise ValueError for anything else, or a size of 0.
    """
    size: Decimal | None = None
    if is_number(value):
        size = Decimal(str(value))
    elif isinstance(value, str) and (match := _MEMORY.fullmatch(value)):
        try:
            size = Decimal(match.group(1)) * 1024 ** _MEMORY_UNITS[match.group(2).lower()]
        except InvalidOperation:  # pragma: no cover - the pattern admits only valid decimals
            size = None
    if size is None or size <= 0:
        raise ValueError('must be a size like "8gb" or "512m"')
    return int(size)


@dataclass(frozen=True)
class Environment:
    """The container image a variant runs and its CPU architecture."""

    image: str
    architecture: str


@dataclass(frozen=True)
class VariantDefaults:
    """The launcher's defaults for one runtime variant.

    `resource_slots` maps slot names to amounts: `mem` in bytes, `cpu` in cores, others as given.
    """

    environment: Environment | None = None
    resource_slots: Mapping[str, int | float] = field(default_factory=lambda: MappingProxyType({}))
    environ: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def to_dict(self) -> dict[str, Any]:
        """Return the defaults as JSON-ready values; an absent environment is left out."""
        data: dict[str, Any] = {
            "resource_slots": dict(self.resource_slots),
            "environ": dict(self.environ),
        }
        if self.environment is not None:
            data["environment"] = {
                "image": self.environment.image,
                "architecture": self.environment.architecture,
            }
        return data


@dataclass(frozen=True)
class ServiceDefinition:
    """A parsed service-definition.toml: defaults per runtime variant name."""

    variants: Mapping[str, VariantDefaults]

    def for_variant(self, name: str) -> VariantDefaults | None:
        """Return the defaults for a variant, or None when the file has none for it."""
        return self.variants.get(name)

    def to_dict(self) -> dict[str, Any]:
        """Return the definition as JSON-ready values."""
        return {name: defaults.to_dict() for name, defaults in self.variants.items()}


def parse_service_definition(text: str, file: str = DEFAULT_FILE) -> ServiceDefinition:
    """Return the checked service definition; raise DefinitionError listing every problem."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise DefinitionError(file, [Problem("", _toml_problem(str(error)))]) from None
    problems = Problems(file)
    variants: dict[str, VariantDefaults] = {}
    for name, value in document.items():
        path = key_path("", name)
        if name not in RUNTIME_NAMES:
            problems.add(path, f"unknown runtime variant; known: {', '.join(RUNTIME_NAMES)}")
            continue
        defaults = _variant(problems, path, value)
        if defaults is not None:
            variants[name] = defaults
    problems.raise_if_any()
    return ServiceDefinition(variants=MappingProxyType(variants))


def _toml_problem(message: str) -> str:
    """Return tomllib's message as "not valid TOML at line 3, column 7: <reason>"."""
    match = re.fullmatch(r"(.*) \(at line (\d+), column (\d+)\)", message)
    if match is None:
        return f"not valid TOML: {message}"
    reason, line, column = match.groups()
    return f"not valid TOML at line {line}, column {column}: {reason[:1].lower()}{reason[1:]}"


def _variant(problems: Problems, path: str, value: object) -> VariantDefaults | None:
    data = check_mapping(problems, path, value, "table")
    if data is None:
        return None
    before = len(problems.found)
    check_keys(problems, path, data, VARIANT_KEYS)
    environment = None
    if "environment" in data:
        environment = _environment(problems, key_path(path, "environment"), data["environment"])
    slots: dict[str, int | float] = {}
    if "resource_slots" in data:
        slots = _slots(problems, key_path(path, "resource_slots"), data["resource_slots"])
    environ: dict[str, str] = {}
    if "environ" in data:
        environ = _environ(problems, key_path(path, "environ"), data["environ"])
    if len(problems.found) > before:
        return None
    return VariantDefaults(
        environment=environment,
        resource_slots=MappingProxyType(slots),
        environ=MappingProxyType(environ),
    )


def _environment(problems: Problems, path: str, value: object) -> Environment | None:
    data = check_mapping(problems, path, value, "table")
    if data is None:
        return None
    check_keys(problems, path, data, ENVIRONMENT_KEYS)
    image, architecture = (
        check_string(problems, key_path(path, key), data[key])
        if require(problems, path, data, key)
        else None
        for key in ENVIRONMENT_KEYS
    )
    if image is None or architecture is None:
        return None
    return Environment(image=image, architecture=architecture)


def _slots(problems: Problems, path: str, value: object) -> dict[str, int | float]:
    data = check_mapping(problems, path, value, "table")
    if data is None:
        return {}
    slots: dict[str, int | float] = {}
    for name, amount in data.items():
        slot_path = key_path(path, name)
        if isinstance(amount, dict):
            # `cuda.shares = 0.5` unquoted is TOML for a "cuda" table holding "shares".
            dotted = f"{name}.{next(iter(amount), 'shares')}"
            problems.add(slot_path, f'must be a number; quote a dotted slot name: "{dotted}" = 1')
            continue
        if name == MEMORY_SLOT:
            try:
                slots[name] = parse_memory(amount)
            except ValueError as error:
                problems.add(slot_path, str(error))
            continue
        number = _slot_amount(amount)
        if number is None:
            problems.add(slot_path, "must be a number greater than 0")
        else:
            slots[name] = number
    return slots


def _slot_amount(value: object) -> int | float | None:
    """Return a slot amount from a number or a numeric string ("0.5", as the reference writes)."""
    if isinstance(value, str):
        try:
            number = Decimal(value.strip())
        except InvalidOperation:
            return None
        if not number.is_finite():
            return None
        value = int(number) if number == number.to_integral_value() else float(number)
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _environ(problems: Problems, path: str, value: object) -> dict[str, str]:
    data = check_mapping(problems, path, value, "table")
    if data is None:
        return {}
    environ = {}
    for name, text in data.items():
        var_path = key_path(path, name)
        if not _ENV_NAME.fullmatch(name):
            problems.add(var_path, "is not a valid variable name (letters, digits and _)")
        elif not isinstance(text, str):
            # Environment variables are strings; TOML's 8000 or true would need a rule to convert.
            problems.add(var_path, 'must be a string (quote numbers: "8000")')
        else:
            environ[name] = text
    return environ
