"""Who may see and change what a project holds: its pools, services, model folders and tokens.

Staff see and change everything. A project's owners and members change what it holds (owners
also its memberships); its viewers read it; everyone else does not see it at all, so the admin
API answers 404, never 403, and no name leaks. What a *token* may call is `nexus.scopes`'s rule;
an admin token acts with the rights of the user who issued it, read-only when its access is.
"""

from __future__ import annotations

from typing import Any, TypeVar

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Model, QuerySet
from rest_framework import exceptions, permissions
from rest_framework.request import Request

from nexus.models import Membership, Project, Role

User = AbstractBaseUser | AnonymousUser

CHANGING_ROLES = (Role.OWNER, Role.MEMBER)

Row = TypeVar("Row", bound=Model)


def is_staff(user: Any) -> bool:
    return bool(user.is_authenticated and user.is_staff)


def visible_projects(user: Any) -> QuerySet[Project]:
    """Return the projects the user sees: all for staff, else those they are a member of."""
    if is_staff(user):
        return Project.objects.all()
    if not user.is_authenticated:
        return Project.objects.none()
    return Project.objects.filter(memberships__user=user)


def in_visible_projects(user: Any, found: QuerySet[Row]) -> QuerySet[Row]:
    """Keep the rows that name their project (services, model folders) the user sees.

    Staff see every row, those naming no existing project too.
    """
    if is_staff(user):
        return found
    return found.filter(project__in=visible_projects(user).values_list("name", flat=True))


def sees_named_project(user: Any, project_name: str) -> bool:
    """Say whether the user sees what names this project (staff: whatever it names)."""
    return is_staff(user) or visible_projects(user).filter(name=project_name).exists()


def changeable_projects(user: Any) -> QuerySet[Project]:
    """Return the projects whose pools, services and tokens the user may change."""
    if is_staff(user):
        return Project.objects.all()
    if not user.is_authenticated:
        return Project.objects.none()
    return Project.objects.filter(memberships__user=user, memberships__role__in=CHANGING_ROLES)


def role_in(user: Any, project_name: str) -> str | None:
    """Return the user's role in the project, None when they are not a member."""
    if not user.is_authenticated:
        return None
    return (
        Membership.objects.filter(user=user, project__name=project_name)
        .values_list("role", flat=True)
        .first()
    )


def may_change(user: Any, project_name: str | None) -> bool:
    """Say whether the user may change what the project holds (no project: staff only)."""
    if is_staff(user):
        return True
    return project_name is not None and role_in(user, project_name) in CHANGING_ROLES


def may_manage_members(user: Any, project_name: str) -> bool:
    """Say whether the user may add, change or remove the project's members."""
    return is_staff(user) or role_in(user, project_name) == Role.OWNER


def require_change(user: Any, project_name: str | None) -> None:
    """Refuse (403) a change to a project the user sees but may only read."""
    if not may_change(user, project_name):
        raise exceptions.PermissionDenied(ProjectRoles.message)


class ProjectRoles(permissions.BasePermission):
    """Signed-in callers reach the views; on an object, changes need a changing role.

    The views' querysets hold only the caller's visible projects' objects, so an outsider
    meets 404 before this is asked. A view names an object's project by `project_of(obj)`.
    """

    message = "Your role in this project lets you read it, not change it."

    def has_permission(self, request: Request, view: Any) -> bool:
        return bool(request.user and request.user.is_authenticated)

    def has_object_permission(self, request: Request, view: Any, obj: Any) -> bool:
        if request.method in permissions.SAFE_METHODS:
            return True
        return may_change(request.user, view.project_of(obj))
