"""Admin API for pools (by slug), their targets (flat, `?pool=<slug>`) and routing history."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer

from nexus import access
from nexus.models import Project, default_project_pk
from pools import services, validation
from pools.api.serializers import (
    DryRunSerializer,
    HistoryFilterSerializer,
    PoolSerializer,
    PoolValidateSerializer,
    RoutingRecordDetailSerializer,
    RoutingRecordSerializer,
    TargetSerializer,
    TokenUsageSerializer,
    UsageFilterSerializer,
    visible_pools,
)
from pools.models import Pool, RoutingRecord, Target, TokenUsage


class PoolViewSet(viewsets.ModelViewSet):
    """Pools, each with its targets embedded; the slug is fixed once created."""

    serializer_class = PoolSerializer
    permission_classes = [access.ProjectRoles]
    lookup_field = "slug"

    def get_queryset(self) -> QuerySet[Pool]:
        pools = visible_pools(self.request).select_related("project")
        return pools.prefetch_related("targets", "targets__node")

    def project_of(self, pool: Pool) -> str:
        return pool.project.name

    def perform_create(self, serializer: BaseSerializer[Pool]) -> None:
        project = serializer.validated_data.get("project") or Project.objects.get(
            pk=default_project_pk()
        )
        access.require_change(self.request.user, project.name)
        serializer.save(project=project)

    def perform_update(self, serializer: BaseSerializer[Pool]) -> None:
        if (project := serializer.validated_data.get("project")) is not None:
            access.require_change(self.request.user, project.name)
        serializer.save()

    @extend_schema(request=DryRunSerializer, responses=OpenApiTypes.OBJECT)
    @action(detail=True, methods=["post"], url_path="dry-run")
    def dry_run(self, request: Request, slug: str) -> Response:
        """Rank the pool's targets for a sample request as the strategy would now; route nothing."""
        sample = DryRunSerializer(data=request.data)
        sample.is_valid(raise_exception=True)
        asked = sample.validated_data
        headers = {"x-nexus-session-id": asked["session_id"]} if "session_id" in asked else {}
        ranking = services.dry_run(
            self.get_object(), kind=asked["kind"], headers=headers, body=asked["body"]
        )
        return Response(ranking)

    @extend_schema(request=PoolValidateSerializer, responses=OpenApiTypes.OBJECT)
    @action(detail=True, methods=["post"])
    def validate(self, request: Request, slug: str) -> Response:
        """Check every target and the pool (docs/pools-console.md); change nothing."""
        asked = PoolValidateSerializer(data=request.data)
        asked.is_valid(raise_exception=True)
        pool = self.get_object()
        report = validation.validate(pool, probe_kinds=asked.validated_data["probe_kinds"])
        return Response(report.to_dict())

    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    @action(detail=True, methods=["post"], url_path="confirm-identity")
    def confirm_identity(self, request: Request, slug: str) -> Response:
        """Store the caller's word that the pool's targets, as they are, serve one model."""
        confirmation = validation.confirm_identity(self.get_object(), request.user)
        return Response(validation.confirmation_dict(confirmation), status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    @action(detail=True, methods=["post"])
    def drain(self, request: Request, slug: str) -> Response:
        """Drain every active target of the pool; in-flight requests finish."""
        started = services.drain_pool(self.get_object())
        return Response({"draining": [target.name for target in started]})

    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, slug: str) -> Response:
        """Resume every draining or drained target that is healthy; say why each other is not."""
        resumed, refusals = services.resume_pool(self.get_object())
        return Response({"resumed": [target.name for target in resumed], "refused": refusals})


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
    permission_classes = [access.ProjectRoles]

    def get_queryset(self) -> QuerySet[Target]:
        targets = Target.objects.filter(pool__in=visible_pools(self.request))
        targets = targets.select_related("pool__project", "node")
        if pool := self.request.query_params.get("pool"):
            targets = targets.filter(pool__slug=pool)
        return targets

    def project_of(self, target: Target) -> str:
        return target.pool.project.name

    def perform_create(self, serializer: BaseSerializer[Target]) -> None:
        access.require_change(self.request.user, serializer.validated_data["pool"].project.name)
        serializer.save()

    def perform_update(self, serializer: BaseSerializer[Target]) -> None:
        if (pool := serializer.validated_data.get("pool")) is not None:
            access.require_change(self.request.user, pool.project.name)
        serializer.save()

    def perform_destroy(self, instance: Target) -> None:
        services.remove_target(instance)

    @extend_schema(request=None, responses=TargetSerializer)
    @action(detail=True, methods=["post"])
    def drain(self, request: Request, pk: str) -> Response:
        """Take no new requests; in-flight ones finish, then the target is drained."""
        target = services.drain_target(self.get_object())
        return Response(self.get_serializer(target).data)

    @extend_schema(request=None, responses={200: TargetSerializer, 409: OpenApiTypes.OBJECT})
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str) -> Response:
        """Return a draining or drained target to service, once it answers again."""
        try:
            target = services.resume_target(self.get_object())
        except services.CannotResume as refusal:
            return Response({"detail": str(refusal)}, status=status.HTTP_409_CONFLICT)
        return Response(self.get_serializer(target).data)


