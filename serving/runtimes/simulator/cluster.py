"""Cluster mode: a main (rank 0) that serves only once every worker joined it over TCP, and
fails when one leaves; workers that hold their connection and leave when the main goes.

The protocol is one line each way: the worker sends `join <rank>`, the main answers `ok` (or
`refused: <why>` and closes). Then both keep the connection open; its end is the news.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

from .config import SimulatorConfig, split_address
from .engine import Engine

# A worker retries connecting this long: the main may start a moment after it.
JOIN_TIMEOUT_S = 60.0
JOIN_RETRY_S = 0.2
HELLO_TIMEOUT_S = 10.0


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class ClusterMain:
    """Rank 0's side: accept the workers, hold the engine until all joined, fail on a leave."""

    def __init__(self, engine: Engine, config: SimulatorConfig) -> None:
        address = split_address(config.dist_init_addr)
        assert address is not None, "checked by parse_args"
        self.host, self.port = address
        self.engine = engine
        self.workers = config.nnodes - 1
        self.joined: set[int] = set()
        # Set when a worker that had joined leaves: the replica has failed.
        self.failed = asyncio.Event()
        self.failure = ""
        self._server: asyncio.Server | None = None
        self._closing = False

    def _update(self) -> None:
        if len(self.joined) == self.workers:
            self.engine.cluster_waiting = None
        else:
            joined = f"{len(self.joined)} of {self.workers}"
            self.engine.cluster_waiting = f"waiting for workers: {joined} joined"

    async def start(self) -> None:
        self._update()
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        say(f"cluster main waiting for {self.workers} workers on {self.host}:{self.port}")

    async def close(self) -> None:
        self._closing = True
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        rank = None
        try:
            hello = await asyncio.wait_for(reader.readline(), HELLO_TIMEOUT_S)
            word, _, number = hello.decode(errors="replace").strip().partition(" ")
            refusal = self._refusal(word, number)
            if refusal:
                writer.write(f"refused: {refusal}\n".encode())
                await writer.drain()
                return
            rank = int(number)
            self.joined.add(rank)
            writer.write(b"ok\n")
            await writer.drain()
            say(f"worker rank {rank} joined ({len(self.joined)} of {self.workers})")
            self._update()
            if self.engine.cluster_waiting is None:
                say(f"cluster formed: {self.workers} workers joined; serving")
            await reader.read()  # until the worker's connection ends
        except (TimeoutError, OSError, asyncio.CancelledError):
            # Cancelled: the main is shutting down and closes every connection itself.
            pass
        finally:
            writer.close()
            if rank is not None and not self._closing:
                self.joined.discard(rank)
                self.failure = f"worker rank {rank} left the cluster"
                say(self.failure)
                self.failed.set()

    def _refusal(self, word: str, number: str) -> str:
        if word != "join" or not number.isdecimal():
            return "expected 'join <rank>'"
        rank = int(number)
        if not 1 <= rank <= self.workers:
            return f"rank {rank} is not a worker rank (1 to {self.workers})"
        if rank in self.joined:
            return f"rank {rank} has joined already"
        return ""


async def run_worker(config: SimulatorConfig, stopping: asyncio.Event) -> int:
    """Join the main and stay until it goes (exit 1) or we are stopped (exit 0)."""
    address = split_address(config.dist_init_addr)
    assert address is not None, "checked by parse_args"
    host, port = address
    deadline = asyncio.get_running_loop().time() + JOIN_TIMEOUT_S
    while True:
        try:
            reader, writer = await asyncio.open_connection(host, port)
            break
        except OSError as error:
            if asyncio.get_running_loop().time() > deadline or stopping.is_set():
                say(
                    f"worker rank {config.node_rank} cannot reach the main at {host}:{port}: "
                    f"{error.strerror or error}"
                )
                return 1
            await asyncio.sleep(JOIN_RETRY_S)
    writer.write(f"join {config.node_rank}\n".encode())
    await writer.drain()
    answer = (await reader.readline()).decode(errors="replace").strip()
    if answer != "ok":
        say(f"worker rank {config.node_rank} was not let in: {answer or 'the main hung up'}")
        return 1
    say(f"worker rank {config.node_rank} joined the main at {host}:{port}")
    gone = asyncio.ensure_future(reader.read())
    stop = asyncio.ensure_future(stopping.wait())
    await asyncio.wait({gone, stop}, return_when=asyncio.FIRST_COMPLETED)
    writer.close()
    if stop.done():
        gone.cancel()
        return 0
    stop.cancel()
    say(f"the main at {host}:{port} went away; worker rank {config.node_rank} leaves")
    return 1
