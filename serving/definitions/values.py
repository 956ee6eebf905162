"""Checks of one value each, shared by the definition parsers.

Every check records a `Problem` and returns None when the value is wrong, so a parser can go on
and report every problem in the file at once. A key that is present with no value (YAML `port:`,
which reads as null) is "has no value", whatever type the key wants.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from typing import Any

from .errors import DefinitionError, Problem

NO_VALUE = "has no value"
# Key path parts that are shown bare; anything else (a dot, a space) is shown quoted.
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


class Problems:
    """The problems found so far in one file."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.found: list[Problem] = []

    def add(self, path: str, message: str) -> None:
        """Record a problem at a key path."""
        self.found.append(Problem(path, message))

    def raise_if_any(self) -> None:
        """Raise DefinitionError with every recorded problem, if there is one."""
        if self.found:
            raise DefinitionError(self.file, self.found)


def key_path(parent: str, key: object) -> str:
    """Return the path of a key under a parent path ("" for the top level)."""
    text = str(key)
    part = text if _BARE_KEY.fullmatch(text) else '"' + text.replace('"', '\\"') + '"'
    return f"{parent}.{part}" if parent else part


def item_path(parent: str, index: int) -> str:
    """Return the path of a list item."""
    return f"{parent}[{index}]"


def is_number(value: object) -> bool:
    """Return whether a parsed value is a number (booleans are not, though Python says so)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def as_integer(value: object) -> int | None:
    """Return the value as an int when it is a whole number (8000 or 8000.0), else None.

    A float with no fraction counts, as JSON Schema's "integer" does, so the published schema
    and the parser agree.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def check_mapping(problems: Problems, path: str, value: object, noun: str) -> dict[Any, Any] | None:
    """Return the value when it is a mapping; `noun` is what the file format calls one."""
    if isinstance(value, dict):
        return value
    problems.add(path, NO_VALUE if value is None else f"must be a {noun}")
    return None


def check_keys(
    problems: Problems, path: str, data: Mapping[Any, Any], known: Collection[str]
) -> None:
    """Record every key of `data` that is not one of `known`."""
    for key in data:
        if key not in known:
            problems.add(key_path(path, key), f"unknown key; expected one of: {', '.join(known)}")


def require(problems: Problems, path: str, data: Mapping[Any, Any], key: str) -> bool:
    """Return whether `key` is present, recording "required" when it is not."""
    if key in data:
        return True
    problems.add(key_path(path, key), "required")
    return False


def check_string(
    problems: Problems, path: str, value: object, *, empty: bool = False
) -> str | None:
    """Return the value when it is a string, non-empty unless `empty` allows it."""
    if value is None:
        problems.add(path, NO_VALUE)
    elif not isinstance(value, str):
        problems.add(path, "must be a string")
    elif not value and not empty:
        problems.add(path, "must not be empty")
    else:
        return value
    return None


def check_boolean(problems: Problems, path: str, value: object) -> bool | None:
    """Return the value when it is true or false."""
    if isinstance(value, bool):
        return value
    problems.add(path, NO_VALUE if value is None else "must be true or false")
    return None


def check_integer(
    problems: Problems, path: str, value: object, *, minimum: int, maximum: int | None = None
) -> int | None:
    """Return the value when it is a whole number within the bounds (inclusive)."""
    number = as_integer(value)
    if number is not None and number >= minimum and (maximum is None or number <= maximum):
        return number
    if value is None:
        problems.add(path, NO_VALUE)
    elif maximum is None:
        problems.add(path, f"must be an integer, {minimum} or more")
    else:
        problems.add(path, f"must be an integer between {minimum} and {maximum}")
    return None


def _finite(value: object) -> float | None:
    """Return a number as a float; None for anything else, and for YAML's .inf and .nan."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def check_number(problems: Problems, path: str, value: object, *, positive: bool) -> float | None:
    """Return the value as a float when it is a number above 0 (`positive`) or at least 0."""
    number = _finite(value)
    if number is not None and (number > 0 or (number == 0 and not positive)):
        return number
    if value is None:
        problems.add(path, NO_VALUE)
    else:
        problems.add(
            path, "must be a number greater than 0" if positive else "must be a number, 0 or more"
        )
    return None
