"""Simulated OpenAI-compatible inference engine with vLLM metrics and injectable faults.

Run it with ``python -m serving.runtimes.simulator --port 9101 --model demo-8b``; see
docs/simulator.md for the behaviour model.
"""

from __future__ import annotations

from .config import Faults, SimulatorConfig, parse_args
from .server import SimulatorServer, main, serve

__all__ = ["Faults", "SimulatorConfig", "SimulatorServer", "main", "parse_args", "serve"]
