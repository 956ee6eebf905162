"""The pool queue: bounded, fair per client token.

`FairQueue` is the pure part: admission, fair share and serving order, no clock and no asyncio.
`PoolQueue` is the thin asyncio shell the gateway awaits: one future per waiter, a deadline, and
clean removal when the client leaves. Keep every ordering rule in `FairQueue`.

A slot freed on a target goes first to a waiter whose conversation (or prompt prefix) lives on
that target, within bounds (`FairQueue.pop_for`): its engine holds the conversation's prefix in
its cache, so serving it there saves the prompt's recomputation, which any other waiter would
pay wherever it went.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)

# Refusal reasons, shown in history and in the 429's message.
QUEUE_FULL = "queue full"
OVER_FAIR_SHARE = "token over its fair share"
WAIT_TOO_LONG = "estimated wait exceeds the deadline"

# Affinity-aware wake-up bounds (docs/balancer.md "Queue", chosen on the closed-loop benchmark):
# a freed slot may go to a waiter at most MAX_PASSED places behind the next one in fair order,
# that arrived at most MAX_LEAD_S after it; a waiter already passed over MAX_PASSED times is not
# passed over again.
MAX_PASSED = 8
MAX_LEAD_S = 2.0
# Which rule placed a woken waiter (kept in its history).
WOKEN_IN_ORDER = "fair order"


@dataclass(frozen=True, slots=True)
class Affinity:
    """Where a waiter's conversation and prompt prefix went last (target ids), if known."""

    session_target_id: int | None = None
    prefix_target_id: int | None = None


NO_AFFINITY = Affinity()


@dataclass(slots=True)
class _Waiter:
    affinity: Affinity
    arrived_at: float  # the caller's clock (monotonic seconds); FairQueue keeps none itself
    passed: int = 0  # how many times a later waiter took a slot before it
    # The one target whose slot it waits for (a bounded wait for its full sticky target,
    # balancer.sticky); None: any target's.
    only: int | None = None


def woken_for(what: str, target_name: str, passed: int) -> str:
    """Return the history's note for a waiter woken out of fair order."""
    earlier = "waiter" if passed == 1 else "waiters"
    return f"{what} on {target_name}, ahead of {passed} earlier {earlier}"


def woken_pinned(target_name: str, passed: int) -> str:
    """Return the history's note for a waiter woken by the slot it waited for on its target."""
    note = f"sticky target {target_name} freed a slot"
    if passed:
        note += f", ahead of {passed} earlier {'waiter' if passed == 1 else 'waiters'}"
    return note


