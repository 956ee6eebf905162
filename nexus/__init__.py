"""Nexus: a self-hosted control plane for LLM inference."""

from nexus.celery import app as celery_app

__all__ = ["celery_app"]
