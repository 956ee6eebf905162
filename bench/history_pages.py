"""What the History list costs with 100,000 rows in one pool, on PostgreSQL.

Creates a throwaway database on the server DATABASE_URL names (default: the local one), migrates
it, writes 100,000 routing records into one pool over three targets (mostly OK, some errors), and
times the list view's server time (Django's test client: URL resolution, the queries, the
template) for the first page and the 500th page (keyset: the cursor of the row just before
it), filtered by target and outcome, unfiltered, and with the 'was retried' filter. Prints the
median of a few runs of each and EXPLAIN of the filtered 500th page's query, then drops the
database.

Usage: python bench/history_pages.py [--rows 100000] [--runs 7]
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pools.models import Pool, Target

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
from bench.page_database import on_throwaway_database, timed  # noqa: E402

TARGET = "200 ms server time for the first and the 500th page, filtered by target and outcome"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    on_throwaway_database("bench_history", lambda: run(args.rows, args.runs))


def run(rows: int, runs: int) -> None:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext, setup_test_environment

    from pools.history_pages import PAGE_SIZE, Cursor
    from pools.models import RoutingRecord
    from tests.nexus.factories import make_pool, make_target, make_user

    setup_test_environment()
    call_command("migrate", verbosity=0)
    pool = make_pool("bench")
    targets = [make_target(pool, name) for name in ("fast", "medium", "slow")]
    staff = make_user("bench-staff", staff=True)
    started = time.monotonic()
    write(pool, targets, rows)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pools_routingrecord")
    print(f"wrote {rows:,} rows in {time.monotonic() - started:.1f} s")

    client = Client()
    client.force_login(staff)
    fast = targets[0]
    wanted = RoutingRecord.objects.filter(target=fast, outcome="ok").order_by("-created_at", "-id")
    matching = wanted.count()
    # The cursor of the last row of page 499: page 500 starts right after it.
    before_500 = wanted[499 * PAGE_SIZE - 1]
    after = Cursor.of(before_500).encode()
    unfiltered = RoutingRecord.objects.order_by("-created_at", "-id")[499 * PAGE_SIZE - 1]
    cases = {
        "target+outcome, page 1": f"/history/?target={fast.pk}&outcome=ok",
        "target+outcome, page 500": f"/history/?target={fast.pk}&outcome=ok&after={after}&page=500",
        "all, page 1": "/history/",
        "all, page 500": f"/history/?after={Cursor.of(unfiltered).encode()}&page=500",
        "was retried, page 1": "/history/?retried=on",
    }
    print(f"{matching:,} rows match target={fast.name} outcome=ok; {PAGE_SIZE} rows a page")
    print(f"target: {TARGET}")
    for label, url in cases.items():

        def full_page(response: Any, label: str = label) -> None:
            assert response.status_code == 200, response.status_code
            assert response.content.count(b"data-request-id=") == PAGE_SIZE, label

        median, slowest = timed(partial(client.get, url), runs, full_page)
        print(f"  {label:28} median {median:6.1f} ms  max {slowest:6.1f} ms")
    # The view's own queries for the filtered 500th page, and how PostgreSQL runs the page's.
    with CaptureQueriesContext(connection) as captured:
        client.get(cases["target+outcome, page 500"])
    page_query = next(q["sql"] for q in captured.captured_queries if "LIMIT 51" in q["sql"])
    print(f"the view's queries: {len(captured.captured_queries)}")
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN ANALYZE {page_query}")
        print("EXPLAIN ANALYZE of the filtered 500th page:")
        for (line,) in cursor.fetchall():
            print("   ", line)
    # Retention: 5,000 rows past the pool's 100,000-row bound, pruned as the periodic task does.
    from pools.history_retention import prune_history

    write(pool, targets, 5_000, newest=True)
    began = time.perf_counter()
    pruned = prune_history()
    took_ms = (time.perf_counter() - began) * 1000
    left = RoutingRecord.objects.filter(pool=pool).count()
    print(f"retention: {pruned} in {took_ms:.0f} ms; {left:,} rows left in the pool")
    began = time.perf_counter()
    client.get(cases["target+outcome, page 1"])
    took_ms = (time.perf_counter() - began) * 1000
    print(f"  target+outcome, page 1 after the prune: {took_ms:.1f} ms")


def write(pool: Pool, targets: list[Target], rows: int, *, newest: bool = False) -> None:
    from pools.models import RoutingRecord

    # Older than now by one second a row (newest: the last seconds, after the first rows).
    start = datetime.now(UTC) - timedelta(seconds=0 if newest else rows + 10_000)
    batch = []
    for n in range(rows):
        target = targets[n % len(targets)]
        outcome = "upstream_error" if n % 17 == 0 else "ok"
        attempts = 2 if n % 23 == 0 else 1
        batch.append(
            RoutingRecord(
                request_id=uuid.uuid4().hex,
                pool=pool,
                kind="chat",
                target=target,
                target_name=target.name,
                outcome=outcome,
                status_code=200 if outcome == "ok" else 502,
                attempt_count=attempts,
                queue_wait_ms=float(n % 50),
                ttft_ms=40.0 + n % 100,
                total_ms=400.0 + n % 1000,
                created_at=start + timedelta(seconds=n),
                decision={"target_id": target.pk, "ranking": [], "skipped": []},
            )
        )
        if len(batch) == 5000:
            RoutingRecord.objects.bulk_create(batch)
            batch = []
    RoutingRecord.objects.bulk_create(batch)


if __name__ == "__main__":
    main()