@extend_schema_view(list=extend_schema(parameters=[HistoryFilterSerializer]))
class HistoryViewSet(viewsets.ReadOnlyModelViewSet):
    """Routing history, newest first; one record, by request id, carries the full decision."""

    lookup_field = "request_id"
    permission_classes = [access.ProjectRoles]

    def project_of(self, record: RoutingRecord) -> str:
        return record.pool.project.name

    def get_serializer_class(self) -> type[RoutingRecordSerializer]:
        if self.action == "retrieve":
            return RoutingRecordDetailSerializer
        return RoutingRecordSerializer

    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    @action(detail=True, methods=["post"])
    def replay(self, request: Request, request_id: str) -> Response:
        """Re-rank this past request against the current configuration; say what changed."""
        return Response(services.replay(self.get_object()))

    def get_queryset(self) -> QuerySet[RoutingRecord]:
        records = RoutingRecord.objects.filter(pool__in=visible_pools(self.request))
        records = records.select_related("pool__project").order_by("-created_at", "-id")
        if self.action != "list":
            return records
        return filtered(records, HistoryFilterSerializer(data=self.request.query_params), {
            "pool": "pool__slug", "target": "target_id", "outcome": "outcome",
            "token": "token_id", "since": "created_at__gte", "until": "created_at__lt",
            "kind": "kind", "min_attempts": "attempt_count__gte",
            "queued_over_ms": "queue_wait_ms__gt",
        })  # fmt: skip


def filtered(
    rows: QuerySet[Any], filters: BaseSerializer[Any], lookups: dict[str, str]
) -> QuerySet[Any]:
    """Return the rows narrowed by each query filter given, through its lookup."""
    filters.is_valid(raise_exception=True)
    wanted = filters.validated_data
    return rows.filter(**{lookups[name]: value for name, value in wanted.items()})


@extend_schema_view(list=extend_schema(parameters=[UsageFilterSerializer]))
class UsageViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Hourly usage per client token and pool (a service's: its pool), newest hour first."""

    serializer_class = TokenUsageSerializer
    permission_classes = [access.ProjectRoles]

    def get_queryset(self) -> QuerySet[TokenUsage]:
        rows = TokenUsage.objects.filter(pool__in=visible_pools(self.request))
        rows = rows.select_related("pool__service").order_by("-hour", "token_id", "pool_id")
        return filtered(rows, UsageFilterSerializer(data=self.request.query_params), {
            "token": "token_id", "pool": "pool__slug", "service": "pool__service__name",
            "since": "hour__gte", "until": "hour__lt",
        })  # fmt: skip
