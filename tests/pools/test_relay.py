"""The relay's reads of an answer: everything that has arrived in one piece, never waiting for more;
and the answer's head, which goes to the client with its first bytes.

A real HTTP/1.1 server on 127.0.0.1 writes a chunked event stream in separate writes; the
gateway's own upstream client (httpx over aiohttp) reads it as the relay does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import httpx
import pytest
from asgiref.sync import sync_to_async
from pytest_django.fixtures import Settings

from nexus import upstream
from nexus.models import ApiToken
from pools.gateway.app import Gateway
from pools.gateway.flight import arrived_chunks
from pools.gateway.ledger import MemoryLedger
from pools.gateway.state import GatewayState
from pools.models import Pool, Target
from tests.support import asgi

EVENTS = [f'data: {{"n": {n}}}\n\n'.encode() for n in range(5)]
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def http_chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


@asynccontextmanager
async def event_server(
    write: Callable[[asyncio.StreamWriter], object],
) -> AsyncIterator[str]:
    """Serve one answer per connection, written by `write`; yield the URL."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(HEAD)
        await writer.drain()
        await write(writer)  # type: ignore[misc]
        if not writer.is_closing():  # `write` may have broken the connection off
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1/chat/completions"
    finally:
        server.close()
        await server.wait_closed()
        await upstream.close()


async def read_pieces(url: str, before_reading: asyncio.Event | None = None) -> list[bytes]:
    response = await upstream.get().send(httpx.Request("POST", url, content=b"{}"))
    try:
        if before_reading is not None:
            await asyncio.wait_for(before_reading.wait(), 5)
            await asyncio.sleep(0.05)  # the last writes reach this process's socket buffer
        return [piece async for piece in arrived_chunks(response)]
    finally:
        await response.aclose()


async def test_events_that_arrived_together_go_out_in_one_piece() -> None:
    written = asyncio.Event()
    ended = asyncio.Event()

    async def write_all_at_once(writer: asyncio.StreamWriter) -> None:
        for event in EVENTS:
            writer.write(http_chunk(event))
            await writer.drain()  # one write each: five separate upstream chunks
        written.set()
        await asyncio.wait_for(ended.wait(), 5)

    async with event_server(write_all_at_once) as url:
        reading = asyncio.create_task(read_pieces(url, before_reading=written))
        # The relay starts reading only once all five are there: one read takes them all.
        await asyncio.wait_for(written.wait(), 5)
        await asyncio.sleep(0.2)
        ended.set()
        pieces = await asyncio.wait_for(reading, 5)

    assert pieces[0] == b"".join(EVENTS)
    assert b"".join(pieces) == b"".join(EVENTS)


async def test_events_written_apart_go_out_one_by_one_as_they_come() -> None:
    async def write_slowly(writer: asyncio.StreamWriter) -> None:
        for event in EVENTS:
            writer.write(http_chunk(event))
            await writer.drain()
            await asyncio.sleep(0.05)

    async with event_server(write_slowly) as url:
        pieces = await asyncio.wait_for(read_pieces(url), 10)

    # Nothing is held back for company: each event is sent as soon as it arrives.
    assert pieces == EVENTS


async def test_the_read_timeout_counts_from_the_last_byte(settings: Settings) -> None:
    # nexus.upstream moves aiohttp's read deadline with each read instead of a timer per read:
    # a stream that keeps talking for longer than the timeout is not cut, and one that stops is
    # cut the timeout after its last byte.
    settings.NEXUS_UPSTREAM_READ_TIMEOUT_S = 0.4
    last_write: list[float] = []
    loop = asyncio.get_running_loop()

    async def talk_then_stall(writer: asyncio.StreamWriter) -> None:
        for _ in range(8):  # 8 × 0.15 s: three times the read timeout
            writer.write(http_chunk(EVENTS[0]))
            await writer.drain()
            last_write.append(loop.time())
            await asyncio.sleep(0.15)
        await asyncio.sleep(5)

    pieces: list[bytes] = []
    async with event_server(talk_then_stall) as url:
        response = await upstream.get().send(httpx.Request("POST", url, content=b"{}"))
        try:
            with pytest.raises(httpx.ReadTimeout):
                async for piece in arrived_chunks(response):
                    pieces.append(piece)
            timed_out = loop.time()
        finally:
            await response.aclose()

    assert b"".join(pieces) == EVENTS[0] * 8
    assert 0.4 <= timed_out - last_write[-1] < 0.4 + 0.25


CHAT = "/chat/completions"


async def relay_through_gateway(
    url: str, wrote: asyncio.Event, go_on: asyncio.Event
) -> tuple[list[dict], list[dict]]:
    """Stream a chat answer from the target at url through the gateway, in process.

    The target writes its head, sets `wrote` and waits for `go_on`. Return what the gateway had
    sent its client 0.2 s after the head was written (when `go_on` is set), and everything it
    sent in the end.
    """

    def configure() -> str:
        pool = Pool.objects.create(name="Head", slug="head")
        base_url = url.removesuffix(CHAT)
        Target.objects.create(pool=pool, name="only", base_url=base_url, model_id="m")
        return ApiToken.issue("head")[1]

    token = await sync_to_async(configure)()
    app = Gateway(state=GatewayState(ledger=MemoryLedger()))
    headers = [(b"authorization", f"Bearer {token}".encode())]
    scope = asgi.http_scope("POST", "/v1/chat/completions", headers)
    body = b'{"model": "@pool/head", "stream": true}'
    sent: list[dict] = []
    calling = asyncio.create_task(asgi.call(app, scope, body, sent))
    try:
        await asyncio.wait_for(wrote.wait(), 5)
        await asyncio.sleep(0.2)  # the target's head has reached the gateway
        before = list(sent)
        go_on.set()
        await asyncio.wait_for(calling, 5)
    finally:
        calling.cancel()
        await app.aclose()
    return before, sent


@pytest.mark.django_db(transaction=True)
async def test_a_streamed_answers_head_goes_to_the_client_with_its_first_bytes() -> None:
    # uvicorn writes a head as soon as it is given; a loaded client then reads the head and the
    # first chunk in two turns of its loop. daphne (Twisted) and aiohttp hold it back anyway.
    wrote, go_on = asyncio.Event(), asyncio.Event()

    async def head_then_events(writer: asyncio.StreamWriter) -> None:
        wrote.set()
        await asyncio.wait_for(go_on.wait(), 5)
        for event in EVENTS:
            writer.write(http_chunk(event))
            await writer.drain()

    async with event_server(head_then_events) as url:
        before, sent = await relay_through_gateway(url, wrote, go_on)

    assert before == []
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert sent[1]["body"].startswith(EVENTS[0])
    assert b"".join(m.get("body", b"") for m in sent[1:]) == b"".join(EVENTS)


@pytest.mark.parametrize("breaks_off", [False, True], ids=["empty", "cut-off"])
@pytest.mark.django_db(transaction=True)
async def test_an_answer_without_a_byte_still_gets_its_head_and_one_cut_off_its_error(
    breaks_off: bool,
) -> None:
    wrote, go_on = asyncio.Event(), asyncio.Event()

    async def head_only(writer: asyncio.StreamWriter) -> None:
        wrote.set()
        await asyncio.wait_for(go_on.wait(), 5)
        if breaks_off:
            writer.transport.abort()

    async with event_server(head_only) as url:
        before, sent = await relay_through_gateway(url, wrote, go_on)

    assert before == []
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    events = b"".join(m.get("body", b"") for m in sent[1:])
    if breaks_off:
        assert events.startswith(b"data: ") and b'"error"' in events, events
    else:
        assert events == b""
