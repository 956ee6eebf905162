"""Shared models: client API tokens and the configuration version the gateway watches."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime

from django.conf import settings
from django.db import models
from django.db.models import F
from django.utils import timezone

TOKEN_PREFIX = "nx-"


def hash_token(secret: str) -> str:
    """Return the stored form of a client token (the secret is high-entropy, so no salt)."""
    return hashlib.sha256(secret.encode()).hexdigest()


class ApiTokenQuerySet(models.QuerySet["ApiToken"]):
    def usable(self) -> ApiTokenQuerySet:
        """Return tokens that are neither revoked nor expired."""
        now = timezone.now()
        return self.filter(revoked_at__isnull=True).filter(
            models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=now)
        )


class ApiToken(models.Model):
    """A client token: calls /v1 and the admin API; scoped to all pools or a list of pools."""

    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, help_text="The first characters, to recognise it.")
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    all_pools = models.BooleanField(default=True)
    pools = models.JSONField(
        default=list, blank=True, help_text="Pool slugs this token may call when not all pools."
    )
    services = models.JSONField(
        default=list,
        blank=True,
        help_text="Names of the model services this token may call (a service token).",
    )
    expires_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["name", "id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @classmethod
    def issue(
        cls,
        name: str,
        *,
        pools: list[str] | None = None,
        services: list[str] | None = None,
        expires_at: datetime | None = None,
        created_by: models.Model | None = None,
    ) -> tuple[ApiToken, str]:
        """Create a token and return it with its secret, which is never stored.

        A token names pools (none: all ordinary pools) or, as a service token, services only.
        """
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(
            name=name,
            prefix=secret[:10],
            token_hash=hash_token(secret),
            all_pools=not pools and not services,
            pools=sorted(set(pools or [])),
            services=sorted(set(services or [])),
            expires_at=expires_at,
            created_by=created_by,
        )
        return token, secret

    @property
    def is_expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    def revoke(self) -> None:
        """Stop the token from working from the gateway's next snapshot on."""
        self.revoked_at = timezone.now()
        self.save(update_fields=["revoked_at"])

    def may_use_pool(self, slug: str) -> bool:
        return self.all_pools or slug in self.pools

    def may_use_service(self, name: str) -> bool:
        return name in self.services


class ConfigVersion(models.Model):
    """One row whose number rises on every change the gateway's snapshot depends on."""

    version = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"configuration version {self.version}"

    @classmethod
    def bump(cls) -> None:
        """Announce a configuration change to every gateway process."""
        if not cls.objects.filter(pk=1).update(version=F("version") + 1):
            cls.objects.get_or_create(pk=1, defaults={"version": 1})

    @classmethod
    def current(cls) -> int:
        row = cls.objects.filter(pk=1).values_list("version", flat=True).first()
        return row or 0