class FairQueue(Generic[T]):
    """Hold waiting tickets in one FIFO per client token and serve the tokens in turn."""

    __slots__ = ("max_size", "_fifos", "_token_of", "_waiters", "_pinned")

    def __init__(self, max_size: int) -> None:
        if max_size < 1:
            raise ValueError(f"max_size must be at least 1, not {max_size}")
        self.max_size = max_size
        # Tokens with waiters in serving order: the first is served next and then moves to the
        # end. OrderedDicts give O(1) pop from the front, move to the end and removal by key.
        self._fifos: OrderedDict[int, OrderedDict[T, None]] = OrderedDict()
        self._token_of: dict[T, int] = {}
        self._waiters: dict[T, _Waiter] = {}
        # Waiters for one target only, counted by target (sticky waits).
        self._pinned: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._token_of)

    def __contains__(self, ticket: object) -> bool:
        return ticket in self._token_of

    def unpinned(self) -> int:
        """Return how many waiters would take a slot on any target (not waiting for one)."""
        return len(self._token_of) - sum(self._pinned.values())

    def pinned_to(self, target_id: int) -> int:
        """Return how many waiters wait for a slot on this target only."""
        return self._pinned.get(target_id, 0)

    def bound_for(self, target_id: int) -> int:
        """Return how many waiters a slot freed on this target would go to first: those that
        wait for it only, and those whose conversation lives there (`pop_for`). O(waiters)."""
        return sum(
            1
            for waiter in self._waiters.values()
            if waiter.only == target_id or waiter.affinity.session_target_id == target_id
        )

    def refusal(self, token_id: int) -> str | None:
        """Return why a new ticket of this token would be refused, or None if it would get in.

        Alone, a token may fill the queue; with others waiting it keeps to its fair share (the
        places divided among the tokens waiting, itself included). A full queue still takes a
        ticket of a token under its share: the newest ticket of the token most over its share
        (one that filled the queue while it waited alone) gives up its place (`victim`).
        """
        held, share = self._held_and_share(token_id)
        if len(self._token_of) >= self.max_size:
            return None if held < share and self.victim(token_id) is not None else QUEUE_FULL
        if held >= share:
            return OVER_FAIR_SHARE
        return None

    def victim(self, token_id: int) -> T | None:
        """Return the ticket a new one of this token would push out of a full queue, if any:
        the newest of the token most over its fair share, when this token is under its own and
        that token still holds more than it afterwards (a swap between equals would only trade
        who waits, and back again)."""
        if len(self._token_of) < self.max_size:
            return None
        held, share = self._held_and_share(token_id)
        if held >= share:
            return None
        most_over, excess = None, 0.0
        for other_id, fifo in self._fifos.items():
            if other_id != token_id and len(fifo) >= held + 2 and len(fifo) - share > excess:
                most_over, excess = fifo, len(fifo) - share
        return next(reversed(most_over)) if most_over is not None else None

    def _held_and_share(self, token_id: int) -> tuple[int, float]:
        """Return how many tickets the token holds and its fair share with it counted.

        The share is not rounded: with 5 places and 3 tokens, a token holding 1 is under its
        share (1.67) and may take a second place.
        """
        fifo = self._fifos.get(token_id)
        held = len(fifo) if fifo is not None else 0
        tokens = len(self._fifos) + (0 if fifo is not None else 1)
        return held, self.max_size / tokens

    def admit(
        self,
        token_id: int,
        ticket: T,
        *,
        at: float = 0.0,
        affinity: Affinity = NO_AFFINITY,
        only: int | None = None,
    ) -> str | None:
        """Queue the ticket behind its token's earlier ones; return the refusal reason, if any.

        In a full queue it takes the place of `victim(token_id)`, which leaves the queue.
        at: when it arrived (the caller's clock); affinity: where its conversation lives;
        only: the one target whose slot it waits for (`pop` passes it by, `pop_for` offers it
        only that target's slots).
        """
        if ticket in self._token_of:
            raise ValueError("this ticket is already queued")
        reason = self.refusal(token_id)
        if reason is None:
            victim = self.victim(token_id)
            if victim is not None:
                self.remove(victim)
            fifo = self._fifos.get(token_id)
            if fifo is None:
                # A token that had no waiters joins the turn order at the end.
                fifo = self._fifos[token_id] = OrderedDict()
            fifo[ticket] = None
            self._token_of[ticket] = token_id
            self._waiters[ticket] = _Waiter(affinity, at, only=only)
            if only is not None:
                self._pinned[only] = self._pinned.get(only, 0) + 1
        return reason

    def readmit(
        self, token_id: int, ticket: T, *, at: float = 0.0, affinity: Affinity = NO_AFFINITY
    ) -> None:
        """Put back a ticket that was served but found no room: first in line, never refused."""
        if ticket in self._token_of:
            raise ValueError("this ticket is already queued")
        fifo = self._fifos.get(token_id)
        if fifo is None:
            fifo = self._fifos[token_id] = OrderedDict()
            # Its token was being served: it keeps that turn.
            self._fifos.move_to_end(token_id, last=False)
        fifo[ticket] = None
        fifo.move_to_end(ticket, last=False)
        self._token_of[ticket] = token_id
        self._waiters[ticket] = _Waiter(affinity, at)

    def pop(self) -> T | None:
        """Take the next ticket: the oldest of the token whose turn it is (passing by those
        that wait for one target only: the slot may be another's)."""
        if not self._fifos:
            return None
        if not self._pinned:
            token_id, fifo = next(iter(self._fifos.items()))
            ticket = next(iter(fifo))
            self._take(token_id, ticket)
            return ticket
        for token_id, ticket in self._fair_order():
            if self._waiters[ticket].only is None:
                self._take(token_id, ticket)
                return ticket
        return None

    def pop_for(self, target_id: int, target_name: str = "") -> tuple[T, str] | None:
        """Take the ticket a slot freed on this target goes to, and the rule that chose it.

        Among the next MAX_PASSED + 1 tickets in fair order, the first whose conversation went
        to this target last, else the first whose prompt prefix did, takes it, when it arrived
        at most MAX_LEAD_S after the next ticket; the tickets it passes over are counted, and
        one passed over MAX_PASSED times already ends the search (it is served in turn). Else
        the next ticket in fair order takes it (`WOKEN_IN_ORDER`). The token of the ticket
        taken moves to the end of the turn order, as with `pop`: taking a slot early spends
        that token's turn, so no token gets more than its share of turns. A ticket waiting for
        this target only counts as its conversation; one waiting for another target is not
        offered this slot and not counted as passed over.
        """
        if not self._fifos:
            return None
        window: list[tuple[int, T]] = []
        session_at = prefix_at = -1
        head_arrived = 0.0
        for token_id, ticket in self._fair_order():
            waiter = self._waiters[ticket]
            if waiter.only is not None and waiter.only != target_id:
                continue
            if not window:
                head_arrived = waiter.arrived_at
            window.append((token_id, ticket))
            if waiter.arrived_at - head_arrived <= MAX_LEAD_S:
                affinity = waiter.affinity
                if waiter.only == target_id or affinity.session_target_id == target_id:
                    session_at = len(window) - 1
                    break
                if prefix_at < 0 and affinity.prefix_target_id == target_id:
                    prefix_at = len(window) - 1
            if waiter.passed >= MAX_PASSED or len(window) > MAX_PASSED:
                break
        chosen, what = (
            (session_at, "conversation")
            if session_at >= 0
            else (prefix_at, "prompt prefix")
            if prefix_at >= 0
            else (0, "")  # the next in fair order
        )
        if not window:
            return None  # every waiter waits for another target
        for _, earlier in window[:chosen]:
            self._waiters[earlier].passed += 1
        token_id, ticket = window[chosen]
        pinned = self._waiters[ticket].only is not None
        self._take(token_id, ticket)
        if pinned:
            return ticket, woken_pinned(target_name, chosen)
        return ticket, woken_for(what, target_name, chosen) if chosen else WOKEN_IN_ORDER

    def _take(self, token_id: int, ticket: T) -> None:
        """Remove a ticket being served; its token's turn is spent (end of the turn order)."""
        fifo = self._fifos[token_id]
        del fifo[ticket]
        del self._token_of[ticket]
        self._unpin(self._waiters.pop(ticket))
        if fifo:
            self._fifos.move_to_end(token_id)
        else:
            del self._fifos[token_id]

    def _fair_order(self) -> Iterator[tuple[int, T]]:
        """Yield (token, ticket) in the order `pop` would serve them if nobody else arrived."""
        rounds: list[tuple[int, Iterator[T]]] = [
            (token_id, iter(fifo)) for token_id, fifo in self._fifos.items()
        ]
        while rounds:
            still: list[tuple[int, Iterator[T]]] = []
            for token_id, tickets in rounds:
                # At most one ticket per token per round; a token with none left drops out.
                for ticket in tickets:
                    yield token_id, ticket
                    still.append((token_id, tickets))
                    break
            rounds = still

    def remove(self, ticket: T) -> bool:
        """Drop an abandoned ticket at once; return whether it was still queued."""
        token_id = self._token_of.pop(ticket, None)
        if token_id is None:
            return False
        self._unpin(self._waiters.pop(ticket))
        fifo = self._fifos[token_id]
        del fifo[ticket]
        if not fifo:
            del self._fifos[token_id]
        return True

    def _unpin(self, waiter: _Waiter) -> None:
        only = waiter.only
        if only is not None:
            left = self._pinned[only] - 1
            if left:
                self._pinned[only] = left
            else:
                del self._pinned[only]

    def waiting_for(self, token_id: int) -> int:
        """Return how many tickets this token has queued."""
        fifo = self._fifos.get(token_id)
        return len(fifo) if fifo is not None else 0

    def waiting_by_token(self) -> dict[int, int]:
        """Return the queued count of each token with waiters, the token served next first."""
        return {token_id: len(fifo) for token_id, fifo in self._fifos.items()}

    def ahead_of_new(self, token_id: int) -> int:
        """Return how many tickets would be served before a new ticket of this token."""
        fifo = self._fifos.get(token_id)
        if fifo is None:
            # A newcomer joins the end of the turn order: one ticket of every waiting token first.
            return len(self._fifos)
        held = len(fifo)
        ahead = 0
        before_us = True
        for other_id, other in self._fifos.items():
            if other_id == token_id:
                before_us = False
            # Rounds 0..held-1 take up to one ticket per round from each token; in round `held`
            # (ours), the tokens before us in the turn order still go first.
            ahead += min(len(other), held)
            if before_us and len(other) > held:
                ahead += 1
        return ahead

    def positions(self) -> dict[T, int]:
        """Return each ticket's place in line (1 = next) if nobody else arrived."""
        return {ticket: place for place, (_, ticket) in enumerate(self._fair_order(), 1)}


