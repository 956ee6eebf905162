"""Admin API for pools (by slug), their targets (flat, `?pool=<slug>`) and routing history."""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import viewsets

from pools.api.serializers import (
    HistoryFilterSerializer,
    PoolSerializer,
    RoutingRecordDetailSerializer,
    RoutingRecordSerializer,
    TargetSerializer,
    visible_pools,
)
from pools.models import Pool, RoutingRecord, Target


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


@extend_schema_view(list=extend_schema(parameters=[HistoryFilterSerializer]))
class HistoryViewSet(viewsets.ReadOnlyModelViewSet):
    """Routing history, newest first; one record, by request id, carries the full decision."""

    lookup_field = "request_id"

    def get_serializer_class(self) -> type[RoutingRecordSerializer]:
        if self.action == "retrieve":
            return RoutingRecordDetailSerializer
        return RoutingRecordSerializer

    def get_queryset(self) -> QuerySet[RoutingRecord]:
        records = RoutingRecord.objects.filter(pool__in=visible_pools(self.request))
        records = records.select_related("pool").order_by("-created_at", "-id")
        if self.action != "list":
            return records
        filters = HistoryFilterSerializer(data=self.request.query_params)
        filters.is_valid(raise_exception=True)
        wanted = filters.validated_data
        if "pool" in wanted:
            records = records.filter(pool__slug=wanted["pool"])
        if "target" in wanted:
            records = records.filter(target_id=wanted["target"])
        if "outcome" in wanted:
            records = records.filter(outcome=wanted["outcome"])
        if "token" in wanted:
            records = records.filter(token_id=wanted["token"])
        if "since" in wanted:
            records = records.filter(created_at__gte=wanted["since"])
        if "until" in wanted:
            records = records.filter(created_at__lt=wanted["until"])
        return records
