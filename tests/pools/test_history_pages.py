"""The History pages: the list filtered and paged by keyset, one request's decisions per attempt,
Replay, and nothing outside the user's projects."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client

from nexus.models import Project
from pools.history_pages import Cursor, attempt_views, page_of
from pools.models import Pool, RoutingRecord, Target
from tests.nexus.factories import make_pool, make_target, make_user
from tests.support.personas import default_viewer

pytestmark = pytest.mark.django_db

START = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def decision(chosen: Target, *others: Target, skipped: tuple[Target, ...] = ()) -> dict[str, Any]:
    """Return a decision as the gateway keeps it: the chosen target ranked first."""
    ranked = [chosen, *others]
    return {
        "target_id": chosen.pk,
        "tier": 1,
        "all_full": False,
        "continuity": "none",
        "ranking": [
            {
                "target_id": t.pk,
                "name": t.name,
                "score": 0.25 * (place + 1),
                "factors": [{"name": "utilization", "value": 0.125 * (place + 1), "note": ""}],
            }
            for place, t in enumerate(ranked)
        ],
        "skipped": [
            {"target_id": t.pk, "name": t.name, "reason": "already tried", "detail": ""}
            for t in skipped
        ],
    }


def record(pool: Pool, number: int, target: Target | None = None, **fields: Any) -> RoutingRecord:
    defaults: dict[str, Any] = {
        "request_id": f"{pool.slug[:4]}{number:028x}",
        "kind": "chat",
        "outcome": "ok",
        "target_name": target.name if target else "",
        "created_at": START + timedelta(seconds=number),
        "attempts": [],
    }
    return RoutingRecord.objects.create(pool=pool, target=target, **{**defaults, **fields})


@pytest.fixture
def teammate() -> Client:
    client = Client()
    client.force_login(default_viewer("teammate"))
    return client


def rows_of(html: str) -> list[str]:
    return [part.split('"')[0] for part in html.split('data-request-id="')[1:]]


def test_the_list_shows_the_newest_requests_first_with_their_columns(teammate: Client) -> None:
    pool = make_pool("chat")
    gpu = make_target(pool, "gpu-a")
    record(pool, 1, gpu, token_name="support-bot", queue_wait_ms=1500.0, ttft_ms=38.0,
           total_ms=2100.0, attempt_count=2)  # fmt: skip
    newest = record(pool, 2, gpu)

    html = teammate.get("/history/").content.decode()

    assert rows_of(html) == [newest.request_id, f"chat{1:028x}"]
    assert "support-bot" in html and "1.5 s" in html and "38 ms" in html and "2.1 s" in html
    assert f'href="/history/{newest.request_id}/"' in html


def test_the_filters_narrow_by_target_outcome_token_retries_and_queue_wait(
    teammate: Client,
) -> None:
    pool = make_pool("chat")
    a, b = make_target(pool, "a"), make_target(pool, "b")
    plain = record(pool, 1, a)
    failed = record(pool, 2, a, outcome="upstream_error")
    other = record(pool, 3, b, token_name="bot")
    retried = record(pool, 4, b, attempt_count=2)
    queued = record(pool, 5, a, queue_wait_ms=900.0)

    def shown(query: str) -> set[str]:
        return set(rows_of(teammate.get(f"/history/?{query}").content.decode()))

    assert shown(f"target={a.pk}&outcome=ok") == {plain.request_id, queued.request_id}
    assert shown("outcome=upstream_error") == {failed.request_id}
    assert shown("token=bot") == {other.request_id}
    assert shown("retried=on") == {retried.request_id}
    assert shown("queued_over_ms=500") == {queued.request_id}
    assert shown(f"request_id={other.request_id}") == {other.request_id}
    assert shown("since=2026-06-01T12:00:04&until=2026-06-01T12:00:05") == {retried.request_id}


def test_keyset_pages_walk_the_whole_history_once_in_both_directions() -> None:
    pool = make_pool("chat")
    made = [record(pool, n) for n in range(7)]
    # Two rows share a time: the id breaks the tie.
    RoutingRecord.objects.filter(pk=made[3].pk).update(created_at=made[4].created_at)
    records = RoutingRecord.objects.filter(pool=pool)

    first = page_of(records, size=3)
    second = page_of(records, after=first.older or "", number=2, size=3)
    third = page_of(records, after=second.older or "", number=3, size=3)
    back = page_of(records, before=third.newer or "", number=2, size=3)

    seen = [r.request_id for p in (first, second, third) for r in p.records]
    assert seen == [r.request_id for r in records.order_by("-created_at", "-id")]
    assert (first.newer, third.older) == (None, None)
    assert [r.pk for r in back.records] == [r.pk for r in second.records]
    assert Cursor.decode(Cursor.of(made[3]).encode()) == Cursor.of(made[3])
    assert Cursor.decode("12-x") is None


def test_the_detail_shows_the_factors_of_each_attempt_of_a_retried_request(
    teammate: Client,
) -> None:
    pool = make_pool("chat")
    first, second = make_target(pool, "first"), make_target(pool, "second")
    attempts = [
        {"target_id": first.pk, "target_name": "first", "phase": "connect", "status": None,
         "retried": True, "reason": "retried: not delivered"},
        {"target_id": second.pk, "target_name": "second", "phase": "ok", "status": 200,
         "retried": False, "reason": "ok"},
    ]  # fmt: skip
    final = decision(second, skipped=(first,))
    final["per_attempt"] = [decision(first, second), decision(second, skipped=(first,))]
    retried = record(pool, 1, second, attempts=attempts, attempt_count=2, decision=final)

    html = teammate.get(f"/history/{retried.request_id}/").content.decode()

    one, two = html.split('id="attempt-1"')[1].split('id="attempt-2"')
    assert 'data-candidate="first"' in one and 'data-candidate="second"' in one
    assert 'data-factor="utilization"' in one and "retried: not delivered" in one
    assert "first: already tried" in two and 'data-candidate="second"' in two
    assert [view.decision["target_id"] for view in attempt_views(retried)] == [
        first.pk, second.pk
    ]  # fmt: skip


def test_a_record_of_one_attempt_shows_its_one_decision() -> None:
    pool = make_pool("chat")
    gpu = make_target(pool, "gpu")
    attempts = [{"target_id": gpu.pk, "target_name": "gpu", "phase": "ok", "status": 200,
                 "retried": False, "reason": "ok"}]  # fmt: skip
    one = record(pool, 1, gpu, attempts=attempts, attempt_count=1, decision=decision(gpu))

    assert [view.decision for view in attempt_views(one)] == [one.decision]


def test_replay_shows_then_and_now_side_by_side(teammate: Client) -> None:
    pool = make_pool("chat")
    gone, gpu = make_target(pool, "old"), make_target(pool, "gpu")
    past = record(pool, 1, gone, decision=decision(gone, gpu))
    Target.objects.filter(pk=gone.pk).update(enabled=False)

    html = teammate.get(f"/history/{past.request_id}/?replay=1", HTTP_HX_REQUEST="true")
    text = html.content.decode()

    assert text.lstrip().startswith('<section class="card" id="replay">')
    then, now = text.split('class="replay-then"')[1].split('class="replay-now"')
    assert 'data-candidate="old"' in then
    assert 'data-candidate="gpu"' in now and "old: disabled" in now
    assert "Today it would go elsewhere" in text


def test_replay_of_a_retried_request_compares_its_first_ranking(teammate: Client) -> None:
    pool = make_pool("chat")
    first, second = make_target(pool, "first"), make_target(pool, "second")
    final = decision(second, skipped=(first,))
    final["per_attempt"] = [decision(first, second), decision(second, skipped=(first,))]
    retried = record(pool, 1, second, attempt_count=2, decision=final)

    text = teammate.get(f"/history/{retried.request_id}/?replay=1").content.decode()

    then = text.split('class="replay-then"')[1].split('class="replay-now"')[0]
    assert "Then (first attempt)" in then
    assert "already tried" not in then
    assert 'data-candidate="first"' in then


def test_an_outsider_sees_no_history_of_other_projects() -> None:
    pool = make_pool("chat")
    hidden = record(pool, 1)
    outsider = Client()
    outsider.force_login(make_user("outsider"))
    Project.objects.get_or_create(name="elsewhere")

    assert rows_of(outsider.get("/history/").content.decode()) == []
    assert outsider.get(f"/history/{hidden.request_id}/").status_code == 404
