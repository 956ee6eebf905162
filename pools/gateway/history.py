"""Routing history, handed over as compact records and written in batches by a writer thread.

The request only appends a tuple (HistoryRecord) to a bounded buffer: no dict building, no
serialisation, no I/O on the event loop. The writer thread turns records into rows (the
decision's explanation is built there, from the Decision objects), inserts each batch in one
statement and adds it to the tokens' hourly usage (TokenUsage) in the same transaction: usage is
never written per request either.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, NamedTuple, TypedDict

from django.db import IntegrityError, close_old_connections, connection, transaction
from django.db.models import F

from pools.balancer.snapshot import Decision
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


class DecisionFacts(NamedTuple):
    """A request's routing decisions as the balancer made them, explained only when written."""

    latest: Decision | None  # the last attempt's, or the one that found none
    per_attempt: tuple[Decision, ...]  # the decision that chose each attempt's target
    kind: str
    sticky_target_id: int | None
    prefix_target_id: int | None
    method: str | None = None  # a forwarded (/serve) request's
    path: str | None = None
    woken_by: str = ""  # the rule that gave it its slot when it waited (FairQueue.pop_for)

    def explain(self) -> dict[str, Any]:
        """Return the explanation kept in the history (RoutingRecord.decision)."""
        decision = self.latest.to_dict() if self.latest else {}
        earlier = self.per_attempt
        if len(earlier) > 1 or (earlier and earlier[-1] is not self.latest):
            # Retried (or no target was left after a failure): each attempt's own ranking, which
            # the latest decision shows only as "already tried".
            decision["per_attempt"] = [each.to_dict() for each in earlier]
        if self.woken_by:
            decision["woken_by"] = self.woken_by
        request: dict[str, Any] = {
            "kind": self.kind,
            "sticky_target_id": self.sticky_target_id,
            "prefix_target_id": self.prefix_target_id,
        }
        if self.method is not None:
            request["method"] = self.method
            request["path"] = self.path
        decision["request"] = request
        return decision


class HistoryRecord(NamedTuple):
    """What the gateway records per request: RoutingRecord's fields, by id for relations."""

    request_id: str
    pool_id: int
    kind: str
    outcome: str
    created_at: datetime | float  # when the request arrived (epoch seconds accepted)
    token_id: int | None = None
    token_name: str = ""
    target_id: int | None = None
    target_name: str = ""
    status_code: int | None = None
    failure_reason: str = ""
    attempts: list[AttemptRow] | tuple[()] = ()
    # The gateway's decisions, or an explanation already built (a record made elsewhere).
    decision: DecisionFacts | Mapping[str, Any] | None = None
    queue_wait_ms: float = 0.0
    ttft_ms: float | None = None
    total_ms: float = 0.0
    stream: bool = False
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class HistoryWriter:
    """Collect routing records in memory and write them in batches from a thread of its own.

    record() runs on the request's event loop and only appends; the thread, started with the
    first record, wakes every flush interval (or when a whole batch waits), serialises and writes.
    """

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
        # Counted apart: the request's thread counts a full buffer, the writer a failed batch.
        self._dropped_full = 0
        self._dropped_failed = 0
        self._buffer: deque[HistoryRecord] = deque()  # append and popleft are thread-safe
        self._wake = threading.Event()
        self._closing = False
        self._thread: threading.Thread | None = None

    @property
    def dropped(self) -> int:
        """Return how many records were lost: buffer full, or database failing."""
        return self._dropped_full + self._dropped_failed

    def record(self, record: HistoryRecord) -> None:
        """Queue one request's record; no I/O, never blocks."""
        if len(self._buffer) >= self.max_buffered:
            self._dropped_full += 1
            metrics.HISTORY_DROPPED.inc()
            return
        self._buffer.append(record)
        if len(self._buffer) >= self.batch_size:
            self._wake.set()
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._write_forever, name="nexus-history", daemon=True
            )
            self._thread.start()

    def pending(self) -> int:
        """Return how many records wait to be written (one batch may be being written)."""
        return len(self._buffer)

    def close(self) -> None:
        """Write every buffered record, then stop the thread (at shutdown, and in tests)."""
        thread = self._thread
        if thread is not None:
            self._closing = True
            self._wake.set()
            thread.join()
            self._closing = False
            self._thread = None
        if self._buffer:  # recorded while no thread ran
            self._write_buffered()

    async def aclose(self) -> None:
        """close(), without blocking the event loop."""
        await asyncio.to_thread(self.close)

    def _write_forever(self) -> None:
        try:
            while not self._closing:
                # Wake at the interval, or earlier when a whole batch is waiting.
                self._wake.wait(self.flush_interval_s)
                self._wake.clear()
                self._write_buffered()
            self._write_buffered()
        finally:
            # The thread's own database connection goes with it.
            connection.close()

    def _write_buffered(self) -> None:
        while self._buffer:
            batch: list[HistoryRecord] = []
            while self._buffer and len(batch) < self.batch_size:
                batch.append(self._buffer.popleft())
            try:
                self._write(batch)
            except Exception:
                # _write handles database errors; anything else must not end the writer.
                log.exception("routing history write failed")

    def _write(self, batch: list[HistoryRecord]) -> None:
        for attempt in range(1, self.max_write_attempts + 1):
            try:
                self.written += write_rows(batch)
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
                time.sleep(self.retry_delay_s * 2 ** (attempt - 1))
        self._dropped_failed += len(batch)
        metrics.HISTORY_DROPPED.inc(len(batch))
        log.error(
            "dropped %d routing records after %d attempts (%d dropped so far)",
            len(batch),
            self.max_write_attempts,
            self.dropped,
            exc_info=True,
        )


