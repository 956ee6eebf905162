"""Admin API for deployments: start one on named nodes, follow it, retry its failed nodes."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from deployments import services
from deployments.api.serializers import (
    DeploymentCreateSerializer,
    DeploymentSerializer,
    DeploymentSummarySerializer,
)
from deployments.models import Deployment
from nexus.auth import StaffWritesAuthenticatedReads, acting_user


class DeploymentViewSet(
    mixins.CreateModelMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Deployments, newest first, each with one row per node."""

    permission_classes = [StaffWritesAuthenticatedReads]

    def get_queryset(self) -> QuerySet[Deployment]:
        return Deployment.objects.select_related("created_by").prefetch_related("nodes__node")

    def get_serializer_class(self) -> type[DeploymentSerializer]:
        return DeploymentSummarySerializer if self.action == "list" else DeploymentSerializer

    @extend_schema(request=DeploymentCreateSerializer, responses={201: DeploymentSerializer})
    def create(self, request: Request) -> Response:
        """Start a deployment: one job per node, queued once it is stored."""
        asked = DeploymentCreateSerializer(data=request.data)
        asked.is_valid(raise_exception=True)
        try:
            deployment = services.create_deployment(
                **asked.validated_data, user=acting_user(request)
            )
        except ValidationError as invalid:
            raise serializers.ValidationError(invalid.message_dict) from None
        created = self.get_queryset().get(pk=deployment.pk)
        return Response(DeploymentSerializer(created).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: DeploymentSerializer, 409: OpenApiTypes.OBJECT})
    @action(detail=True, methods=["post"])
    def retry(self, request: Request, pk: str) -> Response:
        """Run the failed nodes again (a download resumes); the others are left alone."""
        deployment = self.get_object()
        try:
            services.retry_failed(deployment)
        except services.CannotRetry as refusal:
            return Response({"detail": str(refusal)}, status=status.HTTP_409_CONFLICT)
        except ValidationError as invalid:
            raise serializers.ValidationError(invalid.message_dict) from None
        return Response(DeploymentSerializer(self.get_queryset().get(pk=deployment.pk)).data)
