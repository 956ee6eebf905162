"""Shared models: projects and their members, API tokens, and the configuration the gateway's
snapshot follows."""

from __future__ import annotations

import copy
import hashlib
import secrets
from collections.abc import Collection, Iterable
from datetime import datetime
from typing import Any, ClassVar, TypeVar

from django.conf import settings
from django.db import models
from django.db.models import F
from django.utils import timezone

from nexus import scopes
from nexus.choices import choices_of

TOKEN_PREFIX = "nx-"
DEFAULT_PROJECT = "default"
# The field choices of a token's kind and an admin token's access (the API and schema use them).
TOKEN_KINDS = choices_of(scopes.TokenKind)
ADMIN_ACCESS = choices_of(scopes.AdminAccess)


def hash_token(secret: str) -> str:
    """Return the stored form of a client token (the secret is high-entropy, so no salt)."""
    return hashlib.sha256(secret.encode()).hexdigest()


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


class Project(models.Model):
    """A group of pools, services and tokens that its members manage together."""

    name = models.SlugField(max_length=100, unique=True, help_text="Fixed once created.")
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


def default_project_pk() -> int:
    """Return the default project's key, creating the project on first use."""
    return create_default_project().pk


def create_default_project(using: str = "default", **kwargs: Any) -> Project:
    """Return the default project, created where missing: also after every migrate (a
    post_migrate receiver), so a flushed database (tests, `flush`) has it again at once."""
    return Project.objects.using(using).get_or_create(name=DEFAULT_PROJECT)[0]


def project_named(name: str) -> Project | None:
    """Return the project with this name (the default one always exists), or None."""
    if name == DEFAULT_PROJECT:
        return Project.objects.get(pk=default_project_pk())
    return Project.objects.filter(name=name).first()


class Role(models.TextChoices):
    """What a member may do in a project."""

    OWNER = "owner", "Owner"  # manages everything in it, its memberships included
    MEMBER = "member", "Member"  # manages its pools, services and tokens
    VIEWER = "viewer", "Viewer"  # reads them


