"""Admin API for the fleet: add a node, confirm or reject its identity, refresh, remove."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from nexus.auth import StaffWritesAuthenticatedReads
from nodes import services
from nodes.api.serializers import ConfirmSerializer, NodeModelSerializer, NodeSerializer
from nodes.models import Node

REFUSED = {400: OpenApiTypes.OBJECT}


def _refused(error: services.NodeError, code: int = status.HTTP_400_BAD_REQUEST) -> Response:
    return Response({"detail": str(error)}, status=code)


@extend_schema_view(
    create=extend_schema(responses={201: NodeSerializer, **REFUSED}),
    partial_update=extend_schema(responses={200: NodeSerializer, **REFUSED}),
    destroy=extend_schema(responses={204: None, 409: OpenApiTypes.OBJECT}),
)
class NodeViewSet(viewsets.ModelViewSet):
    """Nodes by name. Adding one proves its agent's identity; it is pending until confirmed."""

    serializer_class = NodeSerializer
    lookup_field = "name"
    lookup_value_regex = r"[-a-zA-Z0-9_]+"
    permission_classes = [StaffWritesAuthenticatedReads]
    # No PUT: the credential is write-only, so a full replacement would have to repeat it.
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self) -> QuerySet[Node]:
        return Node.objects.prefetch_related("models")

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Add a node: its agent must answer and sign a challenge; it stays pending."""
        asked = self.get_serializer(data=request.data)
        asked.is_valid(raise_exception=True)
        try:
            node = services.add_node(**asked.validated_data)
        except services.NodeError as error:
            return _refused(error)
        return Response(self.get_serializer(node).data, status=status.HTTP_201_CREATED)

    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Rename the node, or change its address or credential (the agent is proven again)."""
        node = self.get_object()
        asked = self.get_serializer(node, data=request.data, partial=True)
        asked.is_valid(raise_exception=True)
        try:
            node = services.update_node(node, **asked.validated_data)
        except services.NodeError as error:
            return _refused(error)
        return Response(self.get_serializer(node).data)

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Remove the node, unless a pool target or a deployment still uses it."""
        try:
            services.delete_node(self.get_object())
        except services.NodeInUse as error:
            return _refused(error, status.HTTP_409_CONFLICT)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=ConfirmSerializer, responses={200: NodeSerializer, **REFUSED})
    @action(detail=True, methods=["post"])
    def confirm(self, request: Request, name: str) -> Response:
        """Trust the node: give the fingerprint its agent printed; it must match."""
        asked = ConfirmSerializer(data=request.data)
        asked.is_valid(raise_exception=True)
        try:
            node = services.confirm_node(self.get_object(), asked.validated_data["fingerprint"])
        except services.NodeError as error:
            return _refused(error)
        return Response(self.get_serializer(node).data)

    @extend_schema(request=None, responses=NodeSerializer)
    @action(detail=True, methods=["post"])
    def reject(self, request: Request, name: str) -> Response:
        """Refuse the node: no traffic and no work until it is confirmed."""
        return Response(self.get_serializer(services.reject_node(self.get_object())).data)

    @extend_schema(request=None, responses=NodeSerializer)
    @action(detail=True, methods=["post"])
    def refresh(self, request: Request, name: str) -> Response:
        """Read a trusted node's status, resources and inventory now."""
        return Response(self.get_serializer(services.refresh_node(self.get_object())).data)

    @extend_schema(request=None, responses=NodeModelSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None)
    def models(self, request: Request, name: str) -> Response:
        """List the models the node served at its latest refresh."""
        rows = self.get_object().models.all()
        return Response(NodeModelSerializer(rows, many=True).data)
