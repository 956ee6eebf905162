"""Retries by failure phase, and the retry budget."""

from __future__ import annotations

import pytest

from pools.balancer.retry import (
    FailurePhase,
    RetryBudget,
    classify,
    is_target_fault,
    may_retry,
    retryable,
)

P = FailurePhase


def attempt(
    *,
    connected: bool = True,
    request_sent: bool = True,
    status: int | None = 200,
    output_started: bool = False,
    timed_out: bool = False,
    broken: bool = False,
    rewritten: bool = False,
) -> FailurePhase | None:
    return classify(
        rewritten=rewritten,
        connected=connected,
        request_sent=request_sent,
        status=status,
        output_started=output_started,
        timed_out=timed_out,
        broken=broken,
    )


# classify: the table

CASES = [
    # what happened, the facts, the phase
    ("a complete answer", {}, None),
    ("a complete stream", {"output_started": True}, None),
    ("a relayed redirect", {"status": 307}, None),
    ("connect refused", {"connected": False, "request_sent": False, "status": None}, P.CONNECT),
    (
        "connect timed out",
        {"connected": False, "request_sent": False, "status": None, "timed_out": True},
        P.CONNECT,
    ),
    ("reset before the request was sent", {"request_sent": False, "status": None}, P.CONNECT),
    (
        "timed out while sending the request",
        {"request_sent": False, "status": None, "timed_out": True},
        P.CONNECT,
    ),
    ("reset after sending, before a response", {"status": None}, P.CONNECT),
    (
        "timeout after the request was sent",
        {"status": None, "timed_out": True},
        P.AMBIGUOUS_TIMEOUT,
    ),
    ("429 before output", {"status": 429}, P.REFUSED_STATUS),
    ("502 before output", {"status": 502}, P.REFUSED_STATUS),
    ("503 before output", {"status": 503}, P.REFUSED_STATUS),
    ("504 before output", {"status": 504}, P.REFUSED_STATUS),
    ("503 whose body then timed out", {"status": 503, "timed_out": True}, P.REFUSED_STATUS),
    ("400 bad request", {"status": 400}, P.CLIENT_ERROR),
    ("404 not found", {"status": 404}, P.CLIENT_ERROR),
    ("401 to a forwarded request", {"status": 401}, P.CLIENT_ERROR),
    ("401 to what Nexus wrote", {"status": 401, "rewritten": True}, P.MISCONFIGURED),
    ("403 to what Nexus wrote", {"status": 403, "rewritten": True}, P.MISCONFIGURED),
    ("404 to what Nexus wrote", {"status": 404, "rewritten": True}, P.MISCONFIGURED),
    ("400 to what Nexus wrote", {"status": 400, "rewritten": True}, P.CLIENT_ERROR),
    ("422 to what Nexus wrote", {"status": 422, "rewritten": True}, P.CLIENT_ERROR),
    (
        "a 401 already relayed",
        {"status": 401, "rewritten": True, "output_started": True},
        P.AFTER_OUTPUT,
    ),
    ("413 too large", {"status": 413}, P.CLIENT_ERROR),
    ("422 unprocessable", {"status": 422}, P.CLIENT_ERROR),
    ("500 internal error", {"status": 500}, P.SERVER_ERROR),
    ("501 not implemented", {"status": 501}, P.SERVER_ERROR),
    ("200 whose body timed out before any output", {"timed_out": True}, P.AFTER_OUTPUT),
    ("200 whose body broke before any output", {"broken": True}, P.AFTER_OUTPUT),
    ("stream timed out midway", {"output_started": True, "timed_out": True}, P.AFTER_OUTPUT),
    ("stream reset midway", {"output_started": True, "broken": True}, P.AFTER_OUTPUT),
    ("a 503 already relayed", {"status": 503, "output_started": True}, P.AFTER_OUTPUT),
]


