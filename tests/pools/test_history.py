"""Routing history: written in batches off the request path, read through the API, kept bounded."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import OperationalError, connections
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from nexus.models import Project, Role
from pools import history_retention, tasks
from pools.gateway import history, metrics
from pools.gateway.history import HistoryRow, HistoryWriter
from pools.models import Pool, RoutingOutcome, RoutingRecord, Target
from tests.nexus.factories import make_pool, make_target, make_user
from tests.support.personas import add_member, signed_in

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
DECISION = {
    "strategy": "smart",
    "ranking": [{"target_id": 1, "score": 0.4, "factors": {"utilization": 0.25}}],
    "skipped": [{"target_id": 2, "reason": "full"}],
    "continuity": "none",
}


def row(pool: Pool, number: int, **fields: Any) -> HistoryRow:
    """Return what the gateway would record for its request number `number`."""
    return {
        "request_id": f"{number:032x}",
        "pool_id": pool.pk,
        "kind": "chat",
        "outcome": "ok",
        "status_code": 200,
        "created_at": NOW,
        "total_ms": 12.5,
        **fields,
    }  # type: ignore[typeddict-item]


def make_record(pool: Pool, number: int, **fields: Any) -> RoutingRecord:
    return RoutingRecord.objects.create(**{**row(pool, number), **fields})


class WriteSpy:
    """Stand in for history.write_rows, recording each batch and failing the first `fail` calls."""

    def __init__(self, fail: int = 0) -> None:
        self.batches: list[int] = []
        self.fail = fail

    def __call__(self, rows: list[HistoryRow]) -> int:
        self.batches.append(len(rows))
        if len(self.batches) <= self.fail:
            raise OperationalError("database is locked")
        return real_write_rows(rows)


real_write_rows = history.write_rows


async def stored() -> int:
    return await RoutingRecord.objects.acount()


async def wait_for_rows(expected: int, timeout_s: float = 2.0) -> float:
    """Return the seconds it took until `expected` records are stored."""
    start = time.monotonic()
    while await stored() != expected:
        assert time.monotonic() - start < timeout_s, f"{await stored()} rows, not {expected}"
        await asyncio.sleep(0.01)
    return time.monotonic() - start


@pytest.fixture
async def pool() -> AsyncIterator[Pool]:
    yield await sync_to_async(make_pool)("chat")
    # The writer's worker thread keeps its connection; close it so the test database can go.
    await sync_to_async(connections.close_all)()


# The writer writes from a worker thread with its own connection: the rows must be committed.
writer_test = pytest.mark.django_db(transaction=True)


@writer_test
async def test_a_full_batch_is_written_in_one_insert_at_once(
    pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = WriteSpy()
    monkeypatch.setattr(history, "write_rows", spy)
    writer = HistoryWriter(flush_interval_s=60)

    for number in range(100):
        writer.record(row(pool, number))
    await wait_for_rows(100)

    assert spy.batches == [100]
    assert writer.written == 100
    await writer.aclose()


@writer_test
async def test_a_backlog_is_written_in_batches_of_100(
    pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = WriteSpy()
    monkeypatch.setattr(history, "write_rows", spy)
    writer = HistoryWriter(flush_interval_s=60)

    for number in range(250):
        writer.record(row(pool, number))
    await writer.aclose()

    assert spy.batches == [100, 100, 50]
    assert await stored() == 250


@writer_test
async def test_a_few_rows_are_written_by_the_timer_within_half_a_second(pool: Pool) -> None:
    writer = HistoryWriter()

    for number in range(3):
        writer.record(row(pool, number))
    assert writer.pending() == 3  # recording itself writes nothing

    assert await wait_for_rows(3) < 0.5
    await writer.aclose()


@writer_test
async def test_closing_the_writer_writes_what_is_left(pool: Pool) -> None:
    writer = HistoryWriter(flush_interval_s=60)
    for number in range(5):
        writer.record(row(pool, number))

    await writer.aclose()

    assert await stored() == 5
    assert writer.pending() == 0


@writer_test
async def test_a_record_keeps_every_field_the_gateway_gave(pool: Pool) -> None:
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
    writer = HistoryWriter()
    writer.record(
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
        )
    )

    await writer.aclose()

    record = await RoutingRecord.objects.aget()
    assert (record.target_id, record.target_name, record.token_id) == (target.pk, "gpu-1", 42)
    assert (record.attempts, record.decision) == (attempts, DECISION)
    assert (record.queue_wait_ms, record.ttft_ms, record.stream) == (3.0, 80.5, True)
    assert record.created_at == NOW


@writer_test
async def test_a_transient_database_failure_is_retried(
    pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = WriteSpy(fail=1)
    monkeypatch.setattr(history, "write_rows", spy)
    writer = HistoryWriter(retry_delay_s=0.01)
    writer.record(row(pool, 1))

    await writer.aclose()

    assert spy.batches == [1, 1]
    assert (await stored(), writer.dropped) == (1, 0)


@writer_test
async def test_a_failing_database_drops_the_batch_after_the_retries_and_counts_it(
    pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = WriteSpy(fail=100)
    monkeypatch.setattr(history, "write_rows", spy)
    dropped_before = metrics.HISTORY_DROPPED._value.get()
    writer = HistoryWriter(max_write_attempts=3, retry_delay_s=0.01)
    for number in range(4):
        writer.record(row(pool, number))

    await writer.aclose()

    assert spy.batches == [4, 4, 4]
    assert (writer.dropped, writer.pending(), await stored()) == (4, 0, 0)
    assert metrics.HISTORY_DROPPED._value.get() - dropped_before == 4


def test_the_buffer_is_bounded_and_counts_what_it_drops() -> None:
    # No event loop here: nothing is written, so the buffer fills up.
    writer = HistoryWriter(max_buffered=5)
    pool = Pool(pk=1, slug="chat")

    for number in range(8):
        writer.record(row(pool, number))

    assert (writer.pending(), writer.dropped) == (5, 3)


@writer_test
async def test_a_deleted_target_is_kept_by_name(pool: Pool) -> None:
    target = await sync_to_async(make_target)(pool, "gpu-1")
    writer = HistoryWriter(flush_interval_s=60)
    writer.record(row(pool, 1, target_id=target.pk, target_name="gpu-1"))
    await target.adelete()

    await writer.aclose()

    record = await RoutingRecord.objects.aget()
    assert (record.target_id, record.target_name) == (None, "gpu-1")


@writer_test
async def test_records_of_a_deleted_pool_are_not_written(pool: Pool) -> None:
    other = await sync_to_async(make_pool)("other")
    writer = HistoryWriter(flush_interval_s=60)
    writer.record(row(pool, 1))
    writer.record(row(other, 2))
    await other.adelete()

    await writer.aclose()

    assert [r.request_id async for r in RoutingRecord.objects.all()] == [f"{1:032x}"]
    assert writer.dropped == 0


@writer_test
async def test_a_batch_written_twice_stores_each_request_once(pool: Pool) -> None:
    rows = [row(pool, 1), row(pool, 2)]
    await sync_to_async(history.write_rows)(rows)

    await sync_to_async(history.write_rows)(rows)

    assert await stored() == 2


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
