"""Admin API representations of pools, targets and routing history; credentials write-only."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import QuerySet
from rest_framework import serializers
from rest_framework.request import Request

from nexus import access
from nexus.api.serializers import ProjectField
from nodes.models import Node
from pools import services
from pools.models import (
    Pool,
    RequestKind,
    RoutingOutcome,
    RoutingRecord,
    Target,
    TokenUsage,
    node_base_url,
    node_model_problem,
)

SLUG_IMMUTABLE = "A pool's slug cannot change: apps call it as @pool/<slug>."


@contextmanager
def refusals_as_400() -> Iterator[None]:
    """Turn a service's refusal (Django's ValidationError, e.g. an Exact-replicas pool refusing
    a target of another model) into DRF's, answered 400 with the reasons by field."""
    try:
        yield
    except DjangoValidationError as refused:
        raise serializers.ValidationError(refused.message_dict) from None


def visible_pools(request: Request) -> QuerySet[Pool]:
    """Return the pools the caller may see: those of their projects (staff: all)."""
    return Pool.objects.filter(project__in=access.visible_projects(request.user))


class VisiblePoolField(serializers.SlugRelatedField):
    """A pool named by its slug, among those the caller may see."""

    queryset = Pool.objects.all()

    def get_queryset(self) -> QuerySet[Pool]:
        return visible_pools(self.context["request"])


