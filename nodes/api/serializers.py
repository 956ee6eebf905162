"""Admin API representations of nodes and their inventory; the node credential is write-only."""

from __future__ import annotations

from rest_framework import serializers

from nodes.models import Node, NodeModel


class NodeSerializer(serializers.ModelSerializer):
    """A node: where its agent is, who it proved to be, whether it is trusted and answering."""

    credential = serializers.CharField(
        write_only=True,
        trim_whitespace=True,
        style={"input_type": "password"},
        help_text="The node credential the agent expects. Write-only; never returned.",
    )
    has_credential = serializers.BooleanField(read_only=True)
    # Plain strings in the schema: other apps name their own "status" and "state" choices.
    trust = serializers.CharField(
        read_only=True,
        help_text="pending (until the operator confirms the fingerprint), trusted or rejected.",
    )
    status = serializers.CharField(
        read_only=True, help_text="unknown, online or offline (at the latest refresh)."
    )
    model_count = serializers.SerializerMethodField(help_text="Models in its inventory.")

    class Meta:
        model = Node
        fields = [
            "name",
            "address",
            "credential",
            "has_credential",
            "fingerprint",
            "trust",
            "trusted_at",
            "status",
            "status_changed_at",
            "last_seen_at",
            "last_error",
            "hostname",
            "agent_version",
            "resources",
            "free",
            "metrics",
            "model_count",
            "created_at",
            "updated_at",
        ]
        read_only_fields = [
            "fingerprint",
            "trusted_at",
            "status_changed_at",
            "last_seen_at",
            "last_error",
            "hostname",
            "agent_version",
            "resources",
            "free",
            "metrics",
            "created_at",
            "updated_at",
        ]

    def get_model_count(self, node: Node) -> int:
        return len(node.models.all())


class ConfirmSerializer(serializers.Serializer):
    """The fingerprint the operator read where the agent started."""

    fingerprint = serializers.CharField(
        help_text="As the agent printed it at start, e.g. SHA256:9f2c…; must match the node's."
    )


class NodeModelSerializer(serializers.ModelSerializer):
    """A model a node serves, as its agent reported it at the latest refresh."""

    state = serializers.CharField(read_only=True, help_text="loaded, warm, cold or unknown.")
    # DRF's metaclass moves declared fields off the class: this is no Field.source, as stubs think.
    source = serializers.CharField(  # type: ignore[assignment]
        read_only=True, help_text="managed (the agent runs it) or watched."
    )

    class Meta:
        model = NodeModel
        fields = [
            "model_id",
            "runtime",
            "base_url",
            "state",
            "digest",
            "source",
            "process_id",
            "seen_at",
        ]
        read_only_fields = fields
