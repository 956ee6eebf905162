"""model-card.yaml: what the model store shows of a model folder (docs/model-store.md).

Every key is optional; a card file that cannot be read gives an empty card with its problems,
so one broken folder never hides the others. What runs, and on which resources, stays in
model-definition.yaml and service-definition.toml: the card only describes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from .errors import DefinitionError, Problem
from .values import Problems, check_keys, check_string, item_path, key_path

DEFAULT_FILE = "model-card.yaml"
TEXT_KEYS = (
    *("title", "description", "task", "category", "license", "author"),
    *("architecture", "version", "icon"),
)
LIST_KEYS = ("labels", "frameworks")
CARD_KEYS = (*TEXT_KEYS, *LIST_KEYS)


@dataclass(frozen=True)
class ModelCard:
    """A model's description in the store; empty strings and lists where the file says nothing."""

    title: str = ""
    description: str = ""
    task: str = ""
    category: str = ""
    license: str = ""
    author: str = ""
    architecture: str = ""
    version: str = ""
    # A brand: one of nexus.ui's icon names (huggingface, meta, python, nexus...), else none.
    icon: str = ""
    labels: tuple[str, ...] = ()
    frameworks: tuple[str, ...] = ()
    problems: tuple[Problem, ...] = field(default=())


def parse_model_card(text: str, file: str = DEFAULT_FILE) -> ModelCard:
    """Return the card the text describes; raise DefinitionError listing every problem."""
    problems = Problems(file)
    try:
        data: Any = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise DefinitionError(file, [Problem("", f"is not valid YAML{where}")]) from None
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise DefinitionError(file, [Problem("", "must be a mapping of card keys")])
    check_keys(problems, "", data, CARD_KEYS)
    values: dict[str, Any] = {}
    for key in TEXT_KEYS:
        if key in data:
            value = data[key]
            # A YAML number (version: 1.2) is meant as text.
            text_value = str(value) if isinstance(value, int | float) else value
            checked = check_string(problems, key_path("", key), text_value)
            if checked is not None:
                values[key] = checked.strip()
    for key in LIST_KEYS:
        if key in data:
            values[key] = _strings(problems, key, data[key])
    problems.raise_if_any()
    return ModelCard(**values)


def read_model_card(text: str | None, file: str = DEFAULT_FILE) -> ModelCard:
    """Return the card, an empty one without a file, or an empty one carrying its problems."""
    if text is None:
        return ModelCard()
    try:
        return parse_model_card(text, file)
    except DefinitionError as broken:
        return ModelCard(problems=tuple(broken.problems))


def _strings(problems: Problems, key: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        problems.add(key, "must be a list of strings")
        return ()
    found = []
    for index, item in enumerate(value):
        checked = check_string(problems, item_path(key, index), item)
        if checked is not None and checked.strip():
            found.append(checked.strip())
    return tuple(found)


def fits(slots: Mapping[str, float], minimum: Mapping[str, float]) -> bool:
    """Say whether a preset's slots can run a model that needs at least `minimum`.

    Every slot the model names must be there in full. An accelerator preset (cuda.shares) is
    not offered to a model that asks for none: it would hold a GPU the model never uses.
    """
    if all(slots.get(name, 0) >= amount for name, amount in minimum.items()):
        return minimum.get("cuda.shares", 0) > 0 or slots.get("cuda.shares", 0) == 0
    return False