class Membership(models.Model):
    """A user's role in a project."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["project__name", "user__username"]
        constraints = [
            models.UniqueConstraint(fields=["project", "user"], name="one_membership_per_user")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} ({self.role})"


M = TypeVar("M", bound="ConfigInput")


class ConfigInputQuerySet(models.QuerySet[M]):
    """Bulk writes that announce a change to the fields the gateway's snapshot reads.

    update() and bulk_create() send no model signals, so they bump ConfigVersion themselves (in
    the caller's transaction, like a save); bulk_update() runs through update(). delete() sends
    post_delete for every row, which ConfigInput's receivers announce.
    """

    def update(self, **kwargs: Any) -> int:
        changed = super().update(**kwargs)
        if changed and self.model.reads_any(kwargs):
            ConfigVersion.bump()
        return changed

    def bulk_create(self, objs: Iterable[M], *args: Any, **kwargs: Any) -> list[M]:
        created = super().bulk_create(objs, *args, **kwargs)
        if created:
            ConfigVersion.bump()
            for obj in created:
                obj.remember_config()
        return created

    def bulk_update(
        self, objs: Iterable[M], fields: Iterable[str], batch_size: int | None = None
    ) -> int:
        objs, fields = list(objs), list(fields)
        changed = super().bulk_update(objs, fields, batch_size)
        for obj in objs:
            obj.remember_config(fields)
        return changed


class ConfigInput(models.Model):
    """A model the gateway's snapshot reads: its changes to `config_fields` reach every gateway.

    A subclass names the fields the snapshot (pools.gateway.snapshot.load_snapshot) reads in
    `config_fields` and takes its manager from a ConfigInputQuerySet (`objects =
    ConfigInputQuerySet.as_manager()`). Creating or deleting a row, a save() that changes one of
    those fields, and the queryset's bulk writes bump ConfigVersion inside the caller's
    transaction, so a change that is rolled back is never announced (the receivers are in
    nexus.signals).
    A save() compares with the values the instance was loaded with (or last saved, refreshed or
    bulk-written): a node's frequent `last_seen_at` refresh announces nothing. An instance held
    across someone else's update() should be refreshed before it is saved, as in any Django code.
    """

    config_fields: ClassVar[frozenset[str]] = frozenset()

    class Meta:
        abstract = True

    @classmethod
    def from_db(cls, db: str | None, field_names: Collection[str], values: Collection[Any]) -> Any:
        instance = super().from_db(db, field_names, values)
        instance.remember_config()
        return instance

    def refresh_from_db(
        self,
        using: str | None = None,
        fields: Iterable[str] | None = None,
        from_queryset: models.QuerySet[Any] | None = None,
    ) -> None:
        fields = list(fields) if fields is not None else None
        super().refresh_from_db(using, fields, from_queryset)
        self.remember_config(fields)

    @classmethod
    def config_attnames(cls) -> dict[str, str]:
        """Return the attribute name of each config field by its name and by its attname."""
        names: dict[str, str] | None = cls.__dict__.get("_config_attnames")
        if names is None:
            names = {}
            for name in cls.config_fields:
                field = cls._meta.get_field(name)
                assert isinstance(field, models.Field), f"{name} is not a concrete field"
                names[name] = names[field.attname] = field.attname
            cls._config_attnames = names  # type: ignore[attr-defined]
        return names

    @classmethod
    def reads_any(cls, names: Iterable[str]) -> bool:
        """Say whether writing these fields (names or attnames) changes what the snapshot reads."""
        attnames = cls.config_attnames()
        return any(name in attnames for name in names)

    def remember_config(self, fields: Iterable[str] | None = None) -> None:
        """Remember the stored values of the config fields (these only, when given)."""
        attnames = self.config_attnames()
        if fields is None:
            wanted = set(attnames.values())
        else:
            wanted = {attnames[name] for name in fields if name in attnames}
        current = self.__dict__
        # A new dict each time: a shallow copy of the instance must not share it.
        remembered = dict(current.get("_config_stored", {}))
        for attname in wanted:
            if attname in current:  # not deferred
                value = current[attname]
                # JSON lists and dicts may be changed in place later; a copy keeps what was stored.
                remembered[attname] = (
                    copy.deepcopy(value) if isinstance(value, list | dict) else value
                )
        current["_config_stored"] = remembered

    def config_changed(self, update_fields: Collection[str] | None) -> bool:
        """Say whether the save just made wrote a config field with a new value; remember it."""
        attnames = self.config_attnames()
        written = set(attnames.values())
        if update_fields is not None:
            written = {attnames[name] for name in update_fields if name in attnames}
        remembered = self.__dict__.get("_config_stored", {})
        current = self.__dict__
        changed = any(
            attname not in remembered or remembered[attname] != current.get(attname)
            for attname in written
        )
        self.remember_config(written)
        return changed


class ApiTokenQuerySet(ConfigInputQuerySet["ApiToken"]):
    def usable(self) -> ApiTokenQuerySet:
        """Return tokens that are neither revoked nor expired."""
        now = timezone.now()
        return self.filter(revoked_at__isnull=True).filter(
            models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=now)
        )


# A client token's limits, enforced by the gateway (pools.balancer.limits; docs/access.md).
LIMIT_FIELDS = ("requests_per_minute", "tokens_per_minute", "max_concurrent")


class ApiToken(ConfigInput):
    """A token: a client token calls inference (its pools and services), an admin token the
    admin API (read or write) as the user who issued it."""

    config_fields = frozenset(
        {"name", "token_hash", "kind", "access", "all_pools", "pools", "services",
         "expires_at", "revoked_at", "requests_per_minute", "tokens_per_minute",
         "max_concurrent"}
    )  # fmt: skip

    name = models.CharField(max_length=100)
    kind = models.CharField(
        max_length=8, choices=TOKEN_KINDS, default=scopes.TokenKind.CLIENT.value
    )
    access = models.CharField(
        max_length=8,
        choices=ADMIN_ACCESS,
        blank=True,
        help_text="An admin token's reach: read, or read and write. Empty for a client token.",
    )
    project = models.ForeignKey(
        Project,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="tokens",
        help_text="Whose members manage the token; none: staff only.",
    )
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
    # Limits the gateway enforces for this token alone, across every gateway process (empty: none).
    requests_per_minute = models.PositiveIntegerField(
        null=True, blank=True, help_text="Requests in any 60 s window; empty for no limit."
    )
    tokens_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Prompt and completion tokens in any 60 s window; empty for no limit.",
    )
    max_concurrent = models.PositiveIntegerField(
        null=True, blank=True, help_text="Requests in progress at once; empty for no limit."
    )

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
        kind: scopes.TokenKind = scopes.TokenKind.CLIENT,
        access: scopes.AdminAccess | None = None,
        project: Project | None = None,
        pools: list[str] | None = None,
        services: list[str] | None = None,
        expires_at: datetime | None = None,
        created_by: models.Model | None = None,
        requests_per_minute: int | None = None,
        tokens_per_minute: int | None = None,
        max_concurrent: int | None = None,
    ) -> tuple[ApiToken, str]:
        """Create a token and return it with its secret, which is never stored.

        A client token names pools (none: all ordinary pools) or, as a service token, services
        only; an admin token names its access (read unless said) and no pool.
        """
        admin = kind == scopes.TokenKind.ADMIN
        if admin and (pools or services):
            raise ValueError("An admin token names no pool or service.")
        if not admin and access:
            raise ValueError("A client token has no admin access.")
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(
            name=name,
            kind=kind,
            access=(access or scopes.AdminAccess.READ) if admin else "",
            project=project,
            prefix=secret[:10],
            token_hash=hash_token(secret),
            all_pools=not admin and not pools and not services,
            pools=sorted(set(pools or [])),
            services=sorted(set(services or [])),
            expires_at=expires_at,
            created_by_id=created_by.pk if created_by is not None else None,
            requests_per_minute=requests_per_minute,
            tokens_per_minute=tokens_per_minute,
            max_concurrent=max_concurrent,
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

    @property
    def scope(self) -> scopes.TokenScope:
        return scopes.TokenScope(
            all_pools=self.all_pools,
            pools=frozenset(self.pools),
            services=frozenset(self.services),
            kind=scopes.TokenKind(self.kind),
            access=scopes.AdminAccess(self.access) if self.access else None,
        )

    def may_call(self, callee: scopes.Callee) -> bool:
        """Say whether the token's scope lets it call the callee (validity is checked apart)."""
        return scopes.may_call(self.scope, callee)
