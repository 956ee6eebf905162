"""One request's way through the balancer: decide, queue, claim a slot, forward, retry, record.

A flight is an OpenAI request (/v1: a JSON body whose `model` becomes the target's) or a
forwarded one (/serve: any method, path, query, headers and body, sent on as they came).
Every failure is classified by the phase it happened in (pools.balancer.retry): only a connect
failure or a refusal (429/502/503/504) before any byte reached the client moves to another
target, within the pool's attempts and the retry budget; a forwarded request whose method is not
idempotent moves only when it never reached a target (a failed connect, or a node agent's
`X-Nexus-Not-Delivered` answer). Every acquired slot is released exactly once, whatever ends the
attempt (success, failure, client gone, cancellation).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
import httpx
from httpx_aiohttp.transport import AiohttpResponseStream, map_aiohttp_exceptions

from nexus import upstream
from pools.balancer import explain
from pools.balancer.queue import WOKEN_IN_ORDER, QueueFull, QueueTimeout
from pools.balancer.retry import (
    FailurePhase,
    classify,
    is_target_fault,
    misconfiguration,
)
from pools.balancer.snapshot import (
    Decision,
    DrainState,
    Health,
    RequestFacts,
    Skipped,
    SkipReason,
    StickyWait,
    Strategy,
)
from pools.balancer.sticky import MAX_WAIT_S, after_wait
from pools.gateway import errors, metrics
from pools.gateway.errors import GatewayError
from pools.gateway.history import AttemptRow, DecisionFacts, HistoryRecord
from pools.gateway.ledger import Admission, Lease
from pools.gateway.silence import SilenceTimer
from pools.gateway.snapshot import PoolEntry, TargetEntry, TokenEntry
from pools.gateway.state import GatewayState
from pools.gateway.usage import TAIL_CHUNKS, USAGE_KEY, read_usage
from pools.models import RoutingOutcome

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]

# Upstream response headers worth relaying to an OpenAI client; hop-by-hop ones are not.
RELAYED_HEADERS = frozenset(
    {b"content-type", b"content-length", b"content-encoding", b"cache-control", b"retry-after"}
)
# Headers that concern one connection, never forwarded either way (RFC 9110 7.6.1), with those
# a Connection header names.
HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
     b"trailer", b"trailers", b"transfer-encoding", b"upgrade"}
)  # fmt: skip
# A forwarded request also loses the client's credential (the target's replaces it), what the
# upstream request sets itself, and Expect (the body was already read in full).
NOT_FORWARDED = HOP_BY_HOP | {b"authorization", b"host", b"content-length", b"expect"}
# A forwarded answer loses Date and Server, which the ASGI server writes itself.
NOT_RELAYED = HOP_BY_HOP | {b"date", b"server"}
# Methods a forwarded request may be sent again with after it reached a target (RFC 9110 9.2.2).
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
# Transport failures before any byte of the request left: the connect was refused or timed out.
NOT_DELIVERED = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
# Set by a node's agent on an error it answered before anything reached the runtime (process not
# running, no port, connection refused): the request was not delivered, like a failed connect.
# Trusted only from targets on nodes: a hosted provider must not trigger retries of a POST.
NOT_DELIVERED_HEADER = "x-nexus-not-delivered"
# A non-streaming answer up to this size is sent to the client in one piece.
WHOLE_BODY_MAX_BYTES = 1024 * 1024
# Ledger races (another process took the last slot between the decision and the acquire) are
# retried this many times before the request waits in the queue.
CLAIM_RACES = 3
# Callers of a public service without a token share one turn in the pool's fair queue (token ids
# start at 1).
ANONYMOUS_QUEUE_ID = 0


@dataclass(frozen=True, slots=True)
class Forward:
    """A /serve request, sent on to a replica as it came."""

    method: str
    path: str  # raw (still percent-encoded), below the replica's root URL, starting with "/"
    query: str  # the raw query string, "" when none
    headers: list[tuple[bytes, bytes]]  # the client's, less those in NOT_FORWARDED
    body: bytes
    client_path: str  # /serve/<service>/..., for the history (never the query: it may hold secrets)

    @property
    def idempotent(self) -> bool:
        return self.method in IDEMPOTENT_METHODS


def forwarded_headers(
    headers: list[tuple[bytes, bytes]], dropped: frozenset[bytes]
) -> list[tuple[bytes, bytes]]:
    """Return the headers that travel on (lowercased): not `dropped`, nor named by Connection."""
    lowered = [(name.lower(), value) for name, value in headers]
    named = {
        part.strip().lower()
        for name, value in lowered
        if name == b"connection"
        for part in value.split(b",")
    }
    return [(name, value) for name, value in lowered if name not in dropped and name not in named]


@dataclass(slots=True)
class Flight:
    """A request on its way: what it asked, where it went, and how it ended (for the history)."""

    request_id: str
    token: TokenEntry | None  # None: a public service's caller sent none (or it was ignored)
    pool: PoolEntry
    kind: str
    payload: dict[str, Any]
    stream: bool
    deadline: float  # monotonic: the latest moment a slot may still be granted
    session_key: str | None
    prefix_key: str | None
    facts: RequestFacts
    forward: Forward | None = None  # a /serve request; None for an OpenAI one built from payload
    arrived: float = field(default_factory=time.time)
    started: float = field(default_factory=time.monotonic)
    decision: Decision | None = None  # the latest: the last attempt's, or the one that found none
    # The decision that chose each attempt's target, in order (attempts[i] went where
    # decisions[i] said).
    decisions: list[Decision] = field(default_factory=list)
    attempts: list[AttemptRow] = field(default_factory=list)
    queue_wait_s: float = 0.0
    # The rule that gave the request its slot when it waited (queue.FairQueue.pop_for), or "".
    woken_by: str = ""
    # The verdict it waited for its full sticky target on (balancer.sticky), at most once.
    sticky_wait: StickyWait | None = None
    sticky_waited_s: float = 0.0
    ttft_s: float | None = None
    target: TargetEntry | None = None
    status: int | None = None
    outcome: str = RoutingOutcome.CLIENT_GONE
    failure_reason: str = ""
    retries_held: int = 0  # retry-budget slots to give back
    usage: tuple[int, int] | None = None  # (prompt, completion) tokens the answer reported
    chunks: int = 0  # body chunks relayed from the answering target (a stream's, for Live)

    def history_record(self) -> HistoryRecord:
        """Return the compact record the history writer turns into a row (off the event loop)."""
        forward = self.forward
        decision = DecisionFacts(
            self.decision,
            tuple(self.decisions),
            self.kind,
            self.facts.sticky_target_id,
            self.facts.prefix_target_id,
            forward.method if forward is not None else None,
            forward.client_path if forward is not None else None,
            self.woken_by,
        )
        target = self.target
        token = self.token
        usage = self.usage
        return HistoryRecord(
            self.request_id,
            self.pool.id,
            self.kind,
            self.outcome,
            self.arrived,
            token.id if token else None,
            token.name if token else "",
            target.id if target else None,
            target.name if target else "",
            self.status,
            self.failure_reason,
            self.attempts,
            decision,
            round(self.queue_wait_s * 1000, 3),
            round(self.ttft_s * 1000, 3) if self.ttft_s is not None else None,
            round((time.monotonic() - self.started) * 1000, 3),
            self.stream,
            usage[0] if usage else None,
            usage[1] if usage else None,
        )


class HeldSlot:
    """A slot claimed on a target for one attempt, given back exactly once.

    Freed as soon as the target's answer has all arrived, before its last bytes go to the
    client: a client that sends its next request the moment one ends finds the slot free, and
    a waiter starts while the end is still being written (given back after the last write, it
    was still counted when such a next request could arrive, and on a one-slot target that
    request would go elsewhere or wait). Settled when the attempt ends, whatever ended it.
    """

    __slots__ = ("_state", "_pool", "_kind", "_target", "_lease", "_claimed_at", "_release")

    def __init__(
        self, state: GatewayState, pool: PoolEntry, kind: str, target: TargetEntry, lease: Lease
    ) -> None:
        self._state = state
        self._pool = pool
        self._kind = kind
        self._target = target
        self._lease = lease
        self._claimed_at = time.monotonic()
        self._release: asyncio.Future[None] | None = None

    def free(self) -> None:
        """Start giving the slot back on the loop's next turn: before the client can have
        heard the answer end and sent another request, and without the shared ledger's round
        trip delaying that end."""
        if self._release is None:
            held_s = time.monotonic() - self._claimed_at
            self._release = asyncio.ensure_future(
                self._state.release(self._pool, self._kind, self._target, self._lease, held_s)
            )

    async def settle(self) -> None:
        """Give the slot back if not yet, and wait until it is.

        Shielded: a client that leaves (even just after its answer ended) cancels the
        request's task, and must not cancel giving the slot back with it.
        """
        self.free()
        assert self._release is not None
        await asyncio.shield(self._release)


class Router:
    """Route flights through one process's live state, by its operations alone."""

    def __init__(
        self, state: GatewayState, current: Callable[[PoolEntry], PoolEntry] | None = None
    ):
        self.state = state
        # The pool as the latest configuration snapshot has it (by default: as it was).
        self._current = current or (lambda pool: pool)

    async def fly(self, send: Send, flight: Flight) -> None:
        """Answer the request from the best target, retrying where that is safe."""
        pool = flight.pool
        token = flight.token
        admission: Admission | None = None
        self.state.begin(pool)
        try:
            if token is not None and token.limits.any:
                # Before the queue: a token's limits are its own, apart from the pool's fairness.
                admission = await self.state.admit(token.id, token.limits)
                if admission.refused is not None:
                    limit = admission.refused
                    value = token.limits.value(limit) or 0
                    raise errors.rate_limited(token.name, limit, value, admission.retry_after_s)
            await self._attempts(send, flight)
        except GatewayError as error:
            flight.status = error.status
            flight.failure_reason = error.message
            flight.outcome = _outcome_of(error)
            raise
        except asyncio.CancelledError:
            if self.state.cutting:
                flight.outcome = RoutingOutcome.INTERRUPTED
                flight.failure_reason = "ended by the shutdown of this Nexus process"
            raise
        finally:
            target_name = flight.target.name if flight.target else None
            metrics.observe_request(
                pool.slug,
                target_name,
                flight.outcome,
                flight.queue_wait_s,
                flight.ttft_s,
                time.monotonic() - flight.started,
                flight.usage,
            )
            chunks = flight.chunks if flight.stream else 0
            self.state.end(pool, flight.retries_held, flight.history_record(), chunks)
            if admission is not None and admission.refused is None:
                used = sum(flight.usage) if flight.usage else 0
                await asyncio.shield(self.state.settle(admission, used))

    async def _attempts(self, send: Send, flight: Flight) -> None:
        exclude: set[int] = set()
        failure: GatewayError | None = None
        for attempt in range(1, flight.pool.max_attempts + 1):
            try:
                target, lease = await self._claim(flight, exclude)
            except GatewayError as error:
                # No other target to retry on: the client hears what went wrong on the last one.
                if failure is not None and error.code == "no_target_available":
                    flight.attempts[-1]["retried"] = False
                    flight.attempts[-1]["reason"] = "not retried: no other target can take it"
                    raise failure from None
                raise
            flight.target = target
            if flight.decision is not None:
                flight.decisions.append(flight.decision)
            slot = HeldSlot(self.state, flight.pool, flight.kind, target, lease)
            try:
                failure = await self._attempt(send, flight, target, attempt, slot)
            finally:
                await slot.settle()
            if failure is None:
                return
            exclude.add(target.id)

    async def _claim(self, flight: Flight, exclude: set[int]) -> tuple[TargetEntry, Lease]:
        """Return the target the balancer picks and a slot on it, waiting in the queue if full."""
        state = self.state
        pool = flight.pool
        races = 0
        woken = False
        while True:
            now = time.monotonic()
            facts = _facts_now(flight, pool, woken=woken, retried=bool(exclude), now=now)
            decision = state.decide(pool, facts, frozenset(exclude), now)
            if flight.sticky_wait is not None:
                decision = after_wait(decision, flight.sticky_wait, flight.sticky_waited_s)
            flight.decision = decision
            if decision.target_id is not None:
                # Those already waiting go first: a newcomer joins the queue behind them even
                # when a slot is free this instant (it was freed for the waiter being woken).
                if woken or not state.has_waiters(pool, flight.kind):
                    if decision.sticky_wait is not None and flight.sticky_wait is None:
                        if woken:
                            # The slot it was woken for goes to the next waiter that can use
                            # it: a freed slot never waits for a request that declined it.
                            state.pass_on(pool, flight.kind, pool.target(decision.target_id))
                        woken = await self._wait_sticky(flight, decision.sticky_wait, now, woken)
                        continue
                    target = pool.target(decision.target_id)
                    readmitted = decision.ranking[0].factors[-1] is explain.EJECTED
                    lease = await state.claim(pool, target, now, readmitted=readmitted)
                    if lease is not None:
                        return target, lease
                    races += 1
                    if races < CLAIM_RACES:
                        continue
            elif not decision.all_full and not _sleeping(pool):
                skipped = [f"{skip.name} ({_why(skip)})" for skip in decision.skipped]
                raise _no_target(pool, flight.kind, skipped)
            await self._wait(flight, now, again=woken)
            races = 0
            woken = True
            # A sleeping service's replica is a target of a later snapshot than the request's.
            pool = flight.pool = self._current(pool)

    async def _wait_sticky(self, flight: Flight, wait: StickyWait, now: float, woken: bool) -> bool:
        """Wait up to the verdict's bound for a slot on the full sticky target; return whether
        the request goes on as a woken waiter (takes a free slot, else waits first in line).

        Handed a slot there, or the bound passed: yes. It waited in the queue from its
        arrival, ahead of whoever queued meanwhile, so a wait in vain must not send it to the
        back (measured: turns that waited in vain and queued again as newcomers made the closed
        loop's longest TTFTs). Refused a place in the queue: as before (`woken`)."""
        flight.sticky_wait = wait
        queue_id = flight.token.id if flight.token is not None else ANONYMOUS_QUEUE_ID
        try:
            flight.woken_by = await self.state.wait(
                flight.pool,
                flight.kind,
                queue_id,
                wait.bound_s,
                flight.facts,
                again=False,
                only=wait.target_id,
            )
        except QueueFull:
            # No place in the queue: placed as usual from here.
            return woken
        except QueueTimeout:
            # The bound passed: placed as usual from here, keeping its place in line.
            return True
        finally:
            waited = time.monotonic() - now
            flight.sticky_waited_s = waited
            flight.queue_wait_s += waited
        return True

    async def _wait(self, flight: Flight, now: float, again: bool) -> None:
        """Wait in the fair queue until a slot frees or the deadline passes.

        again: the request was woken before but lost the slot; it waits first in line.
        """
        pool = flight.pool
        remaining = flight.deadline - now
        if remaining <= 0:
            raise errors.queue_timeout(pool.label, flight.queue_wait_s)
        queue_id = flight.token.id if flight.token is not None else ANONYMOUS_QUEUE_ID
        try:
            flight.woken_by = await self.state.wait(
                pool, flight.kind, queue_id, remaining, flight.facts, again=again
            )
        except QueueFull as full:
            raise errors.queue_full(pool.label, full.reason, full.retry_after_s) from None
        except QueueTimeout:
            raise errors.queue_timeout(pool.label, remaining) from None
        finally:
            flight.queue_wait_s += time.monotonic() - now

    async def _attempt(
        self, send: Send, flight: Flight, target: TargetEntry, attempt: int, slot: HeldSlot
    ) -> GatewayError | None:
        """Try one target; return what failed when the flight should move to another."""
        state = self.state
        request = _upstream_request(flight, target)
        sent_at = time.monotonic()
        timeouts = flight.pool.timeouts
        # A non-streamed answer's headers come with its whole body: only the first-token
        # timeout can bound them. A /serve answer may stream either way.
        if flight.stream or flight.forward is not None:
            timer = SilenceTimer(
                timeouts.first_byte_s,
                f"first-byte timeout ({timeouts.first_byte_s:g} s)",
                timeouts.stream_idle_s,
            )
        else:
            timer = SilenceTimer(
                timeouts.first_token_s,
                f"first-token timeout ({timeouts.first_token_s:g} s)",
                timeouts.stream_idle_s,
            )
        try:
            try:
                response = await upstream.get().send(request)
            except httpx.HTTPError as exc:
                phase = _transport_phase(exc)
                delivered = not isinstance(exc.__cause__, NOT_DELIVERED)
                retried, reason = self._may_retry(flight, attempt, phase, None, delivered=delivered)
                self._record_attempt(flight, target, phase, None, retried, reason)
                failure = _upstream_failure(exc, target)
                if retried:
                    return failure
                raise failure from None
            except asyncio.CancelledError:
                if not timer.absorb():
                    state.abandon(target)
                    raise
                # The request was sent and may be running: never retried (DESIGN.md).
                assert timer.expired is not None
                phase = FailurePhase.AMBIGUOUS_TIMEOUT
                reason = f"not retried: {timer.expired} passed after the request was sent"
                self._record_attempt(flight, target, phase, None, False, reason)
                raise errors.target_timeout(target.name, timer.expired) from None
            return await self._answer(send, flight, target, attempt, sent_at, response, timer, slot)
        finally:
            timer.stop()

    async def _answer(
        self,
        send: Send,
        flight: Flight,
        target: TargetEntry,
        attempt: int,
        sent_at: float,
        response: httpx.Response,
        timer: SilenceTimer,
        slot: HeldSlot,
    ) -> GatewayError | None:
        """Relay the target's response, or return the refusal that moves the flight on."""
        state = self.state
        status = response.status_code
        not_delivered = target.on_node and response.headers.get(NOT_DELIVERED_HEADER) == "1"
        try:
            reason = ""
            # Before a byte is relayed: a refusal or a misconfiguration moves the flight on.
            early = classify(
                connected=True, request_sent=True, status=status, output_started=False,
                timed_out=False, rewritten=flight.forward is None,
            )  # fmt: skip
            if not_delivered:
                phase = FailurePhase.CONNECT
                retried, reason = self._may_retry(flight, attempt, phase, status, delivered=False)
                if retried:
                    reason = "retried: the node's agent says it never reached the replica"
                    self._record_attempt(flight, target, phase, status, retried, reason)
                    return errors.target_refused(target.name, status)
            elif early is FailurePhase.REFUSED_STATUS:
                phase = early
                retried, reason = self._may_retry(flight, attempt, phase, status, delivered=True)
                if retried:
                    self._record_attempt(flight, target, phase, status, retried, reason)
                    return errors.target_refused(target.name, status)
            elif early is FailurePhase.MISCONFIGURED:
                # The credential and model id are Nexus's, not the caller's: the caller hears
                # that the target is misconfigured, never the target's own 401 or 404.
                phase = early
                retried, reason = self._may_retry(flight, attempt, phase, status, delivered=True)
                what = misconfiguration(status)
                self._record_attempt(flight, target, phase, status, retried, reason, why=what)
                failure = errors.target_misconfigured(target.name, what)
                if retried:
                    return failure
                raise failure
            timeouts = flight.pool.timeouts
            timer.expect(
                timeouts.first_token_s - (time.monotonic() - sent_at),
                f"first-token timeout ({timeouts.first_token_s:g} s)",
            )
            await self._relay(
                send, flight, target, response, attempt, sent_at, reason, timer, slot,
                not_delivered,
            )  # fmt: skip
        except asyncio.CancelledError:
            state.abandon(target)
            raise
        finally:
            # Closing (not reading to the end) also closes the connection of an unfinished
            # answer, which tells the engine to stop generating.
            await response.aclose()
        return None

    def _may_retry(
        self,
        flight: Flight,
        attempt: int,
        phase: FailurePhase,
        status: int | None,
        *,
        delivered: bool,
    ) -> tuple[bool, str]:
        """Say whether a failure before output moves the flight on, and why (for history).

        delivered: the request may have reached the target (anything but a failed connect).
        """
        forward = flight.forward
        if forward is not None and delivered and not forward.idempotent:
            # An arbitrary service may have acted on it: sending it again could act twice.
            return False, f"not retried: {forward.method} is not idempotent and may have arrived"
        retried, reason = self.state.may_retry(
            flight.pool, phase, attempt, status, delivered=delivered
        )
        if retried and delivered:
            flight.retries_held += 1
        return retried, reason

    def _record_attempt(
        self,
        flight: Flight,
        target: TargetEntry,
        phase: FailurePhase | None,
        status: int | None,
        retried: bool,
        reason: str,
        why: str = "",
    ) -> None:
        """Count one attempt once: in the target's passive health, the history and metrics.

        why: what the failure says about the target, for the cause of an ejection it tips.
        """
        ok = phase is None or not is_target_fault(phase)
        self.state.record_outcome(target, ok, time.monotonic(), why)
        flight.attempts.append(_attempt_row(target, phase, status, retried, reason))
        metrics.observe_attempt(flight.pool.slug, target.name, phase or "ok")

    async def _relay(
        self,
        send: Send,
        flight: Flight,
        target: TargetEntry,
        response: httpx.Response,
        attempt: int,
        sent_at: float,
        refusal: str,
        timer: SilenceTimer,
        slot: HeldSlot,
        not_delivered: bool = False,
    ) -> None:
        """Relay the target's answer as it arrives, then record how the attempt went.

        refusal: why a 429/502/503/504 was not retried, when that is what is relayed.
        timer: ends the wait for the first chunk and between chunks (the pool's timeouts).
        slot: freed once the target's answer has all arrived, before its end reaches the client.
        not_delivered: the node's agent answered for a replica the request never reached; the
        attempt counts as a failed connect.
        """
        status = response.status_code
        if flight.forward is None:
            headers = [
                (name, value)
                for name, value in response.headers.raw
                if name.lower() in RELAYED_HEADERS
            ]
        else:
            headers = forwarded_headers(response.headers.raw, NOT_RELAYED)
        headers.append((b"x-nexus-request-id", flight.request_id.encode()))
        headers.append((b"x-nexus-target", target.name.encode()))
        headers.append((b"x-nexus-attempts", str(attempt).encode()))
        start = {"type": "http.response.start", "status": status, "headers": headers}
        is_sse = response.headers.get("content-type", "").startswith("text/event-stream")
        if flight.forward is not None:
            flight.stream = is_sse  # known only from the answer
        length = response.headers.get("content-length", "")
        chunks = 0
        broken: GatewayError | None = None
        timed_out = False
        first_at: float | None = None
        encoded = "content-encoding" in response.headers  # its usage cannot be read
        if not is_sse and length.isdigit() and int(length) <= WHOLE_BODY_MAX_BYTES:
            # One JSON document: read it and answer in one piece (fewer writes, same latency).
            # Raw bytes: the body keeps its content-encoding, which is relayed with it.
            try:
                body = b"".join([chunk async for chunk in response.aiter_raw()])
            except (httpx.HTTPError, asyncio.CancelledError) as exc:
                failure = _relay_failure(exc, target, timer)
                phase = classify(
                    connected=True, request_sent=True, status=status, output_started=False,
                    timed_out=failure.code == "target_timeout", broken=True,
                )  # fmt: skip
                if timer.expired is not None:
                    refusal = f"not retried: {timer.expired} passed"
                self._finish(flight, target, phase, status, sent_at, None, 0, refusal)
                raise failure from None
            first_at = time.monotonic()
            slot.free()
            await send(start)
            await send({"type": "http.response.body", "body": body, "more_body": False})
            chunks = 1
            if not encoded and USAGE_KEY in body:
                flight.usage = read_usage(body)
        else:
            # The answer's head goes with its first bytes, as daphne (Twisted) and the engines'
            # aiohttp servers send theirs: uvicorn wrote it at once, and a loaded client then
            # read the head and the first chunk in two turns of its loop (docs/gateway.md).
            tail: deque[bytes] = deque(maxlen=TAIL_CHUNKS)
            error_event = b""
            try:
                async for chunk in arrived_chunks(response):
                    timer.heard()
                    if first_at is None:
                        first_at = time.monotonic()
                        await send(start)
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    chunks += 1
                    tail.append(chunk)
            except (httpx.HTTPError, asyncio.CancelledError) as exc:
                # The whole answer and its [DONE] came, then the connection closed without
                # ending the body (llama-cpp-python's server does so): the answer is whole.
                whole = isinstance(exc, httpx.HTTPError) and is_sse and _ended(tail)
                if not whole:
                    broken = _relay_failure(exc, target, timer)
                    timed_out = broken.code == "target_timeout"
                    # The target's answer has begun: no retry; the stream ends with an error.
                    if is_sse:
                        error_event = b"data: " + _stream_error(target, broken) + b"\n\n"
            slot.free()
            if first_at is None:
                await send(start)  # no byte came: the head goes with the end
            if error_event:
                await send({"type": "http.response.body", "body": error_event, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            if not encoded:
                flight.usage = read_usage(b"".join(tail))
        # An error status is a failure of its own kind (refused, client, server error) even
        # though its body reached the client; otherwise only a broken body makes one.
        phase = classify(
            connected=True, request_sent=True, status=status, output_started=status < 400,
            timed_out=timed_out, broken=broken is not None,
        )  # fmt: skip
        if not_delivered:
            phase = FailurePhase.CONNECT
        if phase is FailurePhase.SERVER_ERROR:
            blamed = self._blame_request(flight, target)
            if blamed is not None:
                # Not the target's fault: nothing counts in its health (a trial it held ends).
                self.state.abandon(target)
                flight.status = status
                flight.attempts.append(_attempt_row(target, phase, status, False, blamed))
                metrics.observe_attempt(flight.pool.slug, target.name, phase)
                flight.outcome = RoutingOutcome.CLIENT_ERROR
                flight.failure_reason = blamed
                return
        if timer.expired is not None:
            refusal = f"not retried: {timer.expired} passed"
        self._finish(flight, target, phase, status, sent_at, first_at, chunks, refusal)
        if timer.expired is not None:
            flight.failure_reason = f"{timer.expired} passed"

    def _blame_request(self, flight: Flight, target: TargetEntry) -> str | None:
        """Say why a server error is the request's fault (other targets failed it too), if so."""
        others = self.state.request_at_fault(
            flight.pool, target, _fingerprint(flight), time.monotonic()
        )
        if others is None:
            return None
        return f"not the target's fault: {', '.join(others)} failed the same request too"

    def _finish(
        self,
        flight: Flight,
        target: TargetEntry,
        phase: FailurePhase | None,
        status: int,
        sent_at: float,
        first_at: float | None,
        chunks: int,
        refusal: str,
    ) -> None:
        """Record the final attempt: health, speed, continuity, the flight's outcome."""
        now = time.monotonic()
        flight.status = status
        flight.chunks = chunks
        if phase is not None:
            reason = refusal or f"not retried: {phase.description}"
            self._record_attempt(flight, target, phase, status, False, reason)
            flight.failure_reason = phase.description
            flight.outcome = (
                RoutingOutcome.INTERRUPTED
                if phase is FailurePhase.AFTER_OUTPUT
                else RoutingOutcome.CLIENT_ERROR
                if phase is FailurePhase.CLIENT_ERROR
                else RoutingOutcome.UPSTREAM_ERROR
            )
            return
        self._record_attempt(flight, target, None, status, False, "ok")
        flight.outcome = RoutingOutcome.OK
        tpot = None
        if first_at is not None:
            flight.ttft_s = first_at - flight.started
            tpot = (now - first_at) / (chunks - 1) if flight.stream and chunks > 1 else None
        self.state.record_served(
            target,
            now,
            ttft_s=first_at - sent_at if first_at is not None else None,
            tpot_s=tpot,
            session_key=flight.session_key,
            prefix_key=flight.prefix_key,
        )


async def arrived_chunks(response: httpx.Response) -> AsyncIterator[bytes]:
    """Yield the answer's body as it arrives: each time, everything that has arrived, in one piece.

    Never waits for more than the first byte: what the engine wrote while the relay was busy
    (sending the last piece, or other streams' turns) goes out in one client send, so a stream
    costs one send per event-loop turn at most, not one per upstream write. Over the aiohttp
    transport it reads aiohttp's buffer directly: httpx's aiter_raw would cap each read at 16 KiB
    and add two generator layers per chunk.
    """
    stream = response.stream
    if not isinstance(stream, AiohttpResponseStream):
        async for chunk in response.aiter_raw():
            yield chunk
        return
    # The transport keeps its aiohttp response private; its reader is the one aiter_raw reads.
    content = stream._aiohttp_response.content
    with map_aiohttp_exceptions():  # the same httpx errors as aiter_raw raises
        while chunk := await content.readany():
            yield chunk


def _facts_now(
    flight: Flight, pool: PoolEntry, *, woken: bool, retried: bool, now: float
) -> RequestFacts:
    """Return the facts to decide the request on now.

    A first decision (not a retry), or one woken in fair order for a slot on another target
    than its conversation's, in a Smart pool, may get the verdict to wait a bounded time for its
    full sticky target instead (balancer.sticky): its facts say how long it may wait.
    """
    facts = flight.facts
    if (
        (not woken or flight.woken_by == WOKEN_IN_ORDER)
        and not retried
        and flight.sticky_wait is None
        and (facts.sticky_target_id is not None or facts.prefix_target_id is not None)
        and pool.policy.strategy == Strategy.SMART
    ):
        return replace(facts, may_wait_s=min(MAX_WAIT_S, flight.deadline - now))
    return facts


def _upstream_request(flight: Flight, target: TargetEntry) -> httpx.Request:
    """Build the request to the target: the OpenAI body with the target's model, or as it came.

    The client's own Authorization never travels on; the target's credential does.
    """
    forward = flight.forward
    if forward is None:
        flight.payload["model"] = target.model_id
        headers = [(b"content-type", b"application/json"), (b"accept", b"*/*")]
        if target.authorization is not None:
            headers.append((b"authorization", target.authorization.encode()))
        return httpx.Request(
            "POST", target.urls[flight.kind], headers=headers, content=json.dumps(flight.payload)
        )
    headers = list(forward.headers)
    if target.authorization is not None:
        headers.append((b"authorization", target.authorization.encode()))
    url = target.base_url + forward.path + (f"?{forward.query}" if forward.query else "")
    return httpx.Request(forward.method, url, headers=headers, content=forward.body)


def _no_target(pool: PoolEntry, kind: str, skipped: list[str]) -> GatewayError:
    """Say that no target can take the request; a service's pool counts its ready replicas."""
    if pool.service is None:
        return errors.no_target(pool.slug, kind, skipped)
    ready = sum(
        1
        for t in pool.targets
        if t.enabled and t.drain is DrainState.ACTIVE and t.health is not Health.UNHEALTHY
    )
    return errors.no_replica(pool.service.name, ready, pool.service.desired_replicas, skipped)


def _sleeping(pool: PoolEntry) -> bool:
    """Say whether the pool is a service scaled to zero that a request wakes (it waits)."""
    # A retired replica's target may linger (drained) until the pool is next synced.
    return pool.service is not None and pool.service.sleeping


def _why(skip: Skipped) -> str:
    """Say why a target cannot take the request: a node's reason, else the skip's."""
    if skip.reason is SkipReason.DISABLED and skip.detail:
        return skip.detail
    return skip.reason


def _attempt_row(
    target: TargetEntry, phase: FailurePhase | None, status: int | None, retried: bool, reason: str
) -> AttemptRow:
    return {
        "target_id": target.id,
        "target_name": target.name,
        "phase": phase.value if phase else "ok",
        "status": status,
        "retried": retried,
        "reason": reason,
    }


def _relay_failure(
    exc: httpx.HTTPError | asyncio.CancelledError, target: TargetEntry, timer: SilenceTimer
) -> GatewayError:
    """Return what broke an answer off: the target's error, or a timeout the timer saw pass.

    A cancellation that is not the timer's (the client left) goes on as it came.
    """
    if isinstance(exc, asyncio.CancelledError):
        if not timer.absorb():
            raise exc
        assert timer.expired is not None
        return errors.target_timeout(target.name, timer.expired)
    return _upstream_failure(exc, target)


def _fingerprint(flight: Flight) -> str:
    """Return a hash that says two attempts carried the same request (the model aside)."""
    forward = flight.forward
    digest = hashlib.blake2b(digest_size=16)
    if forward is None:
        content = {name: value for name, value in flight.payload.items() if name != "model"}
        digest.update(flight.kind.encode())
        digest.update(json.dumps(content, sort_keys=True).encode("utf-8", "surrogatepass"))
    else:
        digest.update(f"{forward.method} {forward.path}?{forward.query}".encode())
        digest.update(forward.body)
    return digest.hexdigest()


def _timed_out(exc: BaseException) -> bool:
    cause = exc.__cause__
    return isinstance(cause, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)) or (
        cause is None and isinstance(exc, httpx.TimeoutException)
    )


def _transport_phase(exc: httpx.HTTPError) -> FailurePhase:
    """Classify a failure before any response; the aiohttp transport's mapping is too coarse."""
    cause = exc.__cause__
    # A connect timeout is a connect failure: nothing reached the target.
    if isinstance(cause, aiohttp.ConnectionTimeoutError):
        return FailurePhase.CONNECT
    if _timed_out(exc):
        return FailurePhase.AMBIGUOUS_TIMEOUT
    return FailurePhase.CONNECT


def _upstream_failure(exc: httpx.HTTPError, target: TargetEntry) -> GatewayError:
    if _timed_out(exc) and not isinstance(exc.__cause__, aiohttp.ConnectionTimeoutError):
        return errors.target_timeout(target.name)
    return errors.target_unreachable(target.name)


def _ended(tail: deque[bytes]) -> bool:
    """Return whether the last chunks relayed end with the stream's closing `data: [DONE]`."""
    return b"".join(tail).rstrip().endswith(b"data: [DONE]")


def _stream_error(target: TargetEntry, failure: GatewayError) -> bytes:
    message = f"The stream from target '{target.name}' broke off: {failure.message}"
    return errors.error_body(message, "server_error", "stream_interrupted")


def _outcome_of(error: GatewayError) -> str:
    return {
        "queue_full": RoutingOutcome.QUEUE_FULL,
        "queue_timeout": RoutingOutcome.QUEUE_TIMEOUT,
        "no_target_available": RoutingOutcome.NO_TARGET,
        "rate_limit_exceeded": RoutingOutcome.RATE_LIMITED,
    }.get(error.code, RoutingOutcome.UPSTREAM_ERROR)
