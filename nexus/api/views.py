"""Admin API for client tokens: issue, list, inspect, revoke."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, permissions, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer

from nexus.api import schema  # noqa: F401  (registers the token scheme with the OpenAPI schema)
from nexus.api.serializers import ApiTokenSerializer, IssuedApiTokenSerializer
from nexus.auth import StaffWritesAuthenticatedReads
from nexus.models import ApiToken


class NotLimitedToPools(permissions.BasePermission):
    """Refuse tokens limited to some pools: they could otherwise mint wider ones."""

    message = "A token limited to some pools cannot manage tokens."

    def has_permission(self, request: Request, view: Any) -> bool:
        return not (isinstance(request.auth, ApiToken) and not request.auth.all_pools)


class ApiTokenViewSet(
    mixins.CreateModelMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Client tokens: the secret is returned once, on issue; afterwards list, inspect, revoke."""

    queryset = ApiToken.objects.select_related("created_by")
    permission_classes = [StaffWritesAuthenticatedReads, NotLimitedToPools]

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
