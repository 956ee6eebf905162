"""Entry point for ``python -m serving.runtimes.simulator``."""

from __future__ import annotations

from .server import main

main()
