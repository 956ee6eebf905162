"""Admin API representation of client tokens; a secret appears only in the issuing response."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework import serializers

from nexus import scopes
from nexus.models import ApiToken


class PoolSlugField(serializers.CharField):
    """A pool named by its slug; the token stores the slug itself."""

    default_error_messages = {"does_not_exist": "No pool has the slug {value}."}

    def to_internal_value(self, data: Any) -> str:
        slug = super().to_internal_value(data)
        if slug not in scopes.pool_slugs():
            self.fail("does_not_exist", value=slug)
        return slug


class ApiTokenSerializer(serializers.ModelSerializer):
    """A client token as listed: its scope and state, never its secret."""

    pools = serializers.ListField(
        child=PoolSlugField(),
        required=False,
        help_text="Slugs of the pools the token may call; empty or omitted means all pools.",
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
        ]
        read_only_fields = ["prefix", "all_pools", "created_at", "last_used_at", "revoked_at"]

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
            pools=validated_data.get("pools"),
            expires_at=validated_data.get("expires_at"),
            created_by=self.context["request"].user,
        )
        return token
