"""Background work of the Smart Balancer: periodic pruning, operators' traffic runs."""

from __future__ import annotations

from celery import shared_task

from pools import history_retention
from pools import services as traffic_runs


@shared_task(ignore_result=True)
def prune_history() -> str:
    """Bound every pool's routing history; a duplicate run deletes nothing more."""
    return str(history_retention.prune_history())


@shared_task(ignore_result=True)
def run_traffic(run_id: int) -> str:
    """Run a queued Try traffic or failure drill; a duplicate delivery finds it claimed."""
    return traffic_runs.run_claimed(run_id)
