"""End an upstream attempt whose target stays silent too long: one timer per wait, not per chunk.

An attempt waits for three things in turn (docs/reliability.md): the response headers (the
pool's first-byte timeout, or for a non-streamed answer, whose headers come with its whole body,
the first-token timeout), the first chunk (first-token timeout, counted from the request sent)
and each next chunk (stream idle timeout). Arming an asyncio timeout per chunk would cost a
timer per token on the hot path; instead `heard()` only moves a deadline, and the one scheduled
check re-arms itself when it finds the deadline moved. When a deadline passes, the attempt's
task is cancelled and `expired` says which timeout it was, so the attempt can tell this
cancellation from the client's.
"""

from __future__ import annotations

import asyncio


class SilenceTimer:
    """Cancel the current task when the awaited output does not come in time."""

    __slots__ = (
        "_check_at", "_due", "_handle", "_idle", "_idle_s", "_loop", "_task", "_what", "expired"
    )  # fmt: skip

    def __init__(self, due_in_s: float, what: str, idle_s: float):
        """Expect output within `due_in_s` (`what` names that timeout), then every `idle_s`."""
        self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self.expired: str | None = None  # the timeout that passed, once one has
        self._what = what
        self._idle_s = idle_s
        self._idle = f"stream idle timeout ({idle_s:g} s)"
        self._due = self._check_at = self._loop.time() + due_in_s
        self._handle: asyncio.TimerHandle | None = self._loop.call_at(self._due, self._check)

    def expect(self, due_in_s: float, what: str) -> None:
        """Expect the next output within `due_in_s` from now; `what` names that timeout."""
        self._what = what
        self._move(self._loop.time() + due_in_s)

    def heard(self) -> None:
        """Note that output just arrived: the next is due within the idle timeout."""
        self._what = self._idle
        due = self._due = self._loop.time() + self._idle_s
        if due < self._check_at:  # only when the idle timeout is shorter than the last wait
            self._move(due)

    def _move(self, due: float) -> None:
        """Set the deadline; a check due later than it is brought forward."""
        self._due = due
        if self._handle is not None and due < self._check_at:
            self._handle.cancel()
            self._check_at = due
            self._handle = self._loop.call_at(due, self._check)

    def stop(self) -> None:
        """Stop watching (the attempt ended)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def absorb(self) -> bool:
        """After a CancelledError: say whether this timer caused it, and if so undo the cancel."""
        if self.expired is None:
            return False
        self._task.uncancel()
        return True

    def _check(self) -> None:
        if self._loop.time() < self._due:
            self._check_at = self._due
            self._handle = self._loop.call_at(self._due, self._check)
            return
        self._handle = None
        self.expired = self._what
        self._task.cancel()
