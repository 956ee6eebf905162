"""Admin API representations of deployments and their per-node rows."""

from __future__ import annotations

from django.contrib.auth.models import User
from rest_framework import serializers

from deployments.models import Deployment, DeploymentNode, ModelSource, Runtime
from nodes.models import Node


class DeploymentNodeSerializer(serializers.ModelSerializer):
    """One node's part of a deployment: its job's phase, progress and outcome."""

    node: serializers.SlugRelatedField[Node] = serializers.SlugRelatedField(
        slug_field="name", read_only=True
    )
    # Plain strings in the schema: as choice fields they would name another set of choices
    # "state" beside pools' targets, which drf-spectacular warns about.
    state = serializers.CharField(
        read_only=True, help_text="pending, running, succeeded or failed."
    )

    class Meta:
        model = DeploymentNode
        fields = [
            "id",
            "node",
            "state",
            "phase",
            "bytes_done",
            "bytes_total",
            "percent",
            "message",
            "error",
            "log",
            "agent_job_id",
            "attempt",
            "started_at",
            "finished_at",
            "updated_at",
        ]
        read_only_fields = fields


class DeploymentNodeSummarySerializer(DeploymentNodeSerializer):
    """A node row as listed: without its log lines."""

    class Meta(DeploymentNodeSerializer.Meta):
        fields = [f for f in DeploymentNodeSerializer.Meta.fields if f != "log"]
        read_only_fields = fields


class DeploymentSerializer(serializers.ModelSerializer):
    """A deployment, its overall state and one row per node."""

    state = serializers.CharField(
        read_only=True,
        help_text="running while any node is pending or running, else failed if any failed, "
        "else succeeded.",
    )
    created_by: serializers.SlugRelatedField[User] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True, help_text="Who started it."
    )
    nodes = DeploymentNodeSerializer(many=True, read_only=True)

    class Meta:
        model = Deployment
        fields = [
            "id",
            "name",
            "state",
            "runtime",
            "runtime_requirement",
            "runtime_argv",
            "model_source",
            "model_location",
            "model_file",
            "model_sha256",
            "model_name",
            "nodes",
            "created_by",
            "created_at",
        ]
        read_only_fields = fields


class DeploymentSummarySerializer(DeploymentSerializer):
    """A deployment as listed: node rows without their logs."""

    nodes = DeploymentNodeSummarySerializer(many=True, read_only=True)


class DeploymentCreateSerializer(serializers.Serializer):
    """What starting a deployment takes: nodes by name, a runtime and a model source."""

    name = serializers.CharField(max_length=100)
    # Whether each node may take work (trusted, online) is the service's to say, by name.
    nodes = serializers.SlugRelatedField(
        slug_field="name",
        queryset=Node.objects.all(),
        many=True,
        allow_empty=False,
        help_text="Names of trusted, online nodes.",
    )
    runtime = serializers.ChoiceField(choices=Runtime.choices)
    runtime_requirement = serializers.CharField(
        max_length=300, required=False, default="", allow_blank=True
    )
    runtime_argv = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        default=list,
        help_text="Custom runtime: the command, with ${MODEL_PATH} and ${PORT} placeholders.",
    )
    model_source = serializers.ChoiceField(choices=ModelSource.choices)
    model_location = serializers.CharField(
        max_length=1000, help_text="A path on the node, a URL, or a Hugging Face org/repo."
    )
    model_file = serializers.CharField(
        max_length=300,
        required=False,
        default="",
        allow_blank=True,
        help_text="Hugging Face: the file in the repository.",
    )
    model_sha256 = serializers.CharField(
        max_length=64,
        required=False,
        default="",
        allow_blank=True,
        help_text="The model file's SHA-256 (64 hex digits), checked after the download.",
    )
    model_name = serializers.CharField(max_length=200, help_text="The model id to serve.")
