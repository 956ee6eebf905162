"""Process lifecycle: the listening socket, fault application, signals and the CLI entry."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

from aiohttp import web

from .api import SimulatorApi
from .cluster import ClusterMain, run_worker
from .config import SimulatorConfig, parse_args
from .engine import Engine

try:
    import uvloop
except ImportError:  # optional speed-up; it ships with uvicorn[standard]
    HAVE_UVLOOP = False
else:
    HAVE_UVLOOP = True

# How long shutdown waits for in-flight requests; hung requests would otherwise block it.
SHUTDOWN_GRACE_S = 0.5
# How long refusing connections waits for idle kept-alive connections to close.
IDLE_CLOSE_WAIT_S = 0.05


class Listener:
    """The listening socket, closed to refuse connections and reopened to accept them again.

    While refusing, the port stays bound but not listening, so the kernel answers connection
    attempts with a reset (ECONNREFUSED) and no other process can take the port.
    """

    def __init__(self, runner: web.AppRunner, host: str, port: int) -> None:
        self._runner = runner
        self._host = host
        self._port = port
        self._reserved: socket.socket | None = None
        self._site: web.SockSite | None = None
        self._closing: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        """Return the base URL, with the bound port."""
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}"

    @property
    def refusing(self) -> bool:
        """Return whether connections are being refused."""
        return self._site is None

    def reserve(self) -> socket.socket:
        """Bind the port without listening; return the bound socket."""
        if self._reserved is not None:
            return self._reserved
        family, kind, proto, _, address = socket.getaddrinfo(
            self._host, self._port, type=socket.SOCK_STREAM
        )[0]
        sock = socket.socket(family, kind, proto)
        try:
            # Rebinding must succeed while earlier connections on the port linger in TIME_WAIT.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
        except OSError:
            sock.close()
            raise
        self._port = sock.getsockname()[1]
        self._reserved = sock
        return sock

    async def accept(self) -> None:
        """Listen for connections."""
        if self._site is not None:
            return
        site = web.SockSite(self._runner, self.reserve())
        await site.start()
        # The site's server owns the socket now and closes it when stopped.
        self._reserved = None
        self._site = site

    async def refuse(self) -> None:
        """Stop listening and close kept-alive connections, busy ones once their response ends.

        Pooled connections would otherwise let clients bypass the refusal.
        """
        if self._site is None:
            return
        await self._site.stop()
        self._site = None
        self.reserve()
        server = self._runner.server
        if server is None:
            return
        closing = []
        for connection in server.connections:
            # aiohttp's own two shutdown steps: close() wakes idle connections, shutdown() closes
            # each transport once its request in progress (if any) has been answered.
            connection.close()
            task = asyncio.create_task(connection.shutdown(timeout=None))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
            closing.append(task)
        if closing:
            # Idle connections close within a few loop turns; waiting for them before answering
            # means the caller's next request cannot race onto one. Busy ones (this request's
            # among them) finish in the background.
            await asyncio.wait(closing, timeout=IDLE_CLOSE_WAIT_S)

    def close(self) -> None:
        """Release a reserved port (a listening site is stopped by the runner)."""
        if self._reserved is not None:
            self._reserved.close()
            self._reserved = None


class SimulatorServer:
    """One simulator: engine, HTTP application and listener."""

    def __init__(self, config: SimulatorConfig) -> None:
        self.config = config
        self.engine = Engine(config)
        api = SimulatorApi(self.engine, self.apply_faults, self.clear_faults)
        self._runner = web.AppRunner(
            api.app,
            handle_signals=False,
            access_log=None,
            handler_cancellation=True,  # a client disconnect cancels its handler, freeing the slot
            shutdown_timeout=SHUTDOWN_GRACE_S,
        )
        self.listener = Listener(self._runner, config.host, config.port)
        self._refusal_timer: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        """Bind the port (listening unless refusing connections) and start the engine."""
        await self._runner.setup()
        if self.config.faults.refuse_connections:
            self.listener.reserve()
        else:
            await self.listener.accept()
        self.engine.start()

    async def stop(self) -> None:
        """Stop accepting, give in-flight requests a short grace, then release everything."""
        if self._refusal_timer is not None:
            self._refusal_timer.cancel()
        for task in list(self._background):
            task.cancel()
        await self.engine.close()
        await self._runner.cleanup()
        self.listener.close()

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        """Run a coroutine in the background, keeping a reference until it ends."""
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def apply_faults(self, update: dict[str, Any]) -> None:
        """Apply a validated /sim/faults update."""
        self.engine.update_faults(update)
        if "refuse_connections" in update:
            await self._set_refusing(
                update["refuse_connections"], update.get("refuse_connections_for_s")
            )

    async def clear_faults(self) -> None:
        """Remove every fault and accept connections again."""
        self.engine.clear_faults()
        await self._set_refusing(False)

    async def _set_refusing(self, refuse: bool, for_s: float | None = None) -> None:
        if self._refusal_timer is not None:
            self._refusal_timer.cancel()
            self._refusal_timer = None
        if not refuse:
            await self.listener.accept()
            return
        await self.listener.refuse()
        if for_s is not None:
            self._refusal_timer = asyncio.create_task(self._end_refusal_after(for_s))

    async def _end_refusal_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self.engine.update_faults({"refuse_connections": False})
        self._refusal_timer = None
        await self.listener.accept()


def _stop_on_signals(stopping: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    loop.add_signal_handler(signal.SIGINT, stopping.set)


async def serve_worker(config: SimulatorConfig) -> int:
    """Run a cluster worker (no HTTP) until the main goes or a signal comes; return the code."""
    stopping = asyncio.Event()
    _stop_on_signals(stopping)
    return await run_worker(config, stopping)


async def serve(config: SimulatorConfig) -> int:
    """Run a simulator until SIGTERM or SIGINT; SIGUSR1 clears all faults. Return the exit
    code: 1 when a cluster worker left (the replica has failed), else 0."""
    server = SimulatorServer(config)
    await server.start()
    cluster = ClusterMain(server.engine, config) if config.nnodes > 1 else None
    if cluster is not None:
        await cluster.start()
    stopping = asyncio.Event()
    _stop_on_signals(stopping)
    loop = asyncio.get_running_loop()
    # A refusing simulator cannot be reached over HTTP; a signal still clears its faults.
    loop.add_signal_handler(signal.SIGUSR1, lambda: server.spawn(server.clear_faults()))
    state = "refusing connections" if server.listener.refusing else "listening"
    sys.stdout.write(f"simulator {config.model} {state} on {server.listener.url}\n")
    sys.stdout.flush()
    waits = {asyncio.ensure_future(stopping.wait())}
    if cluster is not None:
        waits.add(asyncio.ensure_future(cluster.failed.wait()))
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        if cluster is not None:
            await cluster.close()
        await server.stop()
    return 1 if cluster is not None and cluster.failed.is_set() and not stopping.is_set() else 0


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the command line and serve until signalled."""
    config = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    run = uvloop.run if HAVE_UVLOOP else asyncio.run
    code = 0
    with contextlib.suppress(KeyboardInterrupt):  # a SIGINT that lands before the handler is set
        code = run(serve_worker(config) if config.node_rank > 0 else serve(config))
    sys.exit(code)
