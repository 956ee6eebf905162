"""Admin API for a model service's tokens: list, issue (the secret shown once), revoke."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, serializers
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.serializers import BaseSerializer

from nexus import access
from nexus.models import ApiToken
from serving import tokens
from serving.api.views import ServiceChildViewSet


class ServiceTokenSerializer(serializers.ModelSerializer):
    """A service token as listed: its state and expiry, never its secret."""

    status = serializers.SerializerMethodField(help_text="valid, expired or revoked.")
    created_by: serializers.SlugRelatedField[User] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True, help_text="Who issued it."
    )

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "prefix",
            "status",
            "expires_at",
            "created_by",
            "created_at",
            "last_used_at",
            "revoked_at",
        ]
        read_only_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]
        extra_kwargs = {
            "expires_at": {
                "required": True,
                "allow_null": False,
                "help_text": "When the token stops working; required, in the future.",
            }
        }

    def get_status(self, token: ApiToken) -> tokens.TokenStatus:
        return tokens.token_status(token)


class IssuedServiceTokenSerializer(ServiceTokenSerializer):
    """Issue a token; this response is the only one that ever carries its secret."""

    token = serializers.SerializerMethodField(help_text="The secret. Shown in this response only.")

    class Meta(ServiceTokenSerializer.Meta):
        fields = [*ServiceTokenSerializer.Meta.fields, "token"]

    def get_token(self, token: ApiToken) -> str:
        return self.secret

    def create(self, validated_data: dict[str, Any]) -> ApiToken:
        try:
            token, self.secret = tokens.issue_service_token(
                self.context["service"],
                name=validated_data["name"],
                expires_at=validated_data["expires_at"],
                created_by=self.context["request"].user,
            )
        except DjangoValidationError as error:
            raise ValidationError(serializers.as_serializer_error(error)) from None
        return token


SERVICE_NAME = OpenApiParameter(
    "service_name", str, OpenApiParameter.PATH, description="The service's name."
)
TOKEN_ID = OpenApiParameter("id", int, OpenApiParameter.PATH, description="The token's id.")


@extend_schema_view(
    list=extend_schema(parameters=[SERVICE_NAME]),
    create=extend_schema(parameters=[SERVICE_NAME]),
    destroy=extend_schema(
        parameters=[SERVICE_NAME, TOKEN_ID],
        description="Revoke the token: it stops working before this call returns.",
    ),
)
class ServiceTokenViewSet(
    mixins.ListModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    ServiceChildViewSet,
):
    """A service's tokens: the secret is returned once, on issue; listed as valid, expired or
    revoked; DELETE revokes (the row stays, listed as revoked)."""

    permission_classes = [access.ProjectRoles]
    lookup_value_regex = r"\d+"

    def perform_create(self, serializer: BaseSerializer[ApiToken]) -> None:
        access.require_change(self.request.user, serializer.context["service"].project)
        serializer.save()

    def get_queryset(self) -> list[ApiToken]:  # type: ignore[override]
        return tokens.service_tokens(self.get_service())

    def get_object(self) -> ApiToken:
        token = next((t for t in self.get_queryset() if str(t.pk) == self.kwargs["pk"]), None)
        if token is None:
            raise NotFound("No such token for this service.")
        self.check_object_permissions(self.request, token)
        return token

    def get_serializer_class(self) -> type[BaseSerializer[ApiToken]]:
        return IssuedServiceTokenSerializer if self.action == "create" else ServiceTokenSerializer

    def get_serializer_context(self) -> dict[str, Any]:
        context = super().get_serializer_context()
        if self.action == "create":
            context["service"] = self.get_service()
        return context

    def perform_destroy(self, instance: ApiToken) -> None:
        tokens.revoke_service_token(instance)
