"""What the pools list and a pool's page cost with 50 pools, 500 targets and 100,000 history rows.

Creates a throwaway database on the server DATABASE_URL names (default: the local PostgreSQL),
migrates it, creates 50 pools of 10 targets each (every other target on a node) and 100,000
routing records spread over them, then times the server side of each page with Django's test
client (URL resolution, the queries, the template; the live state is read from Redis, where no
gateway published, as on an idle system): the pools list, one pool's page, its live card as the
socket renders it every second, and its dry run. Prints the median and max of a few runs and the
queries of each, then drops the database.

Usage: python bench/pool_pages.py [--runs 9]
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
from bench.page_database import on_throwaway_database, timed  # noqa: E402

TARGET = "300 ms server time for the pools list and a pool's page"
POOLS, TARGETS_PER_POOL, ROWS = 50, 10, 100_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    on_throwaway_database("bench_pools", lambda: run(args.runs))


def run(runs: int) -> None:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext, setup_test_environment

    from nodes.models import Node, NodeStatus, NodeTrust
    from pools import pool_views
    from pools.models import RoutingRecord, Target
    from tests.nexus.factories import make_pool, make_user

    setup_test_environment()
    call_command("migrate", verbosity=0)
    started = time.monotonic()
    nodes = [
        Node.objects.create(
            name=f"node-{n}",
            address=f"http://node-{n}.lan:7100",
            trust=NodeTrust.TRUSTED,
            status=NodeStatus.ONLINE,
        )  # fmt: skip
        for n in range(10)
    ]
    targets = []
    for p in range(POOLS):
        pool = make_pool(f"pool-{p:02}", name=f"Pool {p:02}")
        targets += Target.objects.bulk_create(
            Target(
                pool=pool,
                name=f"t{t}",
                model_id="m",
                node=nodes[t % len(nodes)] if t % 2 else None,
                base_url=f"http://10.0.{p}.{t}:8000/v1",
                priority=1 + t // 5,
                position=t,
            )  # fmt: skip
            for t in range(TARGETS_PER_POOL)
        )
    now = datetime.now(UTC)
    batch = []
    for n in range(ROWS):
        target = targets[n % len(targets)]
        batch.append(
            RoutingRecord(
                request_id=f"r{n:08}",
                pool_id=target.pool_id,
                target=target,
                target_name=target.name,
                kind="chat",
                outcome="ok",
                status_code=200,
                ttft_ms=40.0,
                total_ms=200.0,
                created_at=now - timedelta(seconds=n),
            )  # fmt: skip
        )
        if len(batch) == 5_000:
            RoutingRecord.objects.bulk_create(batch)
            batch = []
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    print(
        f"{POOLS} pools, {len(targets)} targets, {RoutingRecord.objects.count():,} history rows "
        f"in {time.monotonic() - started:.1f} s"
    )
    staff = make_user("bench-staff", staff=True)
    client = Client()
    client.force_login(staff)
    cases = {
        "pools list": lambda: client.get("/pools/"),
        "pool page": lambda: client.get("/pools/pool-25/"),
        "pool live card (a tick)": lambda: pool_views.pool_live("pool-25", can_manage=True),
        "dry run": lambda: client.get("/pools/pool-25/dry-run/?kind=chat"),
    }
    print(f"target: {TARGET}")
    for label, call in cases.items():

        def answered(answer: Any, label: str = label) -> None:
            assert getattr(answer, "status_code", 200) == 200, label

        median, slowest = timed(call, runs, answered)
        with CaptureQueriesContext(connection) as captured:
            call()
        print(
            f"  {label:26} median {median:6.1f} ms  "
            f"max {slowest:6.1f} ms  {len(captured.captured_queries)} queries"
        )


if __name__ == "__main__":
    main()
