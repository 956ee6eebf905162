"""Entry point for ``python -m nodes.agent`` and the ``nexus-agent`` script."""

from __future__ import annotations

from nodes.agent.server import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
