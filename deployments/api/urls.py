"""Admin API routes of deployments, mounted under /api/v1/."""

from __future__ import annotations

urlpatterns: list = []
