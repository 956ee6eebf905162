"""Routing history, buffered in memory and written in batches off the request path.

Each batch also adds its requests to the tokens' hourly usage (TokenUsage), in the same
transaction: usage is never written per request either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from datetime import UTC, datetime
from typing import Any, TypedDict

from asgiref.sync import sync_to_async
from django.db import IntegrityError, close_old_connections, transaction
from django.db.models import F

from pools.gateway import metrics
from pools.models import Pool, RoutingOutcome, RoutingRecord, Target, TokenUsage

log = logging.getLogger(__name__)

# A batch is written every FLUSH_INTERVAL_S, or as soon as BATCH_SIZE rows wait (DESIGN.md).
FLUSH_INTERVAL_S = 0.25
BATCH_SIZE = 100
# Rows kept while the database is slow or away (about a few MB); beyond it new rows are dropped.
MAX_BUFFERED = 10_000
# Attempts per batch before its rows are dropped, and the pause before the first retry (doubling).
MAX_WRITE_ATTEMPTS = 3
RETRY_DELAY_S = 0.5


class AttemptRow(TypedDict):
    """One attempt of a request on a target."""

    target_id: int
    target_name: str
    phase: str
    status: int | None
    retried: bool
    reason: str


class HistoryRow(TypedDict, total=False):
    """What the gateway records per request: RoutingRecord's fields, by id for relations."""

    request_id: str  # required
    pool_id: int  # required
    kind: str  # required
    outcome: str  # required
    created_at: datetime | float  # when the request arrived (epoch seconds accepted)
    token_id: int | None
    token_name: str
    target_id: int | None
    target_name: str
    status_code: int | None
    failure_reason: str
    attempts: list[AttemptRow]
    decision: dict[str, Any]
    queue_wait_ms: float
    ttft_ms: float | None
    total_ms: float
    stream: bool
    prompt_tokens: int | None
    completion_tokens: int | None


