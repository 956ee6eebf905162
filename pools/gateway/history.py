"""Routing history: compact records, shipped off the request's process, written in bulk.

The request only appends a tuple (HistoryRecord) to a bounded buffer: no dict building, no
serialisation, no I/O. A background task of the gateway (HistoryShipper) packs each batch into
plain tuples (`pack`: the Decision objects as nested tuples, no explanation), pickles the batch
and appends it to a Redis stream, `<NEXUS_REDIS_PREFIX>:history`, in one XADD. A writer process
(`manage.py runhistorywriter`, pools.history_writer) reads the stream in a consumer group,
unpacks the records, builds the rows and their explanation (`DecisionFacts.explain`) and inserts
them with the tokens' hourly usage (`write_rows`, below: the one definition of both) before it
acknowledges them. The gateway's CPU per record is the packing: about 7 µs, against about 14 µs
for the explanation it no longer builds and 55 µs for pickling the Decision objects as they are.

While Redis is away the buffer keeps up to MAX_BUFFERED records (the oldest are dropped beyond
that, counted in `nexus_history_dropped_rows_total{cause="buffer_full"}` and logged) and
shipping is retried with backoff. At shutdown what is left is shipped; when Redis refuses it,
the gateway writes it to the database itself with `write_rows` (docs/gateway.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import io
import logging
import pickle
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import astuple
from datetime import UTC, datetime
from typing import Any, NamedTuple, TypedDict

import redis.asyncio as aioredis
from django.conf import settings
from django.db import IntegrityError, close_old_connections, connection, transaction
from django.db.models import F
from redis.exceptions import RedisError

from pools.balancer.snapshot import Decision, Factor, Ranked, Skipped, SkipReason, StickyWait
from pools.gateway import metrics
from pools.models import Pool, RoutingOutcome, RoutingRecord, Target, TokenUsage

log = logging.getLogger(__name__)

# A batch is shipped every SHIP_INTERVAL_S, or as soon as BATCH_SIZE records wait (DESIGN.md).
SHIP_INTERVAL_S = 0.25
BATCH_SIZE = 100
# Batches per pipelined round trip when a backlog is shipped (after an outage, at shutdown).
BATCHES_PER_TRIP = 20
# Records kept while Redis is away (about 1 KB each in memory); beyond it the oldest go.
MAX_BUFFERED = 10_000
# Shipping retries after a failure: first after RETRY_MIN_S, doubling up to RETRY_MAX_S.
RETRY_MIN_S, RETRY_MAX_S = 0.25, 5.0
REDIS_TIMEOUT_S = 2.0
# Time the shutdown gives Redis to take what is left before writing it directly.
SHUTDOWN_SHIP_TIMEOUT_S = 5.0
# The stream keeps about this many batches (XADD MAXLEN ~): up to ~10 M records waiting for a
# writer that is away; older batches are trimmed by Redis (docs/gateway.md).
STREAM_MAXLEN = 100_000
PACK_VERSION = 1


def stream_key(prefix: str) -> str:
    """Return the key of the stream the gateways ship history batches to."""
    return f"{prefix}:history"


def writer_drops_key(prefix: str) -> str:
    """Return the key of the hash counting the rows history writers dropped, by cause: the
    writers serve no /metrics, so the web process reads their counts from here."""
    return f"{prefix}:history:dropped"


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


# Packing: plain tuples, lists and dicts only (pickle writes them in C); the Decision objects
# become nested tuples and are rebuilt by the writer, which explains them there.

_PackedDecision = tuple[Any, ...]


def _pack_decision(decision: Decision) -> _PackedDecision:
    return (
        decision.target_id,
        decision.tier,
        [
            (ranked.target_id, ranked.name, ranked.score,
             [(factor.name, factor.value, factor.note) for factor in ranked.factors])
            for ranked in decision.ranking
        ],
        [(skip.target_id, skip.name, skip.reason.value, skip.detail) for skip in decision.skipped],
        decision.all_full,
        decision.continuity,
        decision.unranked,
        None if decision.sticky_wait is None else astuple(decision.sticky_wait),
    )  # fmt: skip


def _unpack_decision(packed: _PackedDecision) -> Decision:
    target_id, tier, ranking, skipped, all_full, continuity, unranked, sticky_wait = packed
    return Decision(
        target_id,
        tier,
        tuple(
            Ranked(ranked_id, name, score, tuple(Factor(*factor) for factor in factors))
            for ranked_id, name, score, factors in ranking
        ),
        tuple(
            Skipped(skip_id, name, SkipReason(reason), detail)
            for skip_id, name, reason, detail in skipped
        ),
        all_full,
        continuity,
        unranked,
        None if sticky_wait is None else StickyWait(*sticky_wait),
    )


def _pack_facts(facts: DecisionFacts) -> tuple[Any, ...]:
    latest = facts.latest
    return (
        "facts",
        None if latest is None else _pack_decision(latest),
        # None stands for the latest decision itself (explain() tells them apart by identity).
        [None if each is latest else _pack_decision(each) for each in facts.per_attempt],
        *facts[2:],
    )


def _unpack_facts(packed: tuple[Any, ...]) -> DecisionFacts:
    _, latest_packed, per_attempt, *rest = packed
    latest = None if latest_packed is None else _unpack_decision(latest_packed)
    per = tuple(_unpack_decision(each) if each is not None else latest for each in per_attempt)
    return DecisionFacts(latest, per, *rest)  # type: ignore[arg-type]  # None only as latest


def pack(record: HistoryRecord) -> tuple[Any, ...]:
    """Return the record as plain values, its decisions unexplained (cheap: no dicts built)."""
    decision = record.decision
    packed: Any
    if isinstance(decision, DecisionFacts):
        packed = _pack_facts(decision)
    elif decision is None:
        packed = None
    else:
        packed = ("explained", dict(decision))
    created_at = record.created_at
    if isinstance(created_at, datetime):
        created_at = created_at.timestamp()
    return (*record[:4], created_at, *record[5:11], list(record.attempts), packed, *record[13:])


def unpack(packed: tuple[Any, ...]) -> HistoryRecord:
    """Return the record `pack` was given (created_at as epoch seconds)."""
    fields = list(packed)
    decision = fields[12]
    if decision is not None:
        fields[12] = _unpack_facts(decision) if decision[0] == "facts" else decision[1]
    return HistoryRecord(*fields)


def encode_batch(records: Iterable[HistoryRecord]) -> bytes:
    """Return the records as one stream entry's payload."""
    return pickle.dumps((PACK_VERSION, [pack(record) for record in records]), protocol=5)


