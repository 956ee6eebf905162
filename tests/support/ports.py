"""Loopback ports for the servers tests start: each pytest-xdist worker hands out ports from its
own block, below the kernel's ephemeral range, so that no other worker and no outgoing connection
can take a port between the moment it is chosen and the moment a server binds it."""

from __future__ import annotations

import itertools
import socket

from tests.support.workers import worker_index

# Below Linux's ephemeral range (32768-60999): the kernel never picks these on its own.
FIRST_PORT = 20000
BLOCK_SIZE = 800
_next_offset = itertools.count()


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 of this worker's block that is free now.

    Ports are handed out in turn, so a port just given out is not given again before the whole
    block has been: its server has had time to bind it.
    """
    base = FIRST_PORT + BLOCK_SIZE * (worker_index() or 0)
    for _ in range(BLOCK_SIZE):
        port = base + next(_next_offset) % BLOCK_SIZE
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in 127.0.0.1:{base}-{base + BLOCK_SIZE - 1}")
