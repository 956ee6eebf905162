"""Graceful shutdown of the web process: on SIGTERM or SIGINT, stop accepting connections, let
requests and streams in flight finish for NEXUS_SHUTDOWN_GRACE_S, end the rest, write what is
buffered (routing history, token usage), then exit.

Servers differ in how they let an application do that:

- daphne (Twisted) has no lifespan protocol: on a signal it stops the reactor at once and
  cancels every application. `install_in_daphne` takes over its SIGTERM and SIGINT once the
  reactor runs: stop listening, run the shutdown, then stop the reactor. A second signal stops
  it at once.
- uvicorn stops accepting and waits for requests in flight by itself (for at most
  `--timeout-graceful-shutdown` seconds: pass NEXUS_SHUTDOWN_GRACE_S), cancels the rest, then
  sends lifespan.shutdown: `lifespan` runs the shutdown then, with nothing left to wait for.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings

log = logging.getLogger(__name__)

# Stops the application's work: refuse new requests, wait up to the grace (seconds), end the
# rest, flush buffers.
Shutdown = Callable[[float], Awaitable[None]]

# How long past the grace a shutdown may take to end requests and write its buffers (each step
# has its own shorter bound) before the process stops anyway: a dependency that hangs must not
# keep it up until the supervisor kills it without a word.
OVERRUN_S = 20.0

# How long one background part (a publisher, a listener, a connection pool) may take to stop
# before the parts after it stop without it.
PART_STOP_S = 5.0


async def within(work: Awaitable[None], timeout_s: float, what: str) -> bool:
    """Await `work` for at most timeout_s; say whether it ended (raising its error if it failed).

    Work that runs over is logged with where it waits (`awaiting`), then cancelled but not
    waited for: `asyncio.wait_for` would wait for the cancellation to finish, which work stuck
    on something that ignores it never does, and the process would never stop.
    """
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if not done:
        log.error("%s still running after %g s, waiting at:\n%s", what, timeout_s, awaiting(task))
        task.cancel()
        return False
    task.result()
    return True


async def stop_part(work: Awaitable[None], what: str, timeout_s: float | None = None) -> None:
    """Stop one part of a shutdown: at most timeout_s (PART_STOP_S unless given), and its
    failure logged, not raised, so that a part stuck on a dependency never keeps the parts after
    it from stopping (the routing history from being written, say)."""
    try:
        await within(work, PART_STOP_S if timeout_s is None else timeout_s, what)
    except Exception:
        log.exception("%s failed to stop", what)


def awaiting(task: asyncio.Future[Any]) -> str:
    """Describe where a suspended task waits: each coroutine it awaits, innermost last, then
    what the innermost awaits (a task's own chain, or each unfinished child a gather awaits).

    A task's own stack shows only its outermost coroutine; a hang is found in the innermost.
    """
    lines: list[str] = []

    def describe(awaited: Any, depth: int) -> None:
        indent = "  " * depth
        while awaited is not None:
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is None:
                break
            code = frame.f_code
            lines.append(f"{indent}{code.co_filename}:{frame.f_lineno} in {code.co_qualname}")
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
        if awaited is None or depth > 8:
            return
        if not isinstance(awaited, asyncio.Future):
            # `await future` leaves a C iterator over the future, which names it only to gc.
            awaited = next(
                (r for r in gc.get_referents(awaited) if isinstance(r, asyncio.Future)), awaited
            )
        if isinstance(awaited, asyncio.Task):
            lines.append(f"{indent}awaits task {awaited.get_name()}:")
            describe(awaited.get_coro(), depth + 1)
            return
        children = getattr(awaited, "_children", None)  # asyncio.gather's future
        if children is not None:
            for child in children:
                if not child.done():
                    lines.append(f"{indent}awaits (gathered) {child!r}:")
                    if isinstance(child, asyncio.Task):
                        describe(child.get_coro(), depth + 1)
            return
        lines.append(f"{indent}awaits {awaited!r}")

    if isinstance(task, asyncio.Task):
        describe(task.get_coro(), 0)
    return "\n".join(lines) or repr(task)


def install_in_daphne(shutdown: Shutdown, overrun_s: float = OVERRUN_S) -> None:
    """Under daphne, make SIGTERM and SIGINT stop accepting and run `shutdown` before exiting;
    stop anyway once it has run `overrun_s` past the grace."""
    server_module = sys.modules.get("daphne.server")
    if server_module is None:
        return  # not under daphne
    from twisted.internet import reactor as installed_reactor

    reactor: Any = installed_reactor  # the asyncio reactor daphne installed

    server_class = server_module.Server
    listening: list[Any] = []
    listen_success = server_class.listen_success

    def remember_port(self: Any, port: Any) -> None:
        listening.append(port)
        listen_success(self, port)

    server_class.listen_success = remember_port
    stopping: list[asyncio.Task[None]] = []

    async def stop_gracefully(signal_name: str) -> None:
        grace_s = settings.NEXUS_SHUTDOWN_GRACE_S
        log.warning("%s: no new connections; finishing requests in flight (%.0f s)", signal_name,
                    grace_s)  # fmt: skip
        for port in listening:
            port.stopListening()
        try:
            if not await within(shutdown(grace_s), grace_s + overrun_s, "graceful shutdown"):
                log.error("graceful shutdown still running %g s past the grace; stopping now",
                          overrun_s)  # fmt: skip
        except Exception:
            log.exception("graceful shutdown failed; stopping now")
        log.info("%s: shutdown done; stopping", signal_name)
        reactor.stop()

    def on_signal(signum: int) -> None:
        if stopping:
            reactor.stop()  # a second signal: now
            return
        stopping.append(asyncio.ensure_future(stop_gracefully(signal.Signals(signum).name)))

    def take_over_signals() -> None:
        # Runs after Twisted installed its own handlers (they stop the reactor at once).
        loop = asyncio.get_event_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal, signum)

    reactor.callWhenRunning(take_over_signals)


def lifespan(shutdown: Shutdown) -> Callable[..., Awaitable[None]]:
    """Return an ASGI lifespan app that runs `shutdown` when the server stops (uvicorn)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                # The server already waited for (or cut) the requests in flight.
                await shutdown(0.0)
                await send({"type": "lifespan.shutdown.complete"})
                return

    return app
