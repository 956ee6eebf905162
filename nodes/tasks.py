"""Periodic work of the fleet: keep every trusted node's status and inventory current."""

from __future__ import annotations

from celery import shared_task

from nodes import services


@shared_task(ignore_result=True)
def refresh_nodes() -> str:
    """Refresh every trusted node; a node that does not answer is offline at once."""
    return str(services.refresh_nodes())
