"""Passive health: a circuit breaker per target, fed by real request outcomes; latency EWMAs.

Per target the circuit is closed (takes traffic), open (ejected for a cooldown) or half-open (the
cooldown is over and one trial request may go). Nothing is cached: every answer is computed from
the recorded facts and the `now` passed in, so a change takes effect on the very next call.

How the gateway uses it: the snapshot reads `circuit_open()` and `error_rate()` (no side
effect); only for the target it actually picked does it call `allow()`, which claims the
half-open trial. Every request sent to a target ends with `record()`, or with `abandon()` when
it ended without a verdict (the client left), so a trial is never left claimed. A target the
active probes report degraded (`record(..., degraded=True)`) is ejected by its first failed
request.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from enum import StrEnum


class CircuitState(StrEnum):
    """A target's passive health; the values compare equal to the plain strings."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """When to eject a target and for how long."""

    consecutive_failures_to_eject: int = 3
    # Ejects when failures / outcomes >= this, over the last `window` outcomes, once there are at
    # least `min_samples` of them (fewer say too little about the rate).
    error_rate_threshold: float = 0.5
    window: int = 20
    min_samples: int = 10
    base_cooldown_s: float = 5.0
    max_cooldown_s: float = 120.0
    cooldown_growth: float = 2.0  # each ejection without a recovery in between multiplies it
    # Successes in a row after closing that forgive past ejections (the next one starts at base).
    successes_to_forgive: int = 5
    # A claimed trial with no verdict after this long is presumed lost and another may go. A
    # backstop only: the gateway records or abandons every request it sends.
    trial_timeout_s: float = 60.0

    def cooldown_s(self, ejections: int) -> float:
        """Return how long the `ejections`-th ejection in a row lasts."""
        # The exponent is capped so a long outage cannot overflow the float.
        growth = self.cooldown_growth ** min(max(ejections - 1, 0), 64)
        return min(self.max_cooldown_s, self.base_cooldown_s * growth)


@dataclass(frozen=True, slots=True)
class CircuitReport:
    """Why a target's circuit keeps new requests away, as of one moment."""

    probe_failing: bool = False  # held open by the active probes' unhealthy verdict
    cause: str = ""  # what ejected it, e.g. "3 consecutive failures"
    # Open: seconds until the half-open trial may go. None: half-open with its trial out.
    trial_in_s: float | None = None

    @property
    def detail(self) -> str:
        """Say it in one line: "circuit open: 3 consecutive failures; half-open trial in 4.0 s"."""
        if self.probe_failing:
            return "the active probe reports it unhealthy"
        if self.trial_in_s is not None:
            return f"circuit open: {self.cause}; half-open trial in {self.trial_in_s:.1f} s"
        return f"half-open after {self.cause}: a trial request is in flight"


@dataclass(slots=True)
class _Circuit:
    outcomes: deque[bool]  # True = ok, newest last
    consecutive_failures: int = 0
    successes_since_close: int = 0
    ejections: int = 0  # in a row; sets the next cooldown
    open_until: float | None = None  # None: closed; past it: half-open
    cause: str = ""
    trial_since: float | None = None  # when the in-flight half-open trial was claimed
    probe_failing: bool = False


