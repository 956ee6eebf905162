"""Routing history: shipped in batches off the request path to a Redis stream, written by the
history writer, read through the API, kept bounded."""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import OperationalError, connection, connections
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from nexus import graceful
from nexus.models import Project, Role
from nexus.services import redis_client
from pools import history_retention, history_writer, tasks
from pools.balancer.snapshot import Decision, Factor, Ranked, Skipped, SkipReason, StickyWait
from pools.gateway import history, metrics
from pools.gateway.history import (
    DecisionFacts,
    HistoryRecord,
    HistoryShipper,
    decode_batch,
    encode_batch,
    stream_key,
    writer_drops_key,
)
from pools.gateway.ledger import MemoryLedger
from pools.gateway.publish import Publisher
from pools.gateway.state import GatewayState
from pools.history_writer import GROUP, StreamWriter
from pools.models import Pool, RoutingOutcome, RoutingRecord, Target, TokenUsage
from tests.nexus.factories import make_pool, make_target, make_user
from tests.support.personas import add_member, signed_in

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
DECISION = {
    "strategy": "smart",
    "ranking": [{"target_id": 1, "score": 0.4, "factors": {"utilization": 0.25}}],
    "skipped": [{"target_id": 2, "reason": "full"}],
    "continuity": "none",
}


def row(pool: Pool, number: int, **fields: Any) -> HistoryRecord:
    """Return what the gateway would record for its request number `number`."""
    defaults: dict[str, Any] = {"status_code": 200, "total_ms": 12.5}
    return HistoryRecord(
        request_id=f"{number:032x}",
        pool_id=pool.pk,
        kind=fields.pop("kind", "chat"),
        outcome=fields.pop("outcome", "ok"),
        created_at=fields.pop("created_at", NOW),
        **{**defaults, **fields},
    )


def make_record(pool: Pool, number: int, **fields: Any) -> RoutingRecord:
    stored = {**row(pool, number)._asdict(), "decision": {}, "attempts": []}
    if "target" in fields:
        del stored["target_id"]
    return RoutingRecord.objects.create(**{**stored, **fields})


class Stream:
    """A history stream of the test's own (its own key prefix), with a writer reading it."""

    def __init__(self) -> None:
        self.prefix = f"test-history-{uuid.uuid4().hex[:8]}"
        self.client = redis_client()

    def shipper(self, **options: Any) -> HistoryShipper:
        return HistoryShipper(settings.REDIS_URL, self.prefix, **options)

    def writer(self, consumer: str = "writer-1", **options: Any) -> StreamWriter:
        return StreamWriter(self.client, self.prefix, consumer, **options)

    def entries(self) -> int:
        return int(self.client.xlen(stream_key(self.prefix)))

    def drain(self) -> int:
        return self.writer().drain()

    def delete(self) -> None:
        self.client.delete(stream_key(self.prefix), writer_drops_key(self.prefix))
        self.client.close()


@pytest.fixture
def stream() -> Iterator[Stream]:
    made = Stream()
    yield made
    made.delete()


async def stored() -> int:
    return await RoutingRecord.objects.acount()