class _PlainUnpickler(pickle.Unpickler):
    """Unpickle plain values and enum members only: nothing from Redis runs code here."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in {("datetime", "datetime"), ("datetime", "timezone")}:
            return super().find_class(module, name)
        found = (
            super().find_class(module, name) if module.startswith(("pools.", "nexus.")) else None
        )
        if isinstance(found, type) and issubclass(found, enum.Enum):
            return found
        raise pickle.UnpicklingError(f"not a history record's value: {module}.{name}")


def decode_batch(payload: bytes) -> list[HistoryRecord]:
    """Return the records of one stream entry's payload; raise ValueError if it is not one."""
    try:
        version, packed = _PlainUnpickler(io.BytesIO(payload)).load()
        if version != PACK_VERSION:
            raise ValueError(f"history batch of format {version}, not {PACK_VERSION}")
        return [unpack(each) for each in packed]
    except (pickle.UnpicklingError, EOFError, TypeError, ValueError, IndexError) as error:
        raise ValueError(f"not a history batch: {error!r}") from None


class HistoryShipper:
    """Collect routing records in memory and ship them in batches to the history stream.

    record() runs on the request's event loop and only appends; a task of the same loop,
    started with the first record, ships every interval (or when a whole batch waits).
    """

    def __init__(
        self,
        redis_url: str | None = None,
        prefix: str | None = None,
        *,
        batch_size: int = BATCH_SIZE,
        ship_interval_s: float = SHIP_INTERVAL_S,
        max_buffered: int = MAX_BUFFERED,
        retry_max_s: float = RETRY_MAX_S,
        stream_maxlen: int = STREAM_MAXLEN,
    ) -> None:
        self.redis_url = redis_url if redis_url is not None else settings.REDIS_URL
        self.stream = stream_key(prefix if prefix is not None else settings.NEXUS_REDIS_PREFIX)
        self.batch_size = batch_size
        self.ship_interval_s = ship_interval_s
        self.max_buffered = max_buffered
        self.retry_max_s = retry_max_s
        self.stream_maxlen = stream_maxlen
        self.shipped = 0  # records on the stream
        self.written = 0  # records written to the database directly (at shutdown)
        self.dropped: dict[str, int] = {}  # by cause: buffer_full, shutdown
        self._buffer: deque[HistoryRecord] = deque()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._redis: aioredis.Redis | None = None
        self._unreachable = False
        self._closing = False

    def record(self, record: HistoryRecord) -> None:
        """Queue one request's record; no I/O, never blocks."""
        buffer = self._buffer
        if len(buffer) >= self.max_buffered:
            buffer.popleft()
            self._drop("buffer_full", 1)
        buffer.append(record)
        if self._task is None:
            self._start()
        elif len(buffer) >= self.batch_size and self._wake is not None:
            self._wake.set()

    def pending(self) -> int:
        """Return how many records wait to be shipped."""
        return len(self._buffer)

    async def ship(self) -> None:
        """Ship every buffered record now; raise RedisError (or OSError) if Redis refuses."""
        buffer = self._buffer
        while buffer:
            batches: list[list[HistoryRecord]] = []
            while buffer and len(batches) < BATCHES_PER_TRIP:
                count = min(self.batch_size, len(buffer))
                batches.append([buffer.popleft() for _ in range(count)])
            try:
                async with self._client().pipeline(transaction=False) as pipe:
                    for batch in batches:
                        pipe.xadd(
                            self.stream,
                            {"r": encode_batch(batch)},
                            maxlen=self.stream_maxlen,
                            approximate=True,
                        )
                    await pipe.execute()
            except BaseException:
                # Back to the front, in order; what arrived meanwhile stays behind them.
                for batch in reversed(batches):
                    buffer.extendleft(reversed(batch))
                excess = len(buffer) - self.max_buffered
                if excess > 0:
                    for _ in range(excess):
                        buffer.popleft()
                    self._drop("buffer_full", excess)
                raise
            self.shipped += sum(len(batch) for batch in batches)

    async def aclose(self) -> None:
        """Ship what is left (at shutdown, and in tests); when Redis refuses, write it to the
        database directly."""
        task, self._task = self._task, None
        if task is not None:
            # Not cancelled: an XADD cut off after Redis took it would be shipped twice.
            self._closing = True
            assert self._wake is not None
            self._wake.set()
            await asyncio.gather(task, return_exceptions=True)
            self._closing = False
        if self._buffer:
            try:
                await asyncio.wait_for(self.ship(), SHUTDOWN_SHIP_TIMEOUT_S)
            except (RedisError, OSError, TimeoutError):
                left = list(self._buffer)
                self._buffer.clear()
                log.warning(
                    "Redis did not take the last %d routing records: writing them to the "
                    "database directly",
                    len(left),
                )
                await asyncio.to_thread(self._write_directly, left)
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None

    def _write_directly(self, records: list[HistoryRecord]) -> None:
        try:
            for start in range(0, len(records), self.batch_size):
                batch = records[start : start + self.batch_size]
                try:
                    self.written += write_rows(batch)
                except Exception:
                    self._drop("shutdown", len(batch))
                    log.exception("could not write %d routing records at shutdown", len(batch))
        finally:
            connection.close()  # this thread's own

    def _client(self) -> aioredis.Redis:
        if self._redis is None:
            self._redis = aioredis.Redis.from_url(
                self.redis_url,
                socket_timeout=REDIS_TIMEOUT_S,
                socket_connect_timeout=REDIS_TIMEOUT_S,
            )
        return self._redis

    def _start(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no event loop (a test's plain thread): aclose() ships
        self._wake = asyncio.Event()
        self._task = loop.create_task(self._ship_forever(), name="nexus-history-shipper")

    def _drop(self, cause: str, count: int) -> None:
        total = self.dropped.get(cause, 0)
        self.dropped[cause] = total + count
        metrics.HISTORY_DROPPED.labels(cause).inc(count)
        # Logged at the first drop of a cause and then once per 1,000, not per record.
        if total // 1000 != (total + count) // 1000 or total == 0:
            log.error("dropped %d routing records (%s; %d so far)", count, cause, total + count)

    async def _ship_forever(self) -> None:
        assert self._wake is not None
        delay = self.ship_interval_s
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
            self._wake.clear()
            if self._closing:
                return  # aclose() ships the rest, or writes it
            try:
                await self.ship()
            except (RedisError, OSError) as error:
                if not self._unreachable:
                    log.warning(
                        "routing history not shipped (Redis unreachable: %s); keeping up to %d "
                        "records and retrying",
                        error,
                        self.max_buffered,
                    )
                    self._unreachable = True
                delay = min(self.retry_max_s, max(RETRY_MIN_S, delay * 2))
                continue
            except Exception:
                log.exception("routing history could not be shipped; retrying")
                delay = min(self.retry_max_s, max(RETRY_MIN_S, delay * 2))
                continue
            if self._unreachable:
                log.info("routing history shipped to Redis again")
                self._unreachable = False
            delay = self.ship_interval_s


def write_rows(records: list[HistoryRecord], *, redelivered: bool = False) -> int:
    """Insert the records in one statement and add them to the usage; return how many were
    written.

    `redelivered`: the records may have been written already (a writer died between its commit
    and its acknowledgement): only then are they looked up first, so that their usage is not
    counted twice (ignore_conflicts alone keeps the rows single, not the sums)."""
    try:
        if redelivered:
            records = _not_written(records)
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


def _not_written(records: list[HistoryRecord]) -> list[HistoryRecord]:
    """Return the records whose rows are not stored yet."""
    ids = [record.request_id for record in records]
    stored = set(
        RoutingRecord.objects.filter(request_id__in=ids).values_list("request_id", flat=True)
    )
    return [record for record in records if record.request_id not in stored]


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