@dataclass(slots=True)
class PassiveHealth:
    """Keep each target's circuit from request outcomes and active probe verdicts."""

    policy: HealthPolicy = field(default_factory=HealthPolicy)
    _circuits: dict[int, _Circuit] = field(default_factory=dict, init=False, repr=False)

    def record(
        self, target_id: int, ok: bool, now: float, *, degraded: bool = False, why: str = ""
    ) -> None:
        """Record the outcome of a request sent to the target.

        degraded: its latest active probe failed; it serves only for want of a healthy target,
        so one real failure is enough to take it out. why: what a failure says about the
        target, when it says something specific (an ejection's cause then names it).
        """
        circuit = self._circuit(target_id)
        circuit.outcomes.append(ok)
        state = self._passive_state(circuit, now)
        if state is CircuitState.OPEN:
            # Requests sent before the ejection are still finishing; they tell nothing about
            # how the target does now, and must not stretch or cut the cooldown.
            return
        if state is CircuitState.HALF_OPEN:
            # The first verdict after the cooldown decides, whether from the trial or from a
            # request sent earlier that only now finished.
            circuit.trial_since = None
            if ok:
                self._close(circuit)
            else:
                self._eject(circuit, now, _because("the half-open trial failed", why))
            return
        if ok:
            circuit.consecutive_failures = 0
            circuit.successes_since_close += 1
            if circuit.successes_since_close >= self.policy.successes_to_forgive:
                circuit.ejections = 0
            return
        circuit.consecutive_failures += 1
        circuit.successes_since_close = 0
        if degraded:
            cause = "a failed request while its probes fail (degraded)"
            self._eject(circuit, now, _because(cause, why))
            return
        if circuit.consecutive_failures >= self.policy.consecutive_failures_to_eject:
            cause = f"{circuit.consecutive_failures} consecutive failures"
            self._eject(circuit, now, _because(cause, why))
            return
        samples = len(circuit.outcomes)
        if samples >= self.policy.min_samples:
            rate = circuit.outcomes.count(False) / samples
            if rate >= self.policy.error_rate_threshold:
                cause = f"{rate:.0%} of the last {samples} requests failed"
                self._eject(circuit, now, _because(cause, why))

    def record_probe(self, target_id: int, healthy: bool, now: float) -> None:
        """Apply the active health checker's verdict (after its own thresholds, not per probe).

        An unhealthy verdict holds the target open, whatever its requests say, until a healthy
        one. The healthy verdict that ends the hold leaves a closed target half-open: one trial
        request proves it serves before it gets full traffic. A passive ejection keeps its
        cooldown either way.
        """
        circuit = self._circuit(target_id)
        if not healthy:
            circuit.probe_failing = True
            return
        if circuit.probe_failing:
            circuit.probe_failing = False
            # A passive ejection still in force keeps its own cooldown: the probe checks a
            # health endpoint, the requests checked real inference.
            if circuit.open_until is None:
                circuit.open_until = now
                circuit.cause = "the active probe failed"

    def abandon(self, target_id: int) -> None:
        """End a request that gave no verdict (the client left): free the trial it may hold."""
        circuit = self._circuits.get(target_id)
        if circuit is not None:
            circuit.trial_since = None

    def forgive(self, target_id: int) -> None:
        """Take back the target's latest recorded failure: it turned out to be the request's.

        An ejection it already caused stands (its cooldown is short, and the cap on ejection
        keeps the pool serving meanwhile).
        """
        circuit = self._circuits.get(target_id)
        if circuit is None or False not in circuit.outcomes:
            return
        # The newest failure: deque has no rindex, so count from the right end.
        newest = len(circuit.outcomes) - 1 - list(reversed(circuit.outcomes)).index(False)
        circuit.outcomes[newest] = True
        if circuit.consecutive_failures:
            circuit.consecutive_failures -= 1

    def forget(self, target_id: int) -> None:
        """Drop everything known about a removed target."""
        self._circuits.pop(target_id, None)

    def state(self, target_id: int, now: float) -> CircuitState:
        """Return the target's circuit state at `now`."""
        circuit = self._circuits.get(target_id)
        if circuit is None:
            return CircuitState.CLOSED
        if circuit.probe_failing:
            return CircuitState.OPEN
        return self._passive_state(circuit, now)

    def circuit_open(self, target_id: int, now: float) -> bool:
        """Return whether the target may not take a new request now (for the snapshot)."""
        state = self.state(target_id, now)
        if state is CircuitState.HALF_OPEN:
            return self._trial_in_flight(self._circuits[target_id], now)
        return state is CircuitState.OPEN

    def allow(self, target_id: int, now: float) -> bool:
        """Return whether a request may go to the target now; in half-open, claim the trial."""
        state = self.state(target_id, now)
        if state is CircuitState.CLOSED:
            return True
        if state is CircuitState.OPEN:
            return False
        circuit = self._circuits[target_id]
        if self._trial_in_flight(circuit, now):
            return False
        circuit.trial_since = now
        return True

    def error_rate(self, target_id: int) -> float:
        """Return the share of failures among the recent outcomes since the last recovery."""
        circuit = self._circuits.get(target_id)
        if circuit is None or not circuit.outcomes:
            return 0.0
        return circuit.outcomes.count(False) / len(circuit.outcomes)

    def open_until(self, target_id: int) -> float | None:
        """Return when the current ejection's cooldown ends, or None when not ejected."""
        circuit = self._circuits.get(target_id)
        return None if circuit is None else circuit.open_until

    def report(self, target_id: int, now: float) -> CircuitReport | None:
        """Return why the target takes no new request now; None if it does."""
        circuit = self._circuits.get(target_id)
        if circuit is None:
            return None
        if circuit.probe_failing:
            return CircuitReport(probe_failing=True)
        state = self._passive_state(circuit, now)
        if state is CircuitState.OPEN:
            assert circuit.open_until is not None
            return CircuitReport(cause=circuit.cause, trial_in_s=circuit.open_until - now)
        if state is CircuitState.HALF_OPEN and self._trial_in_flight(circuit, now):
            return CircuitReport(cause=circuit.cause)
        return None

    def explain(self, target_id: int, now: float) -> str | None:
        """Return why the target takes no new request now, for the history; None if it does."""
        report = self.report(target_id, now)
        return report.detail if report is not None else None

    def _circuit(self, target_id: int) -> _Circuit:
        circuit = self._circuits.get(target_id)
        if circuit is None:
            circuit = self._circuits[target_id] = _Circuit(deque(maxlen=self.policy.window))
        return circuit

    @staticmethod
    def _passive_state(circuit: _Circuit, now: float) -> CircuitState:
        if circuit.open_until is None:
            return CircuitState.CLOSED
        if now < circuit.open_until:
            return CircuitState.OPEN
        return CircuitState.HALF_OPEN

    def _trial_in_flight(self, circuit: _Circuit, now: float) -> bool:
        started = circuit.trial_since
        return started is not None and now - started < self.policy.trial_timeout_s

    def _eject(self, circuit: _Circuit, now: float, cause: str) -> None:
        circuit.ejections += 1
        circuit.open_until = now + self.policy.cooldown_s(circuit.ejections)
        circuit.cause = cause
        circuit.consecutive_failures = 0
        circuit.successes_since_close = 0
        circuit.trial_since = None

    @staticmethod
    def _close(circuit: _Circuit) -> None:
        # A fresh window after a proven recovery: the failures that caused the ejection must
        # not eject the target again on its next single failure. `ejections` stays until
        # enough successes forgive it, so a flapping target's cooldowns keep growing.
        circuit.open_until = None
        circuit.cause = ""
        circuit.outcomes.clear()
        circuit.consecutive_failures = 0
        circuit.successes_since_close = 0