async def wait_for(condition: Callable[[], Any], timeout_s: float = 2.0) -> float:
    """Return the seconds it took until `condition()` is true."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, "not in time"
        await asyncio.sleep(0.01)
    return time.monotonic() - start


@pytest.fixture
async def pool() -> AsyncIterator[Pool]:
    yield await sync_to_async(make_pool)("chat")
    await sync_to_async(connections.close_all)()


# The shipper writes from a worker thread at shutdown, with its own connection: the rows must be
# committed.
writer_test = pytest.mark.django_db(transaction=True)


# Shipping (the gateway's side) --------------------------------------------------------------


async def test_a_full_batch_is_shipped_in_one_stream_entry_at_once(stream: Stream) -> None:
    shipper = stream.shipper(ship_interval_s=60)
    pool = Pool(pk=1, slug="chat")

    for number in range(100):
        shipper.record(row(pool, number))
    await wait_for(lambda: shipper.shipped == 100)

    assert (stream.entries(), shipper.pending()) == (1, 0)
    await shipper.aclose()


async def test_a_few_records_are_shipped_by_the_timer_within_half_a_second(stream: Stream) -> None:
    shipper = stream.shipper()
    pool = Pool(pk=1, slug="chat")

    for number in range(3):
        shipper.record(row(pool, number))
    assert shipper.pending() == 3  # recording itself does no I/O

    assert await wait_for(lambda: stream.entries() == 1) < 0.5
    await shipper.aclose()


async def test_closing_the_shipper_ships_what_is_left_in_batches_of_100(stream: Stream) -> None:
    shipper = stream.shipper(ship_interval_s=60)
    pool = Pool(pk=1, slug="chat")
    for number in range(250):
        shipper.record(row(pool, number))

    await shipper.aclose()

    assert (shipper.shipped, shipper.pending(), stream.entries()) == (250, 0, 3)


@writer_test
async def test_a_shipped_record_is_written_with_every_field_the_gateway_gave(
    pool: Pool, stream: Stream
) -> None:
    target = await sync_to_async(make_target)(pool, "gpu-1")
    attempts = [
        {
            "target_id": target.pk,
            "target_name": "gpu-1",
            "phase": "response",
            "status": 200,
            "retried": False,
            "reason": "",
        }
    ]
    shipper = stream.shipper()
    shipper.record(
        row(
            pool,
            1,
            token_id=42,
            token_name="app",
            target_id=target.pk,
            target_name="gpu-1",
            attempts=attempts,
            decision=DECISION,
            queue_wait_ms=3.0,
            ttft_ms=80.5,
            stream=True,
            created_at=NOW.timestamp(),  # epoch seconds are accepted too
            outcome=RoutingOutcome.OK,  # the gateway's own values: choices, not plain strings
        )
    )
    await shipper.aclose()

    assert await sync_to_async(stream.drain)() == 1

    record = await RoutingRecord.objects.aget()
    assert (record.target_id, record.target_name, record.token_id) == (target.pk, "gpu-1", 42)
    assert (record.attempts, record.decision) == (attempts, DECISION)
    assert (record.queue_wait_ms, record.ttft_ms, record.stream) == (3.0, 80.5, True)
    assert (record.created_at, record.outcome) == (NOW, "ok")
    assert stream.entries() == 1  # acknowledged, not deleted: MAXLEN bounds the stream


async def test_while_redis_is_away_the_oldest_records_beyond_the_bound_are_dropped_and_counted(
    tmp_path: Path,
) -> None:  # fmt: skip
    # Given a shipper whose Redis does not answer (nothing listens on the socket)
    shipper = HistoryShipper(
        f"unix://{tmp_path / 'no-redis.sock'}", "test-away", max_buffered=5, ship_interval_s=0.01
    )
    dropped_before = metrics.HISTORY_DROPPED.labels("buffer_full")._value.get()
    pool = Pool(pk=1, slug="chat")

    # when eight records come
    for number in range(8):
        shipper.record(row(pool, number))
    await asyncio.sleep(0.1)  # a few failed attempts

    # then the newest five wait, and the three oldest are counted as dropped
    assert [int(r.request_id, 16) for r in shipper._buffer] == [3, 4, 5, 6, 7]
    assert shipper.dropped == {"buffer_full": 3}
    assert metrics.HISTORY_DROPPED.labels("buffer_full")._value.get() - dropped_before == 3
    shipper._buffer.clear()
    await shipper.aclose()


@writer_test
async def test_a_shutdown_while_redis_is_away_writes_the_records_to_the_database_directly(
    pool: Pool, tmp_path: Path
) -> None:
    shipper = HistoryShipper(f"unix://{tmp_path / 'no-redis.sock'}", "test-away")
    for number in range(150):
        shipper.record(row(pool, number, token_id=7))

    await shipper.aclose()

    assert (shipper.shipped, shipper.written, shipper.dropped) == (0, 150, {})
    assert await stored() == 150
    usage = await TokenUsage.objects.aget(token_id=7)
    assert usage.requests == 150


def test_a_packed_record_explains_itself_as_the_gateways_record_would() -> None:
    latest = Decision(None, None, (), (Skipped(4, "b", SkipReason.FULL),), False, "none")
    first = Decision(
        3, 1, (Ranked(3, "a", 0.25, (Factor("utilization", 0.5, "1/2"),)),), (), False, "kept"
    )
    facts = DecisionFacts(latest, (first, latest), "chat", 3, None, "POST", "/serve/x", "turn")
    record = row(Pool(pk=1, slug="chat"), 1, decision=facts, outcome=RoutingOutcome.NO_TARGET)

    [back] = decode_batch(encode_batch([record]))

    assert isinstance(back.decision, DecisionFacts)
    assert back.decision.explain() == facts.explain()
    assert back._replace(decision=None, created_at=NOW) == record._replace(
        decision=None, attempts=[]
    )


def test_every_field_of_a_decision_survives_the_stream() -> None:
    """A field added to Decision (or its parts) and not packed fails here, not in a history."""
    wait = StickyWait(3, "a", 4, "b", 0.15, 0.42, 0.21)
    decision = Decision(
        3,
        2,
        (Ranked(3, "a", 0.25, (Factor("utilization", 0.5, "1/2"),)),),
        (Skipped(4, "b", SkipReason.FULL, "8 of 8"),),
        True,
        "waited 180 ms for sticky target a",
        5,
        wait,
    )
    defaults = Decision(None, None, (), (), False, "")
    unset = [
        field.name
        for field in fields(Decision)
        if getattr(decision, field.name) == getattr(defaults, field.name)
    ]
    assert unset == [], f"give {unset} a value here, so that packing them is tested"
    facts = DecisionFacts(decision, (decision,), "chat", 3, None)
    record = row(Pool(pk=1, slug="chat"), 1, decision=facts)

    [back] = decode_batch(encode_batch([record]))

    assert isinstance(back.decision, DecisionFacts)
    assert back.decision.latest == decision
    assert back.decision.explain()["sticky_wait"] == wait.to_dict()


def test_a_stream_entry_that_would_run_code_is_refused() -> None:
    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return (print, ("ran",))

    with pytest.raises(ValueError, match="not a history batch"):
        decode_batch(pickle.dumps((1, [Evil()]), protocol=5))


# Writing (the writer's side) ----------------------------------------------------------------


@writer_test
async def test_the_writer_writes_each_batch_once_and_acknowledges_it(
    pool: Pool, stream: Stream
) -> None:
    shipper = stream.shipper()
    for number in range(250):
        shipper.record(row(pool, number))
    await shipper.aclose()

    assert await sync_to_async(stream.drain)() == 3
    assert await sync_to_async(stream.drain)() == 0

    assert await stored() == 250
    assert stream.client.xpending(stream_key(stream.prefix), GROUP)["pending"] == 0


@writer_test
async def test_a_database_failure_leaves_the_batch_on_the_stream_until_it_is_written(
    pool: Pool, stream: Stream, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipper = stream.shipper()
    shipper.record(row(pool, 1))
    await shipper.aclose()
    calls = []

    def failing(records: list[HistoryRecord], **options: Any) -> int:
        calls.append(len(records))
        raise OperationalError("the database went away")

    writer = stream.writer()
    monkeypatch.setattr(history_writer, "write_rows", failing)
    with pytest.raises(OperationalError):
        await sync_to_async(writer.step)()
    monkeypatch.setattr(history_writer, "write_rows", history.write_rows)

    assert await sync_to_async(writer.step)() == 1  # its own pending entry, again

    assert (calls, await stored(), writer.dropped) == ([1], 1, {})


@writer_test
async def test_a_dead_writers_batches_are_taken_over_by_another(pool: Pool, stream: Stream) -> None:
    shipper = stream.shipper()
    for number in range(3):
        shipper.record(row(pool, number))
    await shipper.aclose()
    # A writer read the batch and died before writing it.
    stream.client.xgroup_create(stream_key(stream.prefix), GROUP, id="0", mkstream=True)
    stream.client.xreadgroup(GROUP, "dead", {stream_key(stream.prefix): ">"}, count=10)

    other = stream.writer("writer-2", claim_idle_ms=0)
    handled = await sync_to_async(other.drain)()

    assert (handled, await stored()) == (1, 3)
    assert stream.client.xpending(stream_key(stream.prefix), GROUP)["pending"] == 0


@writer_test
async def test_a_batch_written_before_its_writer_died_is_not_counted_twice(
    pool: Pool, stream: Stream
) -> None:
    shipper = stream.shipper()
    for number in range(3):
        shipper.record(row(pool, number, token_id=7))
    await shipper.aclose()
    # A writer read the batch, committed it, and died before acknowledging it.
    key = stream_key(stream.prefix)
    stream.client.xgroup_create(key, GROUP, id="0", mkstream=True)
    [[_, [(_, fields)]]] = stream.client.xreadgroup(GROUP, "writer-1", {key: ">"}, count=10)
    await sync_to_async(history.write_rows)(decode_batch(fields[b"r"]))

    handled = await sync_to_async(stream.writer("writer-1").drain)()  # restarted, same name

    assert (handled, await stored()) == (1, 3)
    assert (await TokenUsage.objects.aget(token_id=7)).requests == 3
    assert stream.client.xpending(key, GROUP)["pending"] == 0


@writer_test
async def test_an_entry_that_is_not_a_batch_is_dropped_and_counted(
    pool: Pool, stream: Stream
) -> None:
    stream.client.xadd(stream_key(stream.prefix), {"r": b"not a pickle"})
    shipper = stream.shipper()
    shipper.record(row(pool, 1))
    await shipper.aclose()

    writer = stream.writer()
    await sync_to_async(writer.drain)()

    assert (await stored(), writer.dropped) == (1, {"malformed": 1})
    # The writer serves no /metrics: the web process's reports what it counted in Redis.
    with override_settings(NEXUS_REDIS_PREFIX=stream.prefix, NEXUS_METRICS_PUBLIC=True):
        scraped = await sync_to_async(Client().get)("/metrics")
    assert scraped.status_code == 200
    assert 'nexus_history_writer_dropped_rows_total{cause="malformed"} 1.0' in (
        scraped.content.decode()
    )


@writer_test
async def test_a_deleted_target_is_kept_by_name(pool: Pool, stream: Stream) -> None:
    target = await sync_to_async(make_target)(pool, "gpu-1")
    shipper = stream.shipper()
    shipper.record(row(pool, 1, target_id=target.pk, target_name="gpu-1"))
    await shipper.aclose()
    await target.adelete()

    await sync_to_async(stream.drain)()

    record = await RoutingRecord.objects.aget()
    assert (record.target_id, record.target_name) == (None, "gpu-1")


@writer_test
async def test_records_of_a_deleted_pool_are_not_written(pool: Pool, stream: Stream) -> None:
    other = await sync_to_async(make_pool)("other")
    shipper = stream.shipper()
    shipper.record(row(pool, 1))
    shipper.record(row(other, 2))
    await shipper.aclose()
    await other.adelete()

    writer = stream.writer()
    await sync_to_async(writer.drain)()

    assert [r.request_id async for r in RoutingRecord.objects.all()] == [f"{1:032x}"]
    assert writer.dropped == {}


@writer_test
async def test_a_batch_written_twice_stores_each_request_once(pool: Pool) -> None:
    rows = [row(pool, 1), row(pool, 2)]
    await sync_to_async(history.write_rows)(rows)

    await sync_to_async(history.write_rows)(rows)

    assert await stored() == 2


@pytest.mark.django_db
def test_a_batch_is_written_without_looking_up_its_pools_and_targets() -> None:
    pool = make_pool("chat")
    target = make_target(pool, "gpu-1")
    records = [row(pool, n, target_id=target.pk, target_name="gpu-1", token_id=7) for n in (1, 2)]

    with CaptureQueriesContext(connection) as queries:
        history.write_rows(records)

    selects = [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith("SELECT")]
    assert selects == []
    assert RoutingRecord.objects.filter(target=target).count() == 2


@pytest.mark.django_db
def test_the_writer_explains_the_gateways_decisions_from_the_decision_objects() -> None:
    pool = make_pool("chat")
    latest = Decision(None, None, (), (), all_full=False, continuity="none")
    first = Decision(3, 1, (), (), all_full=False, continuity="kept")
    facts = DecisionFacts(latest, (first,), "chat", 3, None, "POST", "/serve/app/x")

    history.write_rows([row(pool, 1, decision=facts)])

    decision = RoutingRecord.objects.get().decision
    assert decision["target_id"] is None
    assert [each["target_id"] for each in decision["per_attempt"]] == [3]
    assert decision["request"] == {
        "kind": "chat", "sticky_target_id": 3, "prefix_target_id": None,
        "method": "POST", "path": "/serve/app/x",
    }  # fmt: skip


# The API ------------------------------------------------------------------------------------


@pytest.fixture
def two_pools() -> tuple[Pool, Pool]:
    """Pool chat with targets a and b, pool code with target c, and five requests between them."""
    chat, code = make_pool("chat"), make_pool("code")
    a, b, c = make_target(chat, "a"), make_target(chat, "b"), make_target(code, "c")
    make_record(chat, 1, target=a, target_name="a", token_id=10, created_at=NOW)
    make_record(
        chat,
        2,
        target=b,
        target_name="b",
        token_id=11,
        outcome="upstream_error",
        status_code=502,
        failure_reason="Target 'b' could not be reached.",
        created_at=NOW + timedelta(minutes=1),
    )
    make_record(chat, 3, target=a, target_name="a", token_id=10, created_at=NOW + timedelta(2))
    make_record(
        chat,
        4,
        outcome="queue_full",
        status_code=429,
        token_id=11,
        created_at=NOW + timedelta(minutes=3),
    )
    make_record(code, 5, target=c, target_name="c", token_id=10, created_at=NOW + timedelta(1))
    return chat, code


def listed(client: APIClient, query: str = "") -> list[int]:
    """Return the request numbers the history list answers with, in its order."""
    response = client.get(f"/api/v1/history/{query}")
    assert response.status_code == 200, response.json()
    return [int(record["request_id"], 16) for record in response.json()["results"]]


@pytest.mark.django_db
def test_the_history_lists_the_newest_request_first(
    teammate: APIClient, two_pools: tuple[Pool, Pool]
) -> None:
    assert listed(teammate) == [3, 5, 4, 2, 1]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "numbers"),
    [
        ("?pool=chat", [3, 4, 2, 1]),
        ("?pool=code", [5]),
        ("?outcome=upstream_error", [2]),
        ("?token=11", [4, 2]),
        ("?pool=chat&token=10", [3, 1]),
        ("?since=2026-06-01T12:01:00Z", [3, 5, 4, 2]),
        ("?until=2026-06-01T12:03:00Z", [2, 1]),
        ("?since=2026-06-01T12:01:00Z&until=2026-06-02T00:00:00%2B00:00", [4, 2]),
        ("?pool=nope", []),
    ],
)
def test_the_history_filters_by_pool_outcome_token_and_time(
    teammate: APIClient, two_pools: tuple[Pool, Pool], query: str, numbers: list[int]
) -> None:
    assert listed(teammate, query) == numbers


@pytest.mark.django_db
def test_the_history_filters_by_target(teammate: APIClient, two_pools: tuple[Pool, Pool]) -> None:
    a = Target.objects.get(name="a")

    assert listed(teammate, f"?target={a.pk}") == [3, 1]


@pytest.mark.django_db
def test_the_history_filters_retried_and_queued_requests_by_kind(teammate: APIClient) -> None:
    pool = make_pool("chat")
    make_record(pool, 1, attempts=[{}, {}], attempt_count=2, queue_wait_ms=10.0)
    make_record(pool, 2, attempt_count=1, queue_wait_ms=900.0)
    make_record(pool, 3, kind="embeddings", attempt_count=1)

    assert listed(teammate, "?min_attempts=2") == [1]
    assert listed(teammate, "?queued_over_ms=500") == [2]
    assert listed(teammate, "?kind=embeddings") == [3]
    record = teammate.get(f"/api/v1/history/{1:032x}/").json()
    assert record["attempt_count"] == 2


@pytest.mark.django_db
def test_the_history_refuses_filters_it_cannot_read(teammate: APIClient) -> None:
    response = teammate.get("/api/v1/history/?outcome=fine&since=yesterday&token=me")

    assert response.status_code == 400
    assert set(response.json()) == {"outcome", "since", "token"}


@pytest.mark.django_db
def test_the_history_is_paginated(teammate: APIClient, two_pools: tuple[Pool, Pool]) -> None:
    page = teammate.get("/api/v1/history/?limit=2&offset=2").json()

    assert page["count"] == 5
    assert [int(r["request_id"], 16) for r in page["results"]] == [4, 2]


@pytest.mark.django_db
def test_a_listed_request_says_where_it_went_without_the_explanation(
    teammate: APIClient, two_pools: tuple[Pool, Pool]
) -> None:
    [record] = teammate.get("/api/v1/history/?outcome=upstream_error").json()["results"]

    assert record["pool"] == "chat"
    assert record["target_name"] == "b"
    assert record["status_code"] == 502
    assert record["failure_reason"] == "Target 'b' could not be reached."
    assert "decision" not in record


@pytest.mark.django_db
def test_one_request_is_looked_up_by_its_id_with_the_full_decision(teammate: APIClient) -> None:
    make_record(make_pool("chat"), 7, decision=DECISION, ttft_ms=41.0)

    response = teammate.get(f"/api/v1/history/{7:032x}/")

    assert response.status_code == 200
    assert response.json()["decision"] == DECISION
    assert response.json()["ttft_ms"] == 41.0
    assert teammate.get(f"/api/v1/history/{8:032x}/").status_code == 404


@pytest.mark.django_db
def test_a_member_sees_only_their_projects_history(two_pools: tuple[Pool, Pool]) -> None:
    chat, code = two_pools
    code.project = Project.objects.create(name="code")
    code.save()
    member = make_user("coder")
    add_member(code.project, member, Role.VIEWER)
    client = signed_in(member)

    assert listed(client) == [5]
    assert client.get(f"/api/v1/history/{1:032x}/").status_code == 404


@pytest.mark.django_db
def test_nobody_changes_the_history_through_the_api(
    owner: APIClient, two_pools: tuple[Pool, Pool]
) -> None:
    assert owner.post("/api/v1/history/", {}, format="json").status_code == 405
    assert owner.delete(f"/api/v1/history/{1:032x}/").status_code == 405
    assert RoutingRecord.objects.count() == 5


@pytest.mark.django_db
def test_an_outsider_reads_no_history() -> None:
    assert APIClient().get("/api/v1/history/").status_code == 401


# Retention ----------------------------------------------------------------------------------


def ages(pool: Pool) -> list[int]:
    """Return the pool's remaining request numbers, newest first."""
    return [int(r.request_id, 16) for r in RoutingRecord.objects.filter(pool=pool)]


