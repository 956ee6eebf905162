"""Django choices built from the pure cores' enums, so each value list is written once."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from django.db import models


def choices_of(
    enum: type[StrEnum], name: str, module: str, labels: Mapping[str, str] | None = None
) -> type[models.TextChoices]:
    """Return TextChoices with the enum's members (same names and values) and readable labels.

    A label is the value with underscores as spaces, capitalized ("least_busy": "Least busy"),
    unless `labels` names it. Members compare equal to the enum's and to plain strings.
    """
    labels = labels or {}
    members = [
        (member.name, (member.value, labels.get(member.value, _label(member.value))))
        for member in enum
    ]
    return models.TextChoices(name, members, module=module)  # type: ignore[return-value]


def _label(value: str) -> str:
    return value.replace("_", " ").capitalize()
