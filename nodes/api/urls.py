"""Admin API routes of nodes, mounted under /api/v1/."""

from __future__ import annotations

from rest_framework.routers import DefaultRouter

from nodes.api import views

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("nodes", views.NodeViewSet, basename="node")

urlpatterns = router.urls
