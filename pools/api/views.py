"""Admin API for pools (by slug) and their targets (flat, filtered by `?pool=<slug>`)."""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import viewsets

from pools.api.serializers import PoolSerializer, TargetSerializer, visible_pools
from pools.models import Pool, Target


class PoolViewSet(viewsets.ModelViewSet):
    """Pools, each with its targets embedded; the slug is fixed once created."""

    serializer_class = PoolSerializer
    lookup_field = "slug"

    def get_queryset(self) -> QuerySet[Pool]:
        return visible_pools(self.request).prefetch_related("targets")


@extend_schema_view(
    list=extend_schema(
        parameters=[
            OpenApiParameter("pool", str, description="Only targets of the pool with this slug.")
        ]
    )
)
class TargetViewSet(viewsets.ModelViewSet):
    """Targets of every pool; the credential is write-only."""

    serializer_class = TargetSerializer

    def get_queryset(self) -> QuerySet[Target]:
        targets = Target.objects.filter(pool__in=visible_pools(self.request)).select_related("pool")
        if pool := self.request.query_params.get("pool"):
            targets = targets.filter(pool__slug=pool)
        return targets
