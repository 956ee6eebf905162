"""Periodic work of the Smart Balancer."""

from __future__ import annotations

from celery import shared_task

from pools import history_retention


@shared_task(ignore_result=True)
def prune_history() -> str:
    """Bound every pool's routing history; a duplicate run deletes nothing more."""
    return str(history_retention.prune_history())