def write_rows(records: list[HistoryRecord]) -> int:
    """Insert the records in one statement and add them to the usage; return how many were
    written."""
    try:
        try:
            return _insert(_rows(records))
        except IntegrityError:
            # A pool or target was deleted since its requests (the database refused a foreign
            # key): only now look up which still exist.
            return _insert(_rows(records, existing=_existing(records)))
    except Exception:
        # A dropped database connection must not stick: the next attempt reconnects.
        close_old_connections()
        raise


def _insert(rows: list[RoutingRecord]) -> int:
    with transaction.atomic():
        # ignore_conflicts: a batch retried after a write that did succeed inserts nothing
        # twice (its usage would count twice: only if the commit's answer was lost).
        RoutingRecord.objects.bulk_create(rows, ignore_conflicts=True)
        add_usage(rows)
    return len(rows)


def _existing(records: list[HistoryRecord]) -> tuple[set[int], set[int]]:
    """Return which of the records' pools and targets still exist."""
    pools = {record.pool_id for record in records}
    targets = {record.target_id for record in records if record.target_id is not None}
    return (
        set(Pool.objects.filter(pk__in=pools).values_list("pk", flat=True)),
        set(Target.objects.filter(pk__in=targets).values_list("pk", flat=True)),
    )


def _rows(
    records: list[HistoryRecord], existing: tuple[set[int], set[int]] | None = None
) -> list[RoutingRecord]:
    """Build the model rows; with `existing` (pools, targets), rows of a deleted pool go with
    it (as its history would have), and a deleted target is kept by name only."""
    rows = []
    for record in records:
        fields: dict[str, Any] = record._asdict()
        if existing is not None:
            if record.pool_id not in existing[0]:
                continue
            if record.target_id not in existing[1]:
                fields["target_id"] = None
        decision = record.decision
        if isinstance(decision, DecisionFacts):
            fields["decision"] = decision.explain()
        elif decision is None:
            fields["decision"] = {}
        fields["attempts"] = list(record.attempts)
        fields["attempt_count"] = len(record.attempts)
        if isinstance(record.created_at, int | float):
            fields["created_at"] = datetime.fromtimestamp(record.created_at, UTC)
        try:
            rows.append(RoutingRecord(**fields))
        except (TypeError, ValueError):
            log.error("skipped a malformed routing record: %r", record.request_id)
    return rows


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
