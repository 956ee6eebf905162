"""Deployment work for the Celery worker: one task per node's part, and its resume."""

from __future__ import annotations

from datetime import datetime

from celery import shared_task

from deployments import services


@shared_task(ignore_result=True)
def run_deployment_node(deployment_node_id: int) -> str:
    """Run one node's deploy job to its end; a gone or already claimed row is a quiet no-op."""
    return services.run_node(deployment_node_id)


@shared_task(ignore_result=True)
def resume_deployment_node(deployment_node_id: int, claimed_at: str) -> str:
    """Follow a stalled node's part again; a row touched since its claim is a quiet no-op."""
    return services.resume_node(deployment_node_id, datetime.fromisoformat(claimed_at))


@shared_task(ignore_result=True)
def resume_stalled() -> str:
    """Queue the resume of every running node part whose worker stopped following it."""
    return f"{services.resume_stalled()} resumed"
