"""What a definition parser reports: every problem in a file, each at its key path."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong in a definition file.

    `path` names the key, as in ``models[0].service.port``; it is empty when the problem is the
    file as a whole (it is empty, or not valid YAML or TOML).
    """

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message

    def to_dict(self) -> dict[str, str]:
        """Return the problem as JSON-ready values."""
        return {"path": self.path, "message": self.message}


class DefinitionError(ValueError):
    """A definition file that cannot be used; it carries all of its problems, not only the first."""

    def __init__(self, file: str, problems: Sequence[Problem]) -> None:
        self.file = file
        self.problems = tuple(problems)
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(f"{self.file}: {problem}" for problem in self.problems)

    def to_dict(self) -> dict[str, Any]:
        """Return the file name and its problems as JSON-ready values."""
        return {"file": self.file, "problems": [problem.to_dict() for problem in self.problems]}