class HistoryWriter:
    """Collect routing records in memory and write them in batches from a background task."""

    def __init__(
        self,
        *,
        batch_size: int = BATCH_SIZE,
        flush_interval_s: float = FLUSH_INTERVAL_S,
        max_buffered: int = MAX_BUFFERED,
        max_write_attempts: int = MAX_WRITE_ATTEMPTS,
        retry_delay_s: float = RETRY_DELAY_S,
    ) -> None:
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.max_buffered = max_buffered
        self.max_write_attempts = max_write_attempts
        self.retry_delay_s = retry_delay_s
        self.written = 0
        self.dropped = 0
        self._buffer: deque[HistoryRow] = deque()
        self._batch_ready = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._closing = False
        self._write_lock: asyncio.Lock | None = None

    def record(self, row: HistoryRow) -> None:
        """Queue one request's record; no I/O, never blocks."""
        if len(self._buffer) >= self.max_buffered:
            self.dropped += 1
            metrics.HISTORY_DROPPED.inc()
            return
        self._buffer.append(row)
        if len(self._buffer) >= self.batch_size:
            self._batch_ready.set()
        if self._flusher is None or self._flusher.done():
            self._start()

    def pending(self) -> int:
        """Return how many rows wait to be written."""
        return len(self._buffer)

    async def flush(self) -> None:
        """Write every buffered row now."""
        if self._write_lock is None:
            self._write_lock = asyncio.Lock()
        async with self._write_lock:
            while self._buffer:
                count = min(self.batch_size, len(self._buffer))
                batch = [self._buffer.popleft() for _ in range(count)]
                await self._write(batch)

    async def aclose(self) -> None:
        """Stop the background task after writing every buffered row."""
        flusher, self._flusher = self._flusher, None
        if flusher is not None:
            self._closing = True
            self._batch_ready.set()
            await flusher
            self._closing = False
        await self.flush()

    def _start(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no event loop yet: the rows wait for flush() or the next record()
        self._flusher = loop.create_task(self._flush_forever())

    async def _flush_forever(self) -> None:
        while not self._closing:
            # Wake at the interval, or earlier when a whole batch is waiting.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._batch_ready.wait(), self.flush_interval_s)
            self._batch_ready.clear()
            try:
                await self.flush()
            except Exception:
                # flush() handles database errors; anything else must not end the writer.
                log.exception("routing history flush failed")

    async def _write(self, batch: list[HistoryRow]) -> None:
        for attempt in range(1, self.max_write_attempts + 1):
            try:
                self.written += await sync_to_async(write_rows)(batch)
                return
            except Exception:
                if attempt == self.max_write_attempts:
                    break
                log.warning(
                    "could not write %d routing records (attempt %d of %d); retrying",
                    len(batch),
                    attempt,
                    self.max_write_attempts,
                    exc_info=True,
                )
                await asyncio.sleep(self.retry_delay_s * 2 ** (attempt - 1))
        self.dropped += len(batch)
        metrics.HISTORY_DROPPED.inc(len(batch))
        log.error(
            "dropped %d routing records after %d attempts (%d dropped so far)",
            len(batch),
            self.max_write_attempts,
            self.dropped,
            exc_info=True,
        )


def write_rows(rows: list[HistoryRow]) -> int:
    """Insert the rows in one statement and add them to the usage; return how many were written."""
    try:
        with transaction.atomic():
            records = _records(rows)
            # ignore_conflicts: a batch retried after a write that did succeed inserts nothing
            # twice (its usage would count twice: only if the commit's answer was lost).
            RoutingRecord.objects.bulk_create(records, ignore_conflicts=True)
            add_usage(records)
        return len(records)
    except Exception:
        # A dropped database connection must not stick: the next attempt reconnects.
        close_old_connections()
        raise


def _records(rows: list[HistoryRow]) -> list[RoutingRecord]:
    # Pools and targets may have been deleted since the requests: rows of a deleted pool go with
    # it (as its history would have), and a deleted target is kept by name only.
    wanted_pools = {pool for row in rows if (pool := row.get("pool_id")) is not None}
    pool_ids = set(Pool.objects.filter(pk__in=wanted_pools).values_list("pk", flat=True))
    wanted_targets = {target for row in rows if (target := row.get("target_id")) is not None}
    target_ids = set(Target.objects.filter(pk__in=wanted_targets).values_list("pk", flat=True))
    records = []
    for row in rows:
        if row.get("pool_id") not in pool_ids:
            continue
        fields: dict[str, Any] = dict(row)
        if fields.get("target_id") not in target_ids:
            fields["target_id"] = None
        fields["attempt_count"] = len(fields.get("attempts", ()))
        created_at = fields.get("created_at")
        if isinstance(created_at, int | float):
            fields["created_at"] = datetime.fromtimestamp(created_at, UTC)
        try:
            records.append(RoutingRecord(**fields))
        except (TypeError, ValueError):
            log.error("skipped a malformed routing record: %r", row.get("request_id"))
    return records


UsageKey = tuple[int, int, datetime]  # token id, pool id, hour


def usage_of(records: list[RoutingRecord]) -> dict[UsageKey, dict[str, int]]:
    """Sum the records' requests, errors and tokens per token, pool and hour (UTC)."""
    totals: dict[UsageKey, dict[str, int]] = {}
    for record in records:
        if record.token_id is None:
            continue  # a public service's anonymous caller has no usage to count
        hour = record.created_at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        key = (record.token_id, record.pool_id, hour)
        sums = totals.setdefault(
            key, {"requests": 0, "errors": 0, "prompt_tokens": 0, "completion_tokens": 0}
        )
        sums["requests"] += 1
        sums["errors"] += record.outcome != RoutingOutcome.OK
        sums["prompt_tokens"] += record.prompt_tokens or 0
        sums["completion_tokens"] += record.completion_tokens or 0
    return totals


def add_usage(records: list[RoutingRecord]) -> None:
    """Add the records to the hourly usage rows, one statement or two per token, pool and hour."""
    for (token_id, pool_id, hour), sums in usage_of(records).items():
        rows = TokenUsage.objects.filter(token_id=token_id, pool_id=pool_id, hour=hour)
        increments = {name: F(name) + value for name, value in sums.items()}
        if rows.update(**increments):
            continue
        try:
            with transaction.atomic():
                TokenUsage.objects.create(token_id=token_id, pool_id=pool_id, hour=hour, **sums)
        except IntegrityError:
            # Another gateway's writer created the hour's row since: add to it.
            rows.update(**increments)