@pytest.mark.django_db
def test_records_older_than_their_pools_retention_are_deleted() -> None:
    week, month = make_pool("week", history_retention_days=7), make_pool("month")
    month.history_retention_days = 30
    month.save()
    for pool, offset in ((week, 0), (month, 10)):
        make_record(pool, offset + 1, created_at=NOW - timedelta(days=6))
        make_record(pool, offset + 2, created_at=NOW - timedelta(days=8))
        make_record(pool, offset + 3, created_at=NOW - timedelta(days=31))

    result = history_retention.prune_history(now=NOW)

    assert (ages(week), ages(month)) == ([1], [11, 12])
    assert (result.by_age, result.by_rows) == (3, 0)


@pytest.mark.django_db
def test_only_the_newest_rows_up_to_the_pools_limit_are_kept() -> None:
    small, large = make_pool("small", history_max_rows=3), make_pool("large")
    for number in range(1, 6):
        make_record(small, number, created_at=NOW - timedelta(minutes=number))
        make_record(large, 10 + number, created_at=NOW - timedelta(minutes=number))

    result = history_retention.prune_history(now=NOW)

    assert ages(small) == [1, 2, 3]
    assert ages(large) == [11, 12, 13, 14, 15]
    assert (result.by_age, result.by_rows) == (0, 2)


