"""Choose a target among a pool's candidates."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def round_robin(candidates: Sequence[T], turn: int) -> T:
    """Return the candidate whose turn it is; the caller advances the turn."""
    return candidates[turn % len(candidates)]
