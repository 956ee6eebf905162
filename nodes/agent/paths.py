"""Which directories the agent may read models from and run commands in."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from nodes.agent.errors import AgentError


def ensure_allowed(path: str | Path, allowed_dirs: Sequence[Path]) -> Path:
    """Return the resolved path when it lies inside an allowed directory, else refuse with 403.

    Resolving first means `..` and symlinks cannot lead outside.
    """
    resolved = Path(path).expanduser().resolve()
    for allowed in allowed_dirs:
        if resolved == allowed or resolved.is_relative_to(allowed):
            return resolved
    listed = ", ".join(str(d) for d in allowed_dirs)
    raise AgentError(
        403,
        "path_not_allowed",
        f"{path} is outside the directories this agent may use ({listed})",
        kind="permission_error",
    )
