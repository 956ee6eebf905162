"""Model serving's periodic work for the Celery worker (the beat table is in settings)."""

from __future__ import annotations

from celery import shared_task

from serving import probes, reconciler, scaling, trials


@shared_task(ignore_result=True)
def reconcile() -> dict[str, int]:
    """Run one reconciler tick over every live service; return how many ended how."""
    return reconciler.reconcile_all()


@shared_task(ignore_result=True)
def probe_routes() -> dict[str, int]:
    """Run one health-check tick: probe the routes that are due; return how many changed."""
    return probes.probe_due_routes()


@shared_task(ignore_result=True)
def run_trial(trial_id: int) -> str:
    """Run one Validate trial to its verdict; return its state."""
    return trials.run_trial(trial_id)


@shared_task(ignore_result=True)
def autoscale() -> dict[str, int]:
    """Run one autoscaling cycle over every service with rules; return how many did what."""
    return scaling.autoscale_all()


@shared_task(ignore_result=True)
def wake() -> int:
    """Wake the services scaled to zero that a request waits for; return how many woke."""
    return scaling.wake_sleeping()