@pytest.mark.django_db
def test_the_row_limit_is_exact_when_requests_share_a_timestamp() -> None:
    pool = make_pool("busy", history_max_rows=2)
    for number in range(1, 5):
        make_record(pool, number, created_at=NOW)

    history_retention.prune_history(now=NOW)

    assert ages(pool) == [4, 3]


@pytest.mark.django_db
def test_a_large_prune_deletes_in_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(history_retention, "DELETE_BATCH", 2)
    pool = make_pool("old", history_retention_days=1)
    for number in range(1, 6):
        make_record(pool, number, created_at=NOW - timedelta(days=2))

    result = history_retention.prune_history(now=NOW)

    assert (result.by_age, ages(pool)) == (5, [])


@pytest.mark.django_db
def test_the_prune_task_reports_what_it_deleted() -> None:
    pool = make_pool("old", history_retention_days=1, history_max_rows=1)
    now = timezone.now()
    make_record(pool, 1, created_at=now - timedelta(days=2))
    make_record(pool, 2, created_at=now - timedelta(minutes=2))
    make_record(pool, 3, created_at=now - timedelta(minutes=1))

    assert tasks.prune_history() == "deleted 1 by age, 1 beyond the row limit"
    assert ages(pool) == [3]


def test_beat_prunes_the_history_every_five_minutes() -> None:
    row = settings.CELERY_BEAT_SCHEDULE["pools-prune-history"]

    assert row["task"] == "pools.tasks.prune_history"
    assert row["schedule"] == 300.0
    assert 0 < row["options"]["expires"] < row["schedule"]


