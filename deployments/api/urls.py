"""Admin API routes of deployments, mounted under /api/v1/."""

from __future__ import annotations

from rest_framework.routers import DefaultRouter

from deployments.api import views

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("deployments", views.DeploymentViewSet, basename="deployment")

urlpatterns = router.urls
