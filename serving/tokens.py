"""Service tokens: issued per model service with an expiry, listed as valid, expired or revoked,
revoked at once. Stored hashed (`nexus.models.ApiToken`); the secret is shown once, on issue.

A service token names its service in `ApiToken.services` and nothing else: it reaches the service
at /serve/<name>/ and `@pool/<name>` on /v1, never an ordinary pool.
"""

from __future__ import annotations

from datetime import datetime

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from nexus.models import ApiToken, Project
from serving.models import Service, ServiceLifecycle


class TokenStatus(models.TextChoices):
    VALID = "valid", "Valid"
    EXPIRED = "expired", "Expired"
    REVOKED = "revoked", "Revoked"


def service_tokens(service: Service) -> list[ApiToken]:
    """Return the tokens that may call the service, revoked and expired ones too, newest first."""
    # Filtered here, not in SQL: SQLite cannot ask whether a JSON list holds a value.
    candidates = (
        ApiToken.objects.filter(all_pools=False)
        .select_related("created_by")
        .order_by("-created_at", "-id")
    )
    return [token for token in candidates if service.name in token.services]


def token_status(token: ApiToken) -> TokenStatus:
    """Return whether the token works: revoked first, then expired."""
    if token.is_revoked:
        return TokenStatus.REVOKED
    if token.is_expired:
        return TokenStatus.EXPIRED
    return TokenStatus.VALID


def issue_service_token(
    service: Service,
    *,
    name: str,
    expires_at: datetime,
    created_by: AbstractBaseUser | None = None,
) -> tuple[ApiToken, str]:
    """Issue a token for the service alone and return it with its secret, which is never stored.

    Every service token expires: `expires_at` must lie in the future.
    """
    if service.lifecycle != ServiceLifecycle.ACTIVE:
        raise ValidationError(f"The service {service.name!r} is {service.get_lifecycle_display()}.")
    if expires_at <= timezone.now():
        raise ValidationError({"expires_at": "Choose a time in the future."})
    return ApiToken.issue(
        name,
        project=Project.objects.filter(name=service.project).first(),
        services=[service.name],
        expires_at=expires_at,
        created_by=created_by,
    )


def revoke_service_token(token: ApiToken) -> None:
    """Revoke the token; revoking a revoked token changes nothing.

    Once the revocation commits it is announced to every gateway, which drops the token before
    the revoking call returns (pools.signals.announce_revocation).
    """
    if token.is_revoked:
        return
    token.revoke()


def revoke_service_tokens(service: Service) -> int:
    """Revoke every working token of the service (when it is destroyed); return how many.

    A later service may take the name, and must not inherit the old one's callers.
    """
    revoked = 0
    for token in service_tokens(service):
        if not token.is_revoked:
            revoke_service_token(token)
            revoked += 1
    return revoked
