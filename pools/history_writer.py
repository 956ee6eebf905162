"""The history writer: read the gateways' record batches from the Redis stream, write them in bulk.

Runs as its own process (`manage.py runhistorywriter`), beside every gateway, so that building
rows and explanations and talking to the database never share a gateway's GIL. Batches are read
in a consumer group (`writers`): each entry is acknowledged (XACK) only after its rows and usage
were committed, so a writer that dies leaves its entries pending, and the next one (the same
consumer name after a restart, or any writer once they have been idle CLAIM_IDLE_MS) writes them
again. Inserts are idempotent (unique request ids, `ignore_conflicts`), and an entry delivered a
second time has its stored rows looked up first, so that its usage is not added twice: nothing
is lost and nothing counted twice. New entries are written without any lookup. A database outage
is waited out (the entries stay in Redis); only an entry that cannot be decoded, or a batch the
database refuses for good, is dropped, logged, and counted in Redis (`writer_drops_key`), which
every web process's /metrics reports as `nexus_history_writer_dropped_rows_total`, whichever
writer dropped it and across its restarts.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis
from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, close_old_connections
from redis.exceptions import RedisError, ResponseError

from pools.gateway.history import (
    BATCH_SIZE,
    HistoryRecord,
    decode_batch,
    stream_key,
    write_rows,
    writer_drops_key,
)

log = logging.getLogger(__name__)

GROUP = "writers"
# Stream entries (each a batch of up to 100 records) read per round trip, and how long a read
# waits for new ones: also how long a stop (SIGTERM) may wait before the writer sees it, since
# Python runs the handler only when the read returns. Five idle reads a second cost nothing.
READ_COUNT = 10
BLOCK_MS = 200
# Another writer's pending entries are taken over once idle this long (it died mid-batch).
CLAIM_IDLE_MS = 60_000
CLAIM_EVERY_S = 10.0
# Pauses after a failure (Redis or the database away), doubling.
RETRY_MIN_S, RETRY_MAX_S = 0.25, 5.0
# Attempts at a batch the database refuses with something other than a lost connection.
MAX_REJECTIONS = 3
# At a clean stop: how long the writer keeps writing what is already on the stream.
STOP_DRAIN_S = 10.0
REDIS_TIMEOUT_S = 5.0

Entry = tuple[Any, Any]  # (entry id, fields or None when trimmed)


def default_consumer() -> str:
    """Return the consumer name of this machine's writer (stable across restarts)."""
    return f"writer@{socket.gethostname()}"