def estimated_wait_s(recent_service_times_s: Iterable[float], queued: int, capacity: int) -> float:
    """Estimate the wait of a request with `queued` requests served before it; 0 if unknown."""
    if capacity < 1:
        raise ValueError(f"capacity must be at least 1, not {capacity}")
    times = list(recent_service_times_s)
    if not times:
        # No sample yet: nothing to refuse early on; the queue's own deadline still holds.
        return 0.0
    # Every slot is busy; each wave of `capacity` completions lets that many requests in. The
    # request's own wave included, since it waits for a slot to free before it starts.
    waves = math.ceil((queued + 1) / capacity)
    return sum(times) / len(times) * waves


def retry_after_s(recent_service_times_s: Iterable[float], queued: int, capacity: int) -> int:
    """Return a Retry-After value in whole seconds, at least 1."""
    return max(1, math.ceil(estimated_wait_s(recent_service_times_s, queued, capacity)))


class QueueFull(Exception):
    """The queue refused the request: answer 429 with Retry-After."""

    def __init__(self, reason: str, retry_after_s: int) -> None:
        super().__init__(f"{reason}; retry after {retry_after_s} s")
        self.reason = reason
        self.retry_after_s = retry_after_s


class QueueTimeout(Exception):
    """The request waited its whole allowance without a slot: answer 503."""

    def __init__(self, max_wait_s: float) -> None:
        super().__init__(f"no slot within {max_wait_s:g} s")
        self.max_wait_s = max_wait_s


