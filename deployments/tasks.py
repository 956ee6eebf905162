"""Deployment work for the Celery worker: one task per node's part."""

from __future__ import annotations

from celery import shared_task

from deployments import services


@shared_task(ignore_result=True)
def run_deployment_node(deployment_node_id: int) -> str:
    """Run one node's deploy job to its end; a gone or already claimed row is a quiet no-op."""
    return services.run_node(deployment_node_id)