class StreamWriter:
    """One consumer of the history stream: read, write, acknowledge."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        consumer: str,
        *,
        claim_idle_ms: int = CLAIM_IDLE_MS,
    ) -> None:
        self.client = client
        self.stream = stream_key(prefix)
        self.drops_key = writer_drops_key(prefix)
        self.consumer = consumer
        self.claim_idle_ms = claim_idle_ms
        self.written = 0  # records handed to the database (rows of deleted pools included)
        self.dropped: dict[str, int] = {}
        self._group_ready = False
        self._claimed_at = 0.0
        self._rejections: dict[Any, int] = {}

    def step(self, block_ms: int | None = None) -> int:
        """Write one round of entries: this consumer's pending ones (left by a failed write or a
        crash) first, then idle ones of dead writers, then new ones (waiting up to block_ms);
        return how many entries were handled. Raise RedisError or DatabaseError."""
        self._ensure_group()
        try:
            # Entries read before (by this consumer, or one that died) may be written already.
            entries, redelivered = self._read("0"), True
            if not entries and time.monotonic() - self._claimed_at >= CLAIM_EVERY_S:
                entries = self._claim()
            if not entries:
                entries, redelivered = self._read(">", block_ms), False
        except ResponseError as error:
            if "NOGROUP" not in str(error):
                raise
            self._group_ready = False  # Redis came back empty: the group goes with the stream
            return 0
        if entries:
            self._write(entries, redelivered)
        return len(entries)

    def drain(self, timeout_s: float = STOP_DRAIN_S) -> int:
        """Write what is on the stream now, without waiting for more; return the entries."""
        handled = 0
        deadline = time.monotonic() + timeout_s
        self._claimed_at = 0.0
        while time.monotonic() < deadline:
            count = self.step(block_ms=None)
            if count == 0:
                break
            handled += count
        return handled

    def run(self, stop: threading.Event) -> None:
        """Write until `stop` is set, riding out Redis and database outages; then drain."""
        delay = RETRY_MIN_S
        failing: str | None = None
        while not stop.is_set():
            try:
                self.step(block_ms=BLOCK_MS)
            except (RedisError, OSError, DatabaseError) as error:
                what = "Redis" if isinstance(error, RedisError | OSError) else "the database"
                if failing != what:
                    log.warning("history writer waits for %s: %s", what, error)
                    failing = what
                close_old_connections()
                stop.wait(delay)
                delay = min(RETRY_MAX_S, delay * 2)
                continue
            if failing is not None:
                log.info("history writer: %s is back", failing)
                failing = None
            delay = RETRY_MIN_S
        try:
            drained = self.drain()
        except (RedisError, OSError, DatabaseError) as error:
            log.warning("history writer stopped with entries left on the stream: %s", error)
        else:
            if drained:
                log.info("history writer wrote %d batches left on the stream", drained)

    def _ensure_group(self) -> None:
        if self._group_ready:
            return
        try:
            # From the stream's start: batches shipped before any writer ever ran count too.
            self.client.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
        except ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise
        self._group_ready = True

    def _read(self, start: str, block_ms: int | None = None) -> list[Entry]:
        answer: Any = self.client.xreadgroup(
            GROUP, self.consumer, {self.stream: start}, count=READ_COUNT, block=block_ms
        )
        if not answer:
            return []
        # [[stream, [(entry id, fields), ...]]]; fields are None for a trimmed entry.
        return list(answer[0][1])

    def _claim(self) -> list[Entry]:
        self._claimed_at = time.monotonic()
        answer: Any = self.client.xautoclaim(
            self.stream, GROUP, self.consumer, self.claim_idle_ms, "0-0", count=READ_COUNT
        )
        entries = answer[1] if len(answer) > 1 else []
        if entries:
            log.info("history writer took over %d batches of a writer that stopped", len(entries))
        return list(entries)

    def _write(self, entries: Sequence[Entry], redelivered: bool) -> None:
        records: list[HistoryRecord] = []
        for entry_id, fields in entries:
            payload = (fields or {}).get(b"r") or (fields or {}).get("r")
            if payload is None:
                # Trimmed from the stream (MAXLEN) before any writer read it.
                self._drop("trimmed", 1, entry_id)
                continue
            try:
                records.extend(decode_batch(payload))
            except ValueError as error:
                self._drop("malformed", 1, entry_id, error)
        ids = [entry_id for entry_id, _ in entries]
        try:
            for start in range(0, len(records), BATCH_SIZE * READ_COUNT):
                chunk = records[start : start + BATCH_SIZE * READ_COUNT]
                self.written += write_rows(chunk, redelivered=redelivered)
        except (OperationalError, InterfaceError):
            raise  # the database is away: the entries stay pending, written again later
        except DatabaseError as error:
            first = ids[0]
            self._rejections[first] = self._rejections.get(first, 0) + 1
            if self._rejections[first] < MAX_REJECTIONS:
                raise
            del self._rejections[first]
            self._drop("rejected", len(records), first, error)
        self.client.xack(self.stream, GROUP, *ids)

    def _drop(self, cause: str, count: int, entry_id: Any, error: object = None) -> None:
        self.dropped[cause] = self.dropped.get(cause, 0) + count
        try:
            self.client.hincrby(self.drops_key, cause, count)
        except RedisError as redis_error:
            log.error("history writer could not count its drops in Redis: %s", redis_error)
        log.error(
            "history writer dropped %d (%s) at stream entry %r: %s",
            count,
            cause,
            entry_id,
            error or "",
        )


def writer(consumer: str | None = None) -> StreamWriter:
    """Return a writer of this process's settings' stream (the consumer: this machine's)."""
    client = redis.Redis.from_url(
        settings.REDIS_URL,
        socket_timeout=REDIS_TIMEOUT_S + BLOCK_MS / 1000,
        socket_connect_timeout=REDIS_TIMEOUT_S,
    )
    return StreamWriter(client, settings.NEXUS_REDIS_PREFIX, consumer or default_consumer())


def drain(consumer: str = "drain") -> int:
    """Write every batch on the stream now, in this process (tests, and one-off catch-ups);
    return how many stream entries were handled."""
    stream_writer = writer(consumer)
    try:
        return stream_writer.drain()
    finally:
        stream_writer.client.close()
