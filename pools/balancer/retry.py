"""Retries by failure phase: only what certainly did not reach a target's model is tried again.

DESIGN.md "Retries": a different target may be tried only before any byte of output reached the
client, on connect errors, a connection reset before a response, a 429/502/503/504, or a target
that refuses what Nexus itself wrote into the request (its credential, its model id). Never a
timeout after the request was sent (the target may be generating), a 4xx caused by the request,
or anything after output started. A budget caps retries so an outage cannot double the load.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

# Statuses with which a target refuses work it has not started: busy, or a proxy in front of it
# could not reach it.
REFUSED_STATUSES = frozenset({429, 502, 503, 504})
# Statuses that, for a request whose model and Authorization Nexus rewrote for the target, say
# the target is misconfigured (its credential, or the model id it was given), not the request.
MISCONFIGURED_STATUSES = frozenset({401, 403, 404})


class FailurePhase(StrEnum):
    """Where an attempt failed, which decides whether another target may try."""

    CONNECT = "connect"
    REFUSED_STATUS = "refused_status"
    MISCONFIGURED = "misconfigured"
    AMBIGUOUS_TIMEOUT = "ambiguous_timeout"
    AFTER_OUTPUT = "after_output"
    CLIENT_ERROR = "client_error"
    SERVER_ERROR = "server_error"

    @property
    def description(self) -> str:
        """Return the phase in words."""
        return _DESCRIPTIONS[self]


_DESCRIPTIONS = {
    FailurePhase.CONNECT: "connect failed, or the connection was reset before a response",
    FailurePhase.REFUSED_STATUS: "429/502/503/504 before any output",
    FailurePhase.MISCONFIGURED: "401/403/404 to what Nexus wrote: the target's credential or model",
    FailurePhase.AMBIGUOUS_TIMEOUT: "timeout after the request was sent",
    FailurePhase.AFTER_OUTPUT: "failed after output started",
    FailurePhase.CLIENT_ERROR: "4xx caused by the request",
    FailurePhase.SERVER_ERROR: "another 5xx: the target took the request and failed on it",
}


def classify(
    *,
    connected: bool,
    request_sent: bool,
    status: int | None,
    output_started: bool,
    timed_out: bool,
    broken: bool = False,
    rewritten: bool = False,
) -> FailurePhase | None:
    """Return the phase an attempt failed in, or None when it succeeded.

    connected: a connection to the target was established. request_sent: the whole request
    was written to it. status: the response status, None when none arrived. output_started: a
    byte of the answer reached the client. timed_out: the attempt ended by a timeout. broken:
    the answer broke off (reset, protocol error) after its status arrived. rewritten: Nexus
    wrote the request's model and Authorization for this target (an OpenAI pool request, not a
    /serve request forwarded as it came).

    First match wins:
    1. output_started: AFTER_OUTPUT if it timed out, broke or has a status >= 400 or none,
       else None.
    2. no status, timed out after the request was sent: AMBIGUOUS_TIMEOUT.
    3. no status otherwise (connect failed or timed out, reset before or after sending,
       timeout while sending): CONNECT.
    4. 429, 502, 503, 504: REFUSED_STATUS (the target refused; a body that then broke
       changes nothing).
    5. 401, 403, 404 to a rewritten request: MISCONFIGURED (the credential or the model id
       that Nexus sent is wrong for the target; the caller's own request is not at fault).
    6. another 4xx: CLIENT_ERROR. 7. another 5xx: SERVER_ERROR.
    8. a status below 400 whose body timed out or broke before any output: AFTER_OUTPUT (the
       target had begun its answer, so it did the work).
    9. otherwise: None.
    """
    if output_started:
        failed = timed_out or broken or status is None or status >= 400
        return FailurePhase.AFTER_OUTPUT if failed else None
    if status is None:
        if timed_out and connected and request_sent:
            return FailurePhase.AMBIGUOUS_TIMEOUT
        return FailurePhase.CONNECT
    if status in REFUSED_STATUSES:
        return FailurePhase.REFUSED_STATUS
    if rewritten and status in MISCONFIGURED_STATUSES:
        return FailurePhase.MISCONFIGURED
    if 400 <= status < 500:
        return FailurePhase.CLIENT_ERROR
    if status >= 500:
        return FailurePhase.SERVER_ERROR
    if timed_out or broken:
        return FailurePhase.AFTER_OUTPUT
    return None


def retryable(phase: FailurePhase) -> bool:
    """Return whether another target may be tried after a failure in this phase."""
    return phase in (FailurePhase.CONNECT, FailurePhase.REFUSED_STATUS, FailurePhase.MISCONFIGURED)


def is_target_fault(phase: FailurePhase) -> bool:
    """Return whether the failure counts against the target's passive health."""
    # A 4xx says the target answered properly to a bad request.
    return phase is not FailurePhase.CLIENT_ERROR


@dataclass(slots=True)
class RetryBudget:
    """Cap retries in progress at a share of active requests, with a small floor."""

    ratio: float = 0.2
    minimum: int = 3  # so a quiet pool can still retry
    in_progress: int = 0

    def limit(self, active_requests: int) -> int:
        """Return how many retries may be in progress with this many active requests."""
        # The epsilon keeps float products such as 100 * 0.29 = 28.999... from losing a slot.
        return max(self.minimum, int(active_requests * self.ratio + 1e-9))

    def try_acquire(self, active_requests: int) -> bool:
        """Take a retry slot if the budget allows; the caller releases it when the retry ends."""
        if self.in_progress >= self.limit(active_requests):
            return False
        self.in_progress += 1
        return True

    def release(self) -> None:
        """Give back a retry slot taken by try_acquire."""
        if self.in_progress <= 0:
            raise RuntimeError("release() without a matching try_acquire()")
        self.in_progress -= 1


def may_retry(
    phase: FailurePhase,
    attempt: int,
    max_attempts: int,
    budget: RetryBudget,
    active: int,
    *,
    status: int | None = None,
    delivered: bool = True,
) -> tuple[bool, str]:
    """Decide whether to try another target after a failed attempt, with the reason for history.

    attempt: the number of the attempt that failed, from 1. active: requests in progress in the
    pool. status: the failed attempt's status, for the reason. delivered: the request may have
    reached the target (False only when provably not: a refused connect). A True answer for a
    delivered request holds a budget slot: release it when the retry ends.
    """
    if not retryable(phase):
        return False, f"not retried: {_not_retryable_reason(phase, status)}"
    if attempt >= max_attempts:
        return False, f"not retried: attempts exhausted ({attempt} of {max_attempts})"
    if not delivered:
        # The budget keeps retries from multiplying the load on struggling targets; a request
        # that never arrived added no load anywhere, so it never waits for the budget.
        return True, "retried: not delivered (connection refused), outside the retry budget"
    if not budget.try_acquire(active):
        return False, "not retried: retry budget exhausted"
    if phase is FailurePhase.REFUSED_STATUS:
        return True, f"retried: {status if status is not None else 'refused'} before output"
    if phase is FailurePhase.MISCONFIGURED:
        return True, f"retried: {misconfiguration(status)}"
    return True, "retried: connection failed before a response"


def misconfiguration(status: int | None) -> str:
    """Say in words what a MISCONFIGURED status tells about the target."""
    if status == 404:
        return "404: the target does not serve the model id it was given"
    return f"{status}: the target rejects its credential"


def _not_retryable_reason(phase: FailurePhase, status: int | None) -> str:
    if phase is FailurePhase.AMBIGUOUS_TIMEOUT:
        return "timeout after the request was sent is ambiguous"
    if phase is FailurePhase.AFTER_OUTPUT:
        return "failed after output started"
    code = f"{status} " if status is not None else ""
    if phase is FailurePhase.CLIENT_ERROR:
        return f"{code or '4xx '}is caused by the request"
    return f"{code or '5xx '}after the target took the request"
