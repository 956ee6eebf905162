"""Admin API for client tokens: issue, list, inspect, revoke."""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer

from nexus import access
from nexus.api import schema  # noqa: F401  (registers the token scheme with the OpenAPI schema)
from nexus.api.serializers import ApiTokenSerializer, IssuedApiTokenSerializer
from nexus.models import ApiToken


class ApiTokenViewSet(
    mixins.CreateModelMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Tokens of the caller's projects (staff: all): the secret is returned once, on issue;
    afterwards list, inspect, revoke."""

    permission_classes = [access.ProjectRoles]

    def get_queryset(self) -> QuerySet[ApiToken]:
        tokens = ApiToken.objects.select_related("created_by", "project")
        user = self.request.user
        if access.is_staff(user):
            return tokens
        return tokens.filter(project__in=access.visible_projects(user))

    def project_of(self, token: ApiToken) -> str | None:
        return token.project.name if token.project else None

    def get_serializer_class(self) -> type[BaseSerializer[ApiToken]]:
        return IssuedApiTokenSerializer if self.action == "create" else ApiTokenSerializer

    @extend_schema(request=None)
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str | None = None) -> Response:
        """Revoke the token; revoking it again changes nothing."""
        token = self.get_object()
        if not token.is_revoked:
            token.revoke()
        return Response(self.get_serializer(token).data)
