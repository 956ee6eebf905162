"""Django field choices from the pure cores' enums, so that each value list is written once.

A model field takes `choices=choices_of(Enum)` and the code uses the pure enum's members (plain
strings: they compare equal to what the database returns).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum


def choices_of(
    enum: type[StrEnum], labels: Mapping[str, str] | None = None
) -> list[tuple[str, str]]:
    """Return the enum as (value, label) pairs; a label is the value with spaces, capitalized
    ("least_busy": "Least busy"), unless `labels` names it."""
    labels = labels or {}
    return [
        (member.value, labels.get(member.value, member.value.replace("_", " ").capitalize()))
        for member in enum
    ]
