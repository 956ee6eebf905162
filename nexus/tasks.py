"""Periodic housekeeping shared by every app."""

from __future__ import annotations

from celery import shared_task
from celery.signals import worker_ready

from nexus import services


@shared_task(ignore_result=True)
def heartbeat() -> str:
    """Tell /healthz that a worker (and beat) is alive."""
    services.record_worker_heartbeat()
    return "ok"


@worker_ready.connect
def announce_worker(**kwargs: object) -> None:
    """Report the worker alive as soon as it starts, not one beat interval later."""
    services.record_worker_heartbeat()
