"""Bound each pool's routing history by age and by row count."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Q, QuerySet
from django.utils import timezone

from pools.models import Pool, RoutingRecord

# Rows deleted per statement: short transactions, so that the gateway's batched inserts (and on
# SQLite every other writer) never wait long behind a large prune.
DELETE_BATCH = 5_000


@dataclass(frozen=True)
class PruneResult:
    """How many routing records a prune deleted."""

    by_age: int
    by_rows: int

    def __str__(self) -> str:
        return f"deleted {self.by_age} by age, {self.by_rows} beyond the row limit"


def prune_history(now: datetime | None = None) -> PruneResult:
    """Delete records older than each pool's retention days and beyond its max rows (oldest)."""
    now = now or timezone.now()
    by_age = by_rows = 0
    for pool in Pool.objects.only("pk", "history_retention_days", "history_max_rows"):
        records = RoutingRecord.objects.filter(pool=pool)
        cutoff = now - timedelta(days=pool.history_retention_days)
        by_age += _delete_in_batches(records.filter(created_at__lt=cutoff))
        # The newest row beyond the limit, in the history's own order; it and all older go.
        limit = pool.history_max_rows
        first_extra = list(
            records.order_by("-created_at", "-id").values_list("created_at", "id")[
                limit : limit + 1
            ]
        )
        if first_extra:
            [(created_at, pk)] = first_extra
            older = Q(created_at__lt=created_at) | Q(created_at=created_at, id__lte=pk)
            by_rows += _delete_in_batches(records.filter(older))
    return PruneResult(by_age=by_age, by_rows=by_rows)


def _delete_in_batches(records: QuerySet[RoutingRecord]) -> int:
    deleted = 0
    while True:
        ids = list(records.values_list("pk", flat=True)[:DELETE_BATCH])
        if not ids:
            return deleted
        count, _ = RoutingRecord.objects.filter(pk__in=ids).delete()
        deleted += count
