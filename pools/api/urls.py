"""Admin API routes of the Smart Balancer, mounted under /api/v1/."""

from __future__ import annotations

from rest_framework.routers import DefaultRouter

from pools.api import views

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("pools", views.PoolViewSet, basename="pool")
router.register("targets", views.TargetViewSet, basename="target")
router.register("history", views.HistoryViewSet, basename="history")
router.register("usage", views.UsageViewSet, basename="usage")

urlpatterns = router.urls
