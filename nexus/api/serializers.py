"""Admin API representation of client tokens; a secret appears only in the issuing response."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.utils import timezone
from rest_framework import serializers

from nexus import access, scopes
from nexus.models import (
    ADMIN_ACCESS,
    LIMIT_FIELDS,
    TOKEN_KINDS,
    ApiToken,
    Membership,
    Project,
    default_project_pk,
)


class ProjectField(serializers.SlugRelatedField):
    """A project named by its name, among those the caller sees (others do not exist for them)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("help_text", "The project (by name); the default project when omitted.")
        super().__init__(slug_field="name", queryset=Project.objects.all(), **kwargs)

    def get_queryset(self) -> QuerySet[Project]:
        return access.visible_projects(self.context["request"].user)


class PoolSlugField(serializers.CharField):
    """A pool named by its slug; the token stores the slug itself."""

    default_error_messages = {"does_not_exist": "No pool has the slug {value}."}

    def to_internal_value(self, data: Any) -> str:
        slug = super().to_internal_value(data)
        if slug not in scopes.pool_slugs():
            self.fail("does_not_exist", value=slug)
        return slug


class ApiTokenSerializer(serializers.ModelSerializer):
    """A token as listed: its kind, scope and state, never its secret."""

    kind = serializers.ChoiceField(
        choices=TOKEN_KINDS,
        default=scopes.TokenKind.CLIENT.value,
        help_text="client: inference only (/v1, /serve); admin: the admin API, as its issuer.",
    )
    access = serializers.ChoiceField(
        choices=ADMIN_ACCESS,
        required=False,
        help_text="An admin token's reach (read unless said); a client token has none.",
    )
    project = ProjectField(required=False)
    pools = serializers.ListField(
        child=PoolSlugField(),
        required=False,
        help_text="Slugs of the pools a client token may call; empty or omitted means all pools "
        "(staff only: everyone else names pools of the token's project).",
    )
    created_by: serializers.SlugRelatedField[User] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True, help_text="Who issued it."
    )
    revoked = serializers.BooleanField(source="is_revoked", read_only=True)
    expired = serializers.BooleanField(source="is_expired", read_only=True)

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "kind",
            "access",
            "project",
            "prefix",
            "all_pools",
            "pools",
            "expires_at",
            "created_by",
            "created_at",
            "last_used_at",
            "revoked_at",
            "revoked",
            "expired",
            "requests_per_minute",
            "tokens_per_minute",
            "max_concurrent",
        ]
        read_only_fields = ["prefix", "all_pools", "created_at", "last_used_at", "revoked_at"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """Check the kind's own fields, and that the issuer may reach what the token names."""
        user = self.context["request"].user
        admin = attrs.get("kind") == scopes.TokenKind.ADMIN
        pools = attrs.get("pools") or []
        if admin and pools:
            raise serializers.ValidationError({"pools": "An admin token names no pool."})
        if not admin and attrs.get("access"):
            raise serializers.ValidationError({"access": "A client token has no admin access."})
        if admin and any(attrs.get(name) is not None for name in LIMIT_FIELDS):
            raise serializers.ValidationError(
                {"kind": "Limits apply to client tokens: an admin token has none."}
            )
        project = attrs.get("project") or Project.objects.get(pk=default_project_pk())
        access.require_change(user, project.name)
        if not admin and not access.is_staff(user):
            if not pools:
                raise serializers.ValidationError(
                    {"pools": "Name the pools of the project that the token may call."}
                )
            outside = sorted(set(pools) - set(project.pools.values_list("slug", flat=True)))
            if outside:
                raise serializers.ValidationError(
                    {"pools": f"Not pools of the project {project.name}: {', '.join(outside)}."}
                )
        attrs["project"] = project
        return attrs

    def validate_expires_at(self, expires_at: datetime | None) -> datetime | None:
        if expires_at is not None and expires_at <= timezone.now():
            raise serializers.ValidationError("Choose a time in the future.")
        return expires_at


class IssuedApiTokenSerializer(ApiTokenSerializer):
    """Issue a token; this response is the only one that ever carries its secret."""

    token = serializers.SerializerMethodField(help_text="The secret. Shown in this response only.")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]

    def get_token(self, token: ApiToken) -> str:
        return self.secret

    def create(self, validated_data: dict[str, Any]) -> ApiToken:
        token, self.secret = ApiToken.issue(
            validated_data["name"],
            kind=scopes.TokenKind(validated_data["kind"]),
            access=scopes.AdminAccess(validated_data["access"])
            if validated_data.get("access")
            else None,
            project=validated_data["project"],
            pools=validated_data.get("pools"),
            expires_at=validated_data.get("expires_at"),
            created_by=self.context["request"].user,
            requests_per_minute=validated_data.get("requests_per_minute"),
            tokens_per_minute=validated_data.get("tokens_per_minute"),
            max_concurrent=validated_data.get("max_concurrent"),
        )
        return token


class ProjectSerializer(serializers.ModelSerializer):
    """A project; its name is fixed once created."""

    class Meta:
        model = Project
        fields = ["name", "description", "created_at"]

    def validate_name(self, name: str) -> str:
        if self.instance is not None and name != self.instance.name:
            raise serializers.ValidationError("A project's name cannot change.")
        return name


class MembershipSerializer(serializers.ModelSerializer):
    """A user's role in a project, the user named by username."""

    user: serializers.SlugRelatedField[User] = serializers.SlugRelatedField(
        slug_field="username", queryset=User.objects.filter(is_active=True)
    )

    class Meta:
        model = Membership
        fields = ["user", "role", "created_at"]

    def validate_user(self, user: User) -> User:
        if self.instance is not None and user != self.instance.user:
            raise serializers.ValidationError("Remove the membership and add the other user.")
        return user