class PoolQueue:
    """Let requests wait for a free slot in fair order (the asyncio shell around FairQueue)."""

    __slots__ = ("fair", "_service_times")

    def __init__(self, max_size: int, *, service_time_samples: int = 50) -> None:
        # Each waiter's future is resolved with the rule that woke it.
        self.fair: FairQueue[asyncio.Future[str]] = FairQueue(max_size)
        self._service_times: deque[float] = deque(maxlen=service_time_samples)

    def __len__(self) -> int:
        return len(self.fair)

    def unpinned(self) -> int:
        """Return how many waiters would take a slot on any target (newcomers go behind them)."""
        return self.fair.unpinned()

    def record_service_time(self, seconds: float) -> None:
        """Remember how long a finished request held its slot, for wait estimates."""
        self._service_times.append(seconds)

    def estimated_wait_s(self, token_id: int, capacity: int) -> float:
        """Estimate how long a new request of this token would wait; 0 when unknown."""
        return estimated_wait_s(self._service_times, self.fair.ahead_of_new(token_id), capacity)

    async def wait(
        self,
        token_id: int,
        max_wait_s: float,
        *,
        capacity: int,
        again: bool = False,
        affinity: Affinity = NO_AFFINITY,
        only: int | None = None,
        joined: Callable[[], None] | None = None,
    ) -> str:
        """Wait until `wake_next` or `wake_for` hands this request a slot; return the rule that
        chose it (WOKEN_IN_ORDER, or the `woken_for` note of an affinity-aware wake-up).

        Raise QueueFull when it is not admitted (full, over its fair share, or an estimated
        wait beyond max_wait_s), or when, waiting over its token's fair share, it gives up its
        place to a token under its own; QueueTimeout when max_wait_s passes. On cancellation (the
        client left) the request leaves the queue at once. again: the request was woken but
        found no room (another took it first); it goes back first in line, without admission.
        only: wait for a slot on this target alone (a bounded wait for a full sticky target,
        balancer.sticky): its own bound is max_wait_s, so no early refusal by estimate.
        joined: called once the request is in the queue, before it waits.
        """
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        now = time.monotonic()
        if again:
            self.fair.readmit(token_id, future, at=now, affinity=affinity)
        else:
            # Admission runs before the first await, so no wake-up can slip in between the
            # caller finding every target full and this request joining the queue.
            ahead = self.fair.ahead_of_new(token_id)
            reason = self.fair.refusal(token_id)
            wait_s = estimated_wait_s(self._service_times, ahead, capacity)
            if reason is None and wait_s > max_wait_s and only is None:
                reason = WAIT_TOO_LONG
            if reason is not None:
                raise QueueFull(reason, retry_after_s(self._service_times, ahead, capacity))
            victim = self.fair.victim(token_id)
            self.fair.admit(token_id, future, at=now, affinity=affinity, only=only)
            if victim is not None and not victim.done():
                # It waited behind its own token's earlier requests, at the end of the queue.
                wait_s = retry_after_s(self._service_times, len(self.fair), capacity)
                victim.set_exception(QueueFull(OVER_FAIR_SHARE, wait_s))
        if joined is not None:
            joined()
        try:
            async with asyncio.timeout(max_wait_s):
                return await future
        except TimeoutError:
            if self._granted(future):
                # The slot arrived in the same loop turn as the deadline: use it.
                return future.result()
            self.fair.remove(future)
            raise QueueTimeout(max_wait_s) from None
        except asyncio.CancelledError:
            if not self.fair.remove(future) and self._granted(future):
                # Woken but gone before it ran: pass the wake-up on, or a free slot sits idle
                # until the next request finishes.
                self.wake_next()
            raise

    def wake_next(self) -> bool:
        """Hand a freed slot to the next waiter in fair order; return whether one took it."""
        while (future := self.fair.pop()) is not None:
            # A waiter cancelled in this loop turn has not run its cleanup yet: skip it.
            if not future.done():
                future.set_result(WOKEN_IN_ORDER)
                return True
        return False

    def wake_for(self, target_id: int, target_name: str) -> bool:
        """Hand a slot freed on this target to the waiter `FairQueue.pop_for` picks; return
        whether one took it."""
        while (taken := self.fair.pop_for(target_id, target_name)) is not None:
            future, rule = taken
            if not future.done():
                future.set_result(rule)
                return True
        return False

    @staticmethod
    def _granted(future: asyncio.Future[str]) -> bool:
        return future.done() and not future.cancelled()
