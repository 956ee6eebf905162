"""Admin API for a model service's autoscaling rules, its scale events, the Prometheus presets
and the current-value preview of a Prometheus query."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, serializers
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from nexus import access
from serving import autoscaling, scaling
from serving.api.views import ServiceChildViewSet
from serving.models import AutoScalingRule, ScaleEvent

RULE_FIELDS = [
    "id",
    "metric_source",
    "metric_name",
    "prometheus_preset",
    "prometheus_query",
    "condition",
    "min_threshold",
    "max_threshold",
    "step_size",
    "step",
    "cooldown_s",
    "min_replicas",
    "max_replicas",
    "aggregation",
    "window_s",
    "created_at",
    "last_triggered_at",
]
EDITABLE = [f for f in RULE_FIELDS if f not in ("id", "step", "created_at", "last_triggered_at")]


class AutoScalingRuleSerializer(serializers.ModelSerializer):
    """An autoscaling rule. A Prometheus preset fills the metric name, query and cooldown that
    the request leaves out."""

    step = serializers.CharField(
        source="step_text", read_only=True, help_text='The step with its sign: "+1", "−1", "±1".'
    )

    class Meta:
        model = AutoScalingRule
        fields = RULE_FIELDS
        read_only_fields = ["created_at", "last_triggered_at"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        given = set(self.initial_data) if isinstance(self.initial_data, dict) else set()
        current = {f: getattr(self.instance, f) for f in EDITABLE} if self.instance else {}
        merged = autoscaling.with_preset({**current, **attrs}, keep=given)
        probe = AutoScalingRule(service=self.context["service"], **merged)
        try:
            probe.clean()
        except DjangoValidationError as error:
            raise ValidationError(serializers.as_serializer_error(error)) from None
        return merged


class ScaleEventSerializer(serializers.ModelSerializer):
    """One scale event: the rule, its metric value, the window and aggregation, the decision."""

    class Meta:
        model = ScaleEvent
        fields = [
            "id",
            "rule",
            "rule_text",
            "metric_source",
            "value",
            "series",
            "window_s",
            "aggregation",
            "replicas_before",
            "replicas_after",
            "outcome",
            "reason",
            "overruled",
            "cooldown_until",
            "created_at",
        ]
        read_only_fields = fields


class PreviewSerializer(serializers.Serializer):
    """A Prometheus query to preview, or a preset whose query is used."""

    prometheus_preset = serializers.ChoiceField(
        choices=[p.key for p in autoscaling.PRESETS], required=False, allow_blank=True
    )
    prometheus_query = serializers.CharField(required=False, allow_blank=True)
    window_s = serializers.IntegerField(min_value=10, max_value=3600, default=60)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        preset = autoscaling.PRESETS_BY_KEY.get(attrs.get("prometheus_preset") or "")
        if not attrs.get("prometheus_query") and preset is not None:
            attrs["prometheus_query"] = preset.query
        if not attrs.get("prometheus_query"):
            raise ValidationError({"prometheus_query": ["Give a query or a preset."]})
        return attrs


class PreviewResultSerializer(serializers.Serializer):
    query = serializers.CharField(help_text="The query as sent, the service's labels filled in.")
    series = serializers.IntegerField(help_text="How many series the query returned.")
    value = serializers.FloatField(allow_null=True, help_text="The most recent series' value.")
    at = serializers.FloatField(allow_null=True, help_text="Its time, epoch seconds.")
    text = serializers.CharField(help_text='What the preview shows: "No data available" or so.')


SERVICE_NAME = OpenApiParameter(
    "service_name", str, OpenApiParameter.PATH, description="The service's name."
)
RANGES = [
    OpenApiParameter(name, str, description=f"ISO date-time: {what}.")
    for name, what in (
        ("created_after", "created at or after"),
        ("created_before", "created before"),
        ("triggered_after", "last triggered at or after"),
        ("triggered_before", "last triggered before"),
    )
]


@extend_schema_view(
    list=extend_schema(parameters=[SERVICE_NAME, *RANGES]),
    create=extend_schema(parameters=[SERVICE_NAME]),
    retrieve=extend_schema(parameters=[SERVICE_NAME]),
    partial_update=extend_schema(parameters=[SERVICE_NAME]),
    update=extend_schema(parameters=[SERVICE_NAME]),
    destroy=extend_schema(parameters=[SERVICE_NAME]),
)
class AutoScalingRuleViewSet(
    ServiceChildViewSet,
    mixins.CreateModelMixin,
    mixins.RetrieveModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    mixins.ListModelMixin,
):
    """A service's autoscaling rules: evaluated every NEXUS_AUTOSCALING_INTERVAL_S."""

    serializer_class = AutoScalingRuleSerializer
    permission_classes = [access.ProjectRoles]
    lookup_value_regex = r"\d+"

    def get_queryset(self) -> QuerySet[AutoScalingRule]:
        rules = AutoScalingRule.objects.filter(service=self.get_service()).order_by("pk")
        if self.action == "list":
            try:
                rules = scaling.in_ranges(rules, self.request.query_params)
            except scaling.BadRange as bad:
                raise ValidationError({bad.name: [str(bad)]}) from None
        return rules

    def get_serializer_context(self) -> dict[str, Any]:
        context = super().get_serializer_context()
        if getattr(self, "swagger_fake_view", False):
            return context
        context["service"] = self.get_service()
        return context

    def perform_create(self, serializer: serializers.BaseSerializer[AutoScalingRule]) -> None:
        service = serializer.context["service"]
        access.require_change(self.request.user, service.project)
        serializer.save(service=service)

    @extend_schema(
        parameters=[SERVICE_NAME],
        request=PreviewSerializer,
        responses=PreviewResultSerializer,
    )
    @action(detail=False, methods=["post"])
    def preview(self, request: Request, service_name: str) -> Response:
        """Run a Prometheus query (or a preset's) for the service: the current-value preview."""
        asked = PreviewSerializer(data=request.data)
        asked.is_valid(raise_exception=True)
        data = asked.validated_data
        service = self.get_service()
        return Response(scaling.preview(service, data["prometheus_query"], data["window_s"]))


@extend_schema_view(list=extend_schema(parameters=[SERVICE_NAME]))
class ScaleEventViewSet(ServiceChildViewSet, mixins.ListModelMixin):
    """A service's scale events, newest first."""

    serializer_class = ScaleEventSerializer
    permission_classes = [access.ProjectRoles]

    def get_queryset(self) -> QuerySet[ScaleEvent]:
        return ScaleEvent.objects.filter(service=self.get_service()).order_by("-created_at", "-id")


class PresetSerializer(serializers.Serializer):
    key = serializers.CharField()
    name = serializers.CharField(source="label", help_text="What the editor lists.")
    metric = serializers.CharField()
    query = serializers.CharField(help_text="$service, $pool and $window are filled in.")
    cooldown_s = serializers.IntegerField(allow_null=True)


class PresetListView(APIView):
    """The Prometheus presets a rule may start from."""

    @extend_schema(responses=PresetSerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(PresetSerializer(autoscaling.PRESETS, many=True).data)
