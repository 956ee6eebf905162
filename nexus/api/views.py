"""Admin API for tokens (issue, list, inspect, revoke), projects and their members."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, mixins, permissions, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer

from nexus import access
from nexus.api import schema  # noqa: F401  (registers the token scheme with the OpenAPI schema)
from nexus.api.serializers import (
    ApiTokenSerializer,
    IssuedApiTokenSerializer,
    MembershipSerializer,
    ProjectSerializer,
)
from nexus.models import ApiToken, Membership, Project


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


class ProjectOwners(permissions.BasePermission):
    """Signed-in callers read the projects they see; owners and staff change one."""

    message = "Only the project's owners (and staff) may change it or its members."

    def has_permission(self, request: Request, view: Any) -> bool:
        return bool(request.user and request.user.is_authenticated)

    def has_object_permission(self, request: Request, view: Any, obj: Any) -> bool:
        if request.method in permissions.SAFE_METHODS:
            return True
        return access.may_manage_members(request.user, view.project_of(obj))


class ProjectViewSet(
    mixins.CreateModelMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.UpdateModelMixin,
    viewsets.GenericViewSet,
):
    """Projects the caller is a member of (staff: all); staff create them."""

    serializer_class = ProjectSerializer
    permission_classes = [ProjectOwners]
    lookup_field = "name"
    http_method_names = ["get", "post", "put", "patch", "head", "options"]

    def get_queryset(self) -> QuerySet[Project]:
        return access.visible_projects(self.request.user)

    def project_of(self, project: Project) -> str:
        return project.name

    def perform_create(self, serializer: BaseSerializer[Project]) -> None:
        if not access.is_staff(self.request.user):
            raise exceptions.PermissionDenied("Only staff create projects.")
        serializer.save()


class MembershipViewSet(viewsets.ModelViewSet):
    """A project's members by username: everyone in it reads them; owners and staff change them."""

    serializer_class = MembershipSerializer
    permission_classes = [ProjectOwners]
    lookup_field = "user__username"
    lookup_url_kwarg = "username"
    lookup_value_regex = r"[\w.@+-]+"

    def get_project(self) -> Project:
        """Return the project named in the URL among the caller's, or answer 404."""
        visible = access.visible_projects(self.request.user)
        return get_object_or_404(visible, name=self.kwargs["project_name"])

    def get_queryset(self) -> QuerySet[Membership]:
        return self.get_project().memberships.select_related("user", "project")

    def project_of(self, membership: Membership) -> str:
        return membership.project.name

    def perform_create(self, serializer: BaseSerializer[Membership]) -> None:
        project = self.get_project()
        if not access.may_manage_members(self.request.user, project.name):
            raise exceptions.PermissionDenied(ProjectOwners.message)
        if project.memberships.filter(user=serializer.validated_data["user"]).exists():
            raise exceptions.ValidationError({"user": ["Already a member; change their role."]})
        serializer.save(project=project)