class TargetSerializer(serializers.ModelSerializer):
    """A target: where to send requests, how many at once, and whether a key is stored."""

    pool = VisiblePoolField(slug_field="slug")
    node = serializers.SlugRelatedField(
        slug_field="name",
        queryset=Node.objects.all(),
        required=False,
        allow_null=True,
        help_text="The node (by name) whose agent serves the model; base_url and the credential "
        "then come from the node, and model_id must be in its inventory.",
    )
    base_url = serializers.URLField(
        max_length=500,
        required=False,
        help_text="OpenAI-compatible base URL; derived from the node for a node target.",
    )
    kinds = serializers.ListField(
        child=serializers.ChoiceField(choices=RequestKind.choices),
        allow_empty=False,
        required=False,
        help_text="Request kinds the target serves; all of them when omitted.",
    )
    credential = serializers.CharField(
        write_only=True,
        required=False,
        allow_blank=True,
        trim_whitespace=True,
        style={"input_type": "password"},
        help_text="The target's API key. Write-only; an empty string removes it.",
    )
    has_credential = serializers.BooleanField(read_only=True)

    class Meta:
        model = Target
        fields = [
            "id",
            "pool",
            "name",
            "node",
            "base_url",
            "model_id",
            "priority",
            "capacity_weight",
            "kinds",
            "enabled",
            "state",
            "state_changed_at",
            "health",
            "position",
            "credential",
            "has_credential",
            "created_at",
            "updated_at",
        ]
        # Drain and resume change the state (POST .../drain/, .../resume/), so nothing races them;
        # health is the active probes' verdict on a service's replica.
        read_only_fields = ["state", "state_changed_at", "health"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        current = self.instance
        node = attrs.get("node", current.node if current else None)
        if node is None:
            if "base_url" not in attrs and (current is None or current.node_id is not None):
                raise serializers.ValidationError({"base_url": "Give a base URL, or a node."})
            return attrs
        if attrs.get("credential"):
            raise serializers.ValidationError(
                {"credential": "A target on a node uses the node's credential; leave this out."}
            )
        if "node" in attrs or "model_id" in attrs:
            model_id = attrs.get("model_id", current.model_id if current else "")
            problem = node_model_problem(node, model_id)
            if problem:
                raise serializers.ValidationError({"model_id": problem})
        attrs["base_url"] = node_base_url(node.address)
        return attrs

    def create(self, validated_data: dict[str, Any]) -> Target:
        credential = validated_data.pop("credential", "")
        pool = validated_data.pop("pool")
        with refusals_as_400():
            return services.add_target(pool, validated_data, credential=credential)

    def update(self, instance: Target, validated_data: dict[str, Any]) -> Target:
        credential = validated_data.pop("credential", None)
        with refusals_as_400():
            return services.update_target(instance, validated_data, credential=credential)


class PoolTargetSerializer(TargetSerializer):
    """A target as embedded in its pool: the pool is implied, the credential never shown."""

    class Meta(TargetSerializer.Meta):
        fields = [f for f in TargetSerializer.Meta.fields if f not in ("pool", "credential")]


class PoolSerializer(serializers.ModelSerializer):
    """A pool, its routing policy and its targets."""

    model_name = serializers.CharField(read_only=True, help_text="The name apps put in `model`.")
    project = ProjectField(required=False)
    targets = PoolTargetSerializer(many=True, read_only=True)

    class Meta:
        model = Pool
        fields = [
            "slug",
            "name",
            "project",
            "model_name",
            "description",
            "compatibility_mode",
            "strategy",
            "max_queue",
            "max_queue_wait_s",
            "max_attempts",
            "first_byte_timeout_s",
            "first_token_timeout_s",
            "stream_idle_timeout_s",
            "max_ejection_percent",
            "continuity_enabled",
            "continuity_threshold",
            "history_retention_days",
            "history_max_rows",
            "targets",
            "created_at",
            "updated_at",
        ]

    def validate_slug(self, slug: str) -> str:
        if self.instance is not None and slug != self.instance.slug:
            raise serializers.ValidationError(SLUG_IMMUTABLE)
        return slug

    def update(self, instance: Pool, validated_data: dict[str, Any]) -> Pool:
        with refusals_as_400():
            return services.update_pool_settings(instance, validated_data)


class RoutingRecordSerializer(serializers.ModelSerializer):
    """One routed request as listed: where it went and how it ended, without the explanation."""

    pool: serializers.SlugRelatedField[Pool] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    # A plain string in the schema: as a choice field it would name RequestKind's choices a second
    # time (beside Target.kinds), which drf-spectacular warns about.
    kind = serializers.CharField(
        read_only=True, help_text="The request kind: chat, completions or embeddings."
    )

    class Meta:
        model = RoutingRecord
        fields = [
            "request_id",
            "created_at",
            "pool",
            "kind",
            "stream",
            "token_id",
            "token_name",
            "target",
            "target_name",
            "outcome",
            "status_code",
            "failure_reason",
            "queue_wait_ms",
            "ttft_ms",
            "total_ms",
            "attempt_count",
            "attempts",
        ]
        read_only_fields = fields


class RoutingRecordDetailSerializer(RoutingRecordSerializer):
    """One routed request with the balancer's full explanation of its decision."""

    class Meta(RoutingRecordSerializer.Meta):
        fields = [*RoutingRecordSerializer.Meta.fields, "decision"]
        read_only_fields = fields


class HistoryFilterSerializer(serializers.Serializer):
    """The history list's query parameters, checked before they reach the database."""

    pool = serializers.SlugField(required=False, help_text="Only requests to this pool (slug).")
    target = serializers.IntegerField(required=False, help_text="Only requests to this target id.")
    outcome = serializers.ChoiceField(
        choices=RoutingOutcome.choices, required=False, help_text="Only requests with this outcome."
    )
    token = serializers.IntegerField(required=False, help_text="Only requests with this token id.")
    since = serializers.DateTimeField(required=False, help_text="Only requests from this time on.")
    until = serializers.DateTimeField(required=False, help_text="Only requests before this time.")
    kind = serializers.CharField(
        required=False, help_text="Only requests of this kind: chat, completions or embeddings."
    )
    min_attempts = serializers.IntegerField(
        required=False,
        min_value=0,
        help_text="Only requests of this many attempts or more (2: retried).",
    )
    queued_over_ms = serializers.FloatField(
        required=False, min_value=0, help_text="Only requests that waited in the queue longer (ms)."
    )


class UsageFilterSerializer(serializers.Serializer):
    """The usage list's query parameters, checked before they reach the database."""

    token = serializers.IntegerField(required=False, help_text="Only this token id's usage.")
    pool = serializers.SlugField(required=False, help_text="Only usage of this pool (slug).")
    service = serializers.CharField(
        required=False, help_text="Only usage of this model service (by name)."
    )
    since = serializers.DateTimeField(
        required=False, help_text="Only hours starting at this time or later."
    )
    until = serializers.DateTimeField(required=False, help_text="Only hours starting before this.")


class TokenUsageSerializer(serializers.ModelSerializer):
    """One token's requests, errors and tokens in one pool during one hour (UTC)."""

    pool: serializers.SlugRelatedField[Pool] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    service = serializers.SerializerMethodField(
        help_text="The model service owning the pool, if any."
    )

    class Meta:
        model = TokenUsage
        fields = [
            "token_id",
            "pool",
            "service",
            "hour",
            "requests",
            "errors",
            "prompt_tokens",
            "completion_tokens",
        ]

    def get_service(self, usage: TokenUsage) -> str | None:
        service = getattr(usage.pool, "service", None)
        return service.name if service is not None else None


class DryRunSerializer(serializers.Serializer):
    """A sample request for a dry run: its kind, and optionally a conversation and a body."""

    kind = serializers.ChoiceField(choices=RequestKind.choices, default=RequestKind.CHAT)
    session_id = serializers.CharField(
        required=False, help_text="As the X-Nexus-Session-Id header of a real request."
    )
    body = serializers.DictField(
        required=False,
        default=dict,
        help_text="A request body, for prompt_cache_key, user and the prompt-prefix affinity.",
    )


class PoolValidateSerializer(serializers.Serializer):
    """What Validate should do beyond asking: a one-token request per kind (real inference)."""

    probe_kinds = serializers.BooleanField(
        default=False, help_text="Send one one-token request per configured kind to each target."
    )
