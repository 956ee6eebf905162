"""Admin API routes for shared objects, mounted under /api/v1/."""

from __future__ import annotations

from rest_framework.routers import DefaultRouter

from nexus.api import views

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("tokens", views.ApiTokenViewSet, basename="token")
router.register("projects", views.ProjectViewSet, basename="project")
router.register(
    r"projects/(?P<project_name>[-a-zA-Z0-9_]+)/members",
    views.MembershipViewSet,
    basename="project-member",
)

urlpatterns = router.urls