@pytest.mark.django_db
def test_deleting_a_target_keeps_its_history_by_name() -> None:
    pool = make_pool("chat")
    target = make_target(pool, "gpu-1")
    make_record(pool, 1, target=target, target_name="gpu-1")

    target.delete()

    record = RoutingRecord.objects.get()
    assert (record.target, record.target_name) == (None, "gpu-1")


def test_every_outcome_the_design_names_exists() -> None:
    assert set(RoutingOutcome.values) == {
        "ok",
        "client_error",
        "upstream_error",
        "queue_full",
        "queue_timeout",
        "no_target",
        "interrupted",
        "client_gone",
        "rate_limited",  # a token over one of its limits (docs/access.md)
    }


@pytest.mark.django_db
def test_the_django_admin_shows_the_history_read_only(two_pools: tuple[Pool, Pool]) -> None:
    client = Client()
    client.force_login(make_user("root", superuser=True))
    record = RoutingRecord.objects.get(request_id=f"{2:032x}")

    listing = client.get("/admin/pools/routingrecord/")
    detail = client.get(f"/admin/pools/routingrecord/{record.pk}/change/")

    assert listing.status_code == 200
    assert f"{2:032x}" in listing.content.decode()
    assert detail.status_code == 200
    assert 'name="_save"' not in detail.content.decode()
    assert client.get("/admin/pools/routingrecord/add/").status_code == 403
    assert client.get(f"/admin/pools/routingrecord/{record.pk}/delete/").status_code == 403


