"""The people (and tokens) tests speak as, each with its rights in one project.

owner     — owns the project (not staff)
teammate  — a viewer of the project: reads it, changes nothing
outsider  — signed in, in no project of theirs: sees none of it (404)
staff     — sees and changes everything
anonymous — no credential at all
client_token       — an app's inference token for the project's pool: no admin API at all
admin_read_token   — the owner's admin token with read access
admin_write_token  — the owner's admin token with write access
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from django.contrib.auth.models import User
from rest_framework.test import APIClient

from nexus.models import DEFAULT_PROJECT, ApiToken, Membership, Project, Role
from nexus.scopes import AdminAccess, TokenKind
from tests.nexus.factories import make_user


class Persona(StrEnum):
    ANONYMOUS = "anonymous"
    CLIENT_TOKEN = "client_token"
    ADMIN_READ_TOKEN = "admin_read_token"
    ADMIN_WRITE_TOKEN = "admin_write_token"
    OWNER = "owner"
    TEAMMATE = "teammate"
    OUTSIDER = "outsider"
    STAFF = "staff"


def add_member(project: Project, user: User, role: Role) -> Membership:
    """Give the user a role in the project."""
    return Membership.objects.create(project=project, user=user, role=role)


def default_viewer(username: str) -> User:
    """Create a user who reads the default project (where factories put pools and services)."""
    user = make_user(username)
    add_member(Project.objects.get_or_create(name=DEFAULT_PROJECT)[0], user, Role.VIEWER)
    return user


def bearer(secret: str) -> APIClient:
    """Return an API client that sends the token."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def signed_in(user: User) -> APIClient:
    """Return an API client with the user's session."""
    client = APIClient()
    client.force_login(user)
    return client


@dataclass
class Cast:
    """Everyone of one project: its owner, a viewer teammate, an outsider, staff, and tokens."""

    project: Project
    owner: User
    teammate: User
    outsider: User
    staff: User
    secrets: dict[Persona, str] = field(default_factory=dict)

    def client(self, persona: Persona) -> APIClient:
        """Return an API client that speaks as the persona."""
        if persona in self.secrets:
            return bearer(self.secrets[persona])
        user = {
            Persona.OWNER: self.owner,
            Persona.TEAMMATE: self.teammate,
            Persona.OUTSIDER: self.outsider,
            Persona.STAFF: self.staff,
        }.get(persona)
        return signed_in(user) if user is not None else APIClient()


def make_cast(project: Project, *, client_pools: list[str] | None = None) -> Cast:
    """Create the project's people and tokens; the client token names `client_pools`."""
    owner, teammate = make_user(f"{project.name}-owner"), make_user(f"{project.name}-teammate")
    cast = Cast(
        project=project,
        owner=owner,
        teammate=teammate,
        outsider=make_user(f"{project.name}-outsider"),
        staff=make_user(f"{project.name}-staff", staff=True),
    )
    add_member(project, owner, Role.OWNER)
    add_member(project, teammate, Role.VIEWER)
    _, cast.secrets[Persona.CLIENT_TOKEN] = ApiToken.issue(
        "app", project=project, pools=client_pools, created_by=owner
    )
    for persona, reach in (
        (Persona.ADMIN_READ_TOKEN, AdminAccess.READ),
        (Persona.ADMIN_WRITE_TOKEN, AdminAccess.WRITE),
    ):
        _, cast.secrets[persona] = ApiToken.issue(
            f"automation-{reach}",
            kind=TokenKind.ADMIN,
            access=reach,
            project=project,
            created_by=owner,
        )
    return cast