@dataclass(slots=True)
class LatencyStats:
    """Exponentially weighted averages of one target's time to first token and per token."""

    alpha: float = 0.2  # weight of the newest sample
    ttft_s: float | None = None
    tpot_s: float | None = None
    service_s: float | None = None  # how long a request held a slot (sent to released)

    def record(
        self,
        ttft_s: float | None = None,
        tpot_s: float | None = None,
        service_s: float | None = None,
    ) -> None:
        """Fold in a finished request's timings; pass None for one it did not measure."""
        if service_s is not None:
            self.service_s = (
                service_s if self.service_s is None else self._blend(self.service_s, service_s)
            )
        if ttft_s is not None:
            self.ttft_s = ttft_s if self.ttft_s is None else self._blend(self.ttft_s, ttft_s)
        if tpot_s is not None:
            self.tpot_s = tpot_s if self.tpot_s is None else self._blend(self.tpot_s, tpot_s)

    def _blend(self, average: float, sample: float) -> float:
        return average + self.alpha * (sample - average)


@dataclass(slots=True)
class ServerErrorMemory:
    """Which targets recently answered which request (by fingerprint) with a server error.

    A 500 that another target also returned for the same request is the request's fault (a
    prompt every engine fails on, such as a lone surrogate), not the target's: DESIGN.md
    "Faults and ejection". Bounded in entries and age; fingerprints are hashes, never content.
    """

    max_entries: int = 10_000
    ttl_s: float = 600.0
    _seen: OrderedDict[str, tuple[float, set[int]]] = field(
        default_factory=OrderedDict, init=False, repr=False
    )

    def note(self, fingerprint: str, target_id: int, now: float) -> frozenset[int]:
        """Remember the target failed this request; return the other targets that failed it."""
        found = self._seen.pop(fingerprint, None)
        targets = found[1] if found is not None and now - found[0] < self.ttl_s else set()
        others = frozenset(targets - {target_id})
        targets.add(target_id)
        self._seen[fingerprint] = (now, targets)
        while len(self._seen) > self.max_entries:
            self._seen.popitem(last=False)
        return others


def _because(cause: str, why: str) -> str:
    """Name what the failure that tipped the circuit said, when it said something specific."""
    return f"{cause}, the last: {why}" if why else cause
