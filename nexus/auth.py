"""Token authentication of the admin API (admin tokens only) and its fleet-wide permission."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.http import HttpRequest
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request

from nexus import scopes
from nexus.models import ApiToken, hash_token


class TokenRefused(Exception):
    """The bearer token is unknown, revoked or expired; the message says which, for the caller."""


def bearer_secret(header: str) -> str | None:
    """Return the token in an `Authorization: Bearer <token>` header value."""
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def bearer_token(header: str) -> ApiToken | None:
    """Return the usable token of an `Authorization: Bearer` header value; None without one.

    Raises TokenRefused for an unknown, revoked or expired token. What the token may call is
    the caller's question (`ApiToken.may_call`).
    """
    secret = bearer_secret(header)
    if secret is None:
        return None
    token = (
        ApiToken.objects.select_related("created_by").filter(token_hash=hash_token(secret)).first()
    )
    if token is None or token.is_revoked:
        raise TokenRefused("Invalid token.")
    if token.is_expired:
        raise TokenRefused("Token expired.")
    return token


class ApiTokenAuthentication(authentication.BaseAuthentication):
    """Authenticate admin API calls by an admin token; it acts as the user who issued it.

    A bad token is 401; a client token, or a read-only admin token asked to change something,
    is 403 with the reason (`scopes.refusal`).
    """

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        try:
            token = bearer_token(request.headers.get("Authorization", ""))
        except TokenRefused as refused:
            raise exceptions.AuthenticationFailed(str(refused)) from None
        if token is None:
            return None
        callee = scopes.admin_api(writes=request.method not in permissions.SAFE_METHODS)
        if not token.may_call(callee):
            raise exceptions.PermissionDenied(scopes.refusal(token.scope, callee))
        if token.created_by is None or not token.created_by.is_active:
            raise exceptions.AuthenticationFailed("The user this admin token acts for is gone.")
        return (token.created_by, token)

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"


class StaffWritesAuthenticatedReads(permissions.BasePermission):
    """The fleet (nodes, deployments, resource groups and presets): any signed-in user or admin
    token reads it; only staff change it."""

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        if request.method in permissions.SAFE_METHODS:
            return bool(user and user.is_authenticated)
        return bool(user and user.is_authenticated and user.is_staff)


def acting_user(request: HttpRequest | Request) -> User | None:
    """Return the signed-in user who makes a change, or None for an anonymous request."""
    user = request.user
    return None if isinstance(user, AnonymousUser) else user
