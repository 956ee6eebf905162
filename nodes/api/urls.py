"""Admin API routes of nodes, mounted under /api/v1/."""

from __future__ import annotations

urlpatterns: list = []
