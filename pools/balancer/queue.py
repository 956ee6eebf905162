"""The pool queue: bounded, fair per client token.

`FairQueue` is the pure part: admission, fair share and serving order, no clock and no asyncio.
`PoolQueue` is the thin asyncio shell the gateway awaits: one future per waiter, a deadline, and
clean removal when the client leaves. Keep every ordering rule in `FairQueue`.
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)

# Refusal reasons, shown in history and in the 429's message.
QUEUE_FULL = "queue full"
OVER_FAIR_SHARE = "token over its fair share"
WAIT_TOO_LONG = "estimated wait exceeds the deadline"


class FairQueue(Generic[T]):
    """Hold waiting tickets in one FIFO per client token and serve the tokens in turn."""

    __slots__ = ("max_size", "_fifos", "_token_of")

    def __init__(self, max_size: int) -> None:
        if max_size < 1:
            raise ValueError(f"max_size must be at least 1, not {max_size}")
        self.max_size = max_size
        # Tokens with waiters in serving order: the first is served next and then moves to the
        # end. OrderedDicts give O(1) pop from the front, move to the end and removal by key.
        self._fifos: OrderedDict[int, OrderedDict[T, None]] = OrderedDict()
        self._token_of: dict[T, int] = {}

    def __len__(self) -> int:
        return len(self._token_of)

    def __contains__(self, ticket: object) -> bool:
        return ticket in self._token_of

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

    def admit(self, token_id: int, ticket: T) -> str | None:
        """Queue the ticket behind its token's earlier ones; return the refusal reason, if any.

        In a full queue it takes the place of `victim(token_id)`, which leaves the queue.
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
        return reason

    def readmit(self, token_id: int, ticket: T) -> None:
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

    def pop(self) -> T | None:
        """Take the next ticket: the oldest of the token whose turn it is."""
        if not self._fifos:
            return None
        token_id, fifo = next(iter(self._fifos.items()))
        ticket, _ = fifo.popitem(last=False)
        del self._token_of[ticket]
        if fifo:
            self._fifos.move_to_end(token_id)
        else:
            del self._fifos[token_id]
        return ticket

    def remove(self, ticket: T) -> bool:
        """Drop an abandoned ticket at once; return whether it was still queued."""
        token_id = self._token_of.pop(ticket, None)
        if token_id is None:
            return False
        fifo = self._fifos[token_id]
        del fifo[ticket]
        if not fifo:
            del self._fifos[token_id]
        return True

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
        places: dict[T, int] = {}
        rounds: list[Iterator[T]] = [iter(fifo) for fifo in self._fifos.values()]
        while rounds:
            still: list[Iterator[T]] = []
            for tickets in rounds:
                # Take at most one ticket per token per round; a token with none left drops out.
                for ticket in tickets:
                    places[ticket] = len(places) + 1
                    still.append(tickets)
                    break
            rounds = still
        return places


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
        self.fair: FairQueue[asyncio.Future[None]] = FairQueue(max_size)
        self._service_times: deque[float] = deque(maxlen=service_time_samples)

    def __len__(self) -> int:
        return len(self.fair)

    def record_service_time(self, seconds: float) -> None:
        """Remember how long a finished request held its slot, for wait estimates."""
        self._service_times.append(seconds)

    def estimated_wait_s(self, token_id: int, capacity: int) -> float:
        """Estimate how long a new request of this token would wait; 0 when unknown."""
        return estimated_wait_s(self._service_times, self.fair.ahead_of_new(token_id), capacity)

    async def wait(
        self, token_id: int, max_wait_s: float, *, capacity: int, again: bool = False
    ) -> None:
        """Wait until `wake_next` hands this request a slot.

        Raise QueueFull when it is not admitted (full, over its fair share, or an estimated
        wait beyond max_wait_s), or when, waiting over its token's fair share, it gives up its
        place to a token under its own; QueueTimeout when max_wait_s passes. On cancellation (the
        client left) the request leaves the queue at once. again: the request was woken but
        found no room (another took it first); it goes back first in line, without admission.
        """
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if again:
            self.fair.readmit(token_id, future)
        else:
            # Admission runs before the first await, so no wake-up can slip in between the
            # caller finding every target full and this request joining the queue.
            ahead = self.fair.ahead_of_new(token_id)
            reason = self.fair.refusal(token_id)
            wait_s = estimated_wait_s(self._service_times, ahead, capacity)
            if reason is None and wait_s > max_wait_s:
                reason = WAIT_TOO_LONG
            if reason is not None:
                raise QueueFull(reason, retry_after_s(self._service_times, ahead, capacity))
            victim = self.fair.victim(token_id)
            self.fair.admit(token_id, future)
            if victim is not None and not victim.done():
                # It waited behind its own token's earlier requests, at the end of the queue.
                wait_s = retry_after_s(self._service_times, len(self.fair), capacity)
                victim.set_exception(QueueFull(OVER_FAIR_SHARE, wait_s))
        try:
            async with asyncio.timeout(max_wait_s):
                await future
        except TimeoutError:
            if self._granted(future):
                # The slot arrived in the same loop turn as the deadline: use it.
                return
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
                future.set_result(None)
                return True
        return False

    @staticmethod
    def _granted(future: asyncio.Future[None]) -> bool:
        return future.done() and not future.cancelled()
