"""Client-token authentication (admin API, metrics) and the admin API's permission policy."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.http import HttpRequest
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request

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
    """Authenticate API calls by a client token; the user is whoever created it."""

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        try:
            token = bearer_token(request.headers.get("Authorization", ""))
        except TokenRefused as refused:
            raise exceptions.AuthenticationFailed(str(refused)) from None
        if token is None:
            return None
        if token.services:  # the kinds of token take over in the next change
            raise exceptions.AuthenticationFailed(
                "A service token calls its service (/serve/<name>/ or @pool/<name>), "
                "not the admin API."
            )
        return (token.created_by or AnonymousUser(), token)

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"


class StaffWritesAuthenticatedReads(permissions.BasePermission):
    """Any signed-in user or token may read; only staff may change anything."""

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        if request.method in permissions.SAFE_METHODS:
            return bool(request.auth is not None or (user and user.is_authenticated))
        return bool(user and user.is_authenticated and user.is_staff)


def acting_user(request: HttpRequest | Request) -> User | None:
    """Return the signed-in user who makes a change, or None for an anonymous request."""
    user = request.user
    return None if isinstance(user, AnonymousUser) else user