@pytest.mark.parametrize(("facts", "phase"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_it_classifies_each_failure_by_its_phase(facts, phase):
    assert attempt(**facts) is phase


# retryable


@pytest.mark.parametrize(
    ("phase", "expected"),
    [
        (P.CONNECT, True),
        (P.REFUSED_STATUS, True),
        (P.MISCONFIGURED, True),
        (P.AMBIGUOUS_TIMEOUT, False),
        (P.AFTER_OUTPUT, False),
        (P.CLIENT_ERROR, False),
        (P.SERVER_ERROR, False),
    ],
)
def test_only_failures_before_the_target_took_the_request_are_retryable(phase, expected):
    assert retryable(phase) is expected


def test_it_never_retries_a_timeout_after_the_request_was_sent():
    phase = attempt(status=None, timed_out=True)

    assert may_retry(phase, 1, 2, RetryBudget(), active=10) == (
        False,
        "not retried: timeout after the request was sent is ambiguous",
    )


def test_only_a_bad_request_leaves_the_targets_health_alone():
    assert [phase for phase in P if not is_target_fault(phase)] == [P.CLIENT_ERROR]


def test_every_phase_has_a_description():
    assert P.CONNECT.description == "connect failed, or the connection was reset before a response"
    assert P.REFUSED_STATUS.description == "429/502/503/504 before any output"
    assert P.AMBIGUOUS_TIMEOUT.description == "timeout after the request was sent"
    assert P.AFTER_OUTPUT.description == "failed after output started"
    assert P.CLIENT_ERROR.description == "4xx caused by the request"
    assert all(phase.description for phase in P)


# may_retry: the reason kept in history


@pytest.mark.parametrize(
    ("phase", "attempt_no", "status", "expected"),
    [
        (P.REFUSED_STATUS, 1, 503, (True, "retried: 503 before output")),
        (P.REFUSED_STATUS, 1, 429, (True, "retried: 429 before output")),
        (P.REFUSED_STATUS, 1, None, (True, "retried: refused before output")),
        (
            P.MISCONFIGURED,
            1,
            401,
            (True, "retried: 401: the target rejects its credential"),
        ),
        (
            P.MISCONFIGURED,
            1,
            404,
            (True, "retried: 404: the target does not serve the model id it was given"),
        ),
        (P.MISCONFIGURED, 2, 403, (False, "not retried: attempts exhausted (2 of 2)")),
        (P.CONNECT, 1, None, (True, "retried: connection failed before a response")),
        (P.CONNECT, 2, None, (False, "not retried: attempts exhausted (2 of 2)")),
        (P.REFUSED_STATUS, 2, 502, (False, "not retried: attempts exhausted (2 of 2)")),
        (
            P.AMBIGUOUS_TIMEOUT,
            1,
            None,
            (False, "not retried: timeout after the request was sent is ambiguous"),
        ),
        (P.AFTER_OUTPUT, 1, 200, (False, "not retried: failed after output started")),
        (P.CLIENT_ERROR, 1, 400, (False, "not retried: 400 is caused by the request")),
        (P.CLIENT_ERROR, 1, None, (False, "not retried: 4xx is caused by the request")),
        (P.SERVER_ERROR, 1, 500, (False, "not retried: 500 after the target took the request")),
    ],
)
def test_it_gives_the_reason_for_each_retry_decision(phase, attempt_no, status, expected):
    assert may_retry(phase, attempt_no, 2, RetryBudget(), active=10, status=status) == expected


def test_a_phase_that_is_never_retried_takes_no_budget():
    budget = RetryBudget()

    may_retry(P.AFTER_OUTPUT, 1, 2, budget, active=10)
    may_retry(P.CONNECT, 2, 2, budget, active=10)

    assert budget.in_progress == 0


def test_a_granted_retry_holds_a_budget_slot_until_released():
    budget = RetryBudget()

    assert may_retry(P.CONNECT, 1, 3, budget, active=0)[0] is True
    assert budget.in_progress == 1
    budget.release()
    assert budget.in_progress == 0


def test_a_request_provably_not_delivered_is_retried_whatever_the_budget():
    budget = RetryBudget()
    for _ in range(3):
        assert budget.try_acquire(active_requests=0)

    assert may_retry(P.CONNECT, 1, 2, budget, active=0, delivered=False) == (
        True,
        "retried: not delivered (connection refused), outside the retry budget",
    )
    assert budget.in_progress == 3  # no slot taken: nothing to give back


def test_attempts_still_bound_the_retries_of_a_request_not_delivered():
    assert may_retry(P.CONNECT, 2, 2, RetryBudget(), active=0, delivered=False) == (
        False,
        "not retried: attempts exhausted (2 of 2)",
    )


def test_it_stops_retrying_when_the_budget_is_spent():
    budget = RetryBudget()
    for _ in range(3):
        assert budget.try_acquire(active_requests=0)

    assert may_retry(P.REFUSED_STATUS, 1, 2, budget, active=0, status=503) == (
        False,
        "not retried: retry budget exhausted",
    )


# RetryBudget


@pytest.mark.parametrize(
    ("active", "limit"),
    [(0, 3), (10, 3), (15, 3), (20, 4), (24, 4), (25, 5), (100, 20), (1000, 200)],
)
def test_the_budget_allows_20_percent_of_active_requests_and_at_least_3(active, limit):
    budget = RetryBudget()

    granted = sum(budget.try_acquire(active) for _ in range(limit + 5))

    assert budget.limit(active) == limit
    assert granted == limit
    assert budget.in_progress == limit


def test_a_released_retry_slot_can_be_taken_again():
    budget = RetryBudget()
    for _ in range(3):
        budget.try_acquire(0)
    assert budget.try_acquire(0) is False

    budget.release()

    assert budget.try_acquire(0) is True


def test_releasing_more_than_was_taken_is_a_bug():
    with pytest.raises(RuntimeError, match="without a matching"):
        RetryBudget().release()
