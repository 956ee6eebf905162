"""Measured outcomes of injected faults: each fault test notes what it sent, what failed and how
long recovery took; the reliability suite prints them as one table (docs/reliability.md)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FaultOutcome:
    """What one injected fault did to the traffic."""

    fault: str
    server: str  # daphne | uvicorn
    sent: int  # requests (or connections) sent during the fault
    failed: int  # of those, how many the client saw fail
    recovery_s: float | None  # from the fault to normal service again; None: not applicable
    outcome: str  # what the client saw, in words


measured: list[FaultOutcome] = []


def note(outcome: FaultOutcome) -> FaultOutcome:
    """Keep a fault's measured outcome and log it."""
    measured.append(outcome)
    recovery = "-" if outcome.recovery_s is None else f"{outcome.recovery_s:.3f} s"
    log.info(
        "measured fault %s (%s): sent %d, failed %d, recovery %s: %s",
        outcome.fault, outcome.server, outcome.sent, outcome.failed, recovery, outcome.outcome,
    )  # fmt: skip
    return outcome


def table() -> list[str]:
    """Return the measured outcomes as Markdown table lines."""
    lines = [
        "| fault | server | sent | failed | recovery | outcome |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for o in measured:
        recovery = "-" if o.recovery_s is None else f"{o.recovery_s:.2f} s"
        lines.append(
            f"| {o.fault} | {o.server} | {o.sent} | {o.failed} | {recovery} | {o.outcome} |"
        )
    return lines
