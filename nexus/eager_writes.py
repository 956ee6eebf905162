"""Under daphne, send a response's bytes when they are written, not on the reactor's next turn.

Twisted's TCP transport never sends from `write()`: it appends to its buffer and asks the
reactor to watch the socket for writability (`startWriting`), the reactor's next turn calls
`doWrite`, which sends and stops watching (`stopWriting`). On the asyncio reactor that is two
`epoll_ctl` calls, one more loop turn and Twisted's logging context around the callback for
every write, a streamed chunk included; and the chunk waits in the buffer behind every callback
already ready on a loaded loop. asyncio's own transports (uvicorn's) try `send()` first and
buffer only what the socket does not take; `install_in_daphne()` gives daphne's connections
that same behaviour.

Only a connection whose buffer is empty sends at once, so bytes keep their order; what the
socket does not take (or a send that fails) goes through Twisted's buffer as before, and its
next `doWrite` finishes the send or reports the lost connection as it always did.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def install_in_daphne() -> None:
    """Make the connections daphne accepts send a write at once when nothing is buffered."""
    from twisted.internet.tcp import Server

    buffered_write = Server.write

    def write(connection: Any, data: bytes) -> None:
        if (
            data
            and type(data) is bytes
            and connection.connected
            and not connection.disconnecting
            and not connection._writeDisconnected
            and not connection._tempDataLen
            and connection.offset == len(connection.dataBuffer)
        ):
            sent = connection.writeSomeData(data)
            if type(sent) is int:  # else the connection is lost: doWrite will say so
                if sent == len(data):
                    return
                data = data[sent:]
        buffered_write(connection, data)

    def write_sequence(connection: Any, iovec: Iterable[bytes]) -> None:
        # twisted.web sends a chunk of a chunked response as three pieces: one send, not three.
        write(connection, b"".join(iovec))

    Server.write = write  # type: ignore[method-assign]
    Server.writeSequence = write_sequence  # type: ignore[method-assign]