class StuckPublisher(Publisher):
    """A publisher whose close does not end until released, deaf to cancelling too, as a close
    stuck on a dead connection can be."""

    released: asyncio.Event

    async def aclose(self) -> None:
        self.released = asyncio.Event()
        while not self.released.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await self.released.wait()


async def test_a_part_stuck_at_shutdown_does_not_keep_the_history_from_being_shipped(
    stream: Stream, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a gateway with a routing record to ship and a publisher whose close hangs
    monkeypatch.setattr(graceful, "PART_STOP_S", 0.3)
    shipper = stream.shipper(ship_interval_s=3600)
    publisher = StuckPublisher(settings.REDIS_URL, "test-stuck")
    state = GatewayState(MemoryLedger(), shipper, publisher=publisher)
    shipper.record(row(Pool(pk=1, slug="chat"), 1))

    # when it stops
    started = time.monotonic()
    await asyncio.wait_for(state.aclose(), 5)

    # then the record is shipped, the stuck part is left after its bound, and the log says
    # where it waited
    assert (shipper.shipped, stream.entries()) == (1, 1)
    assert time.monotonic() - started < 2
    [stuck] = [r.getMessage() for r in caplog.records if "still running" in r.getMessage()]
    assert stuck.startswith("live-state publisher still running after 0.3 s, waiting at:")
    assert "in StuckPublisher.aclose" in stuck
    publisher.released.set()  # its task ends, as the process would
    await asyncio.sleep(0)
