"""Periodic housekeeping shared by every app."""

from __future__ import annotations

from celery import shared_task

from nexus import services


@shared_task(ignore_result=True)
def heartbeat() -> str:
    """Tell /healthz that a worker (and beat) is alive."""
    services.record_worker_heartbeat()
    return "ok"
