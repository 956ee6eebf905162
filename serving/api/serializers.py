"""Admin API representations of model folders, resource groups and presets, services with their
revisions and routes, and definition checks."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from nodes.models import Node
from nodes.runtimes import RUNTIME_NAMES
from serving import folders, services
from serving.definitions.command_import import DEFAULT_MOUNT
from serving.models import (
    FOLDER_NAME_HELP,
    FOLDER_NAME_MAX_LENGTH,
    MIN_IDLE_S,
    ModelFolder,
    ResourceGroup,
    ResourcePreset,
    Revision,
    Route,
    RoutePart,
    Service,
    Trial,
    validate_folder_name,
)

VALIDATE_KINDS = ("model-definition", "service-definition", "command")


class ModelFolderSerializer(serializers.ModelSerializer):
    """A model folder: who owns it, where it lives, and which definition files it holds."""

    # Declared, not derived: uniqueness (also ignoring case) is checked where the directory is made.
    name = serializers.CharField(
        max_length=FOLDER_NAME_MAX_LENGTH,
        validators=[validate_folder_name],
        help_text=f"The directory's name; fixed once created. {FOLDER_NAME_HELP}",
    )
    owner = serializers.CharField(
        source="owner.username", read_only=True, allow_null=True, help_text="Who created it."
    )
    path = serializers.CharField(read_only=True, help_text="The directory on the server.")
    model_definition = serializers.CharField(
        source="model_definition_file",
        read_only=True,
        allow_null=True,
        help_text="model-definition.yaml or .yml when the folder holds one, else null.",
    )
    service_definition = serializers.CharField(
        source="service_definition_file",
        read_only=True,
        allow_null=True,
        help_text="service-definition.toml when the folder holds one, else null.",
    )

    class Meta:
        model = ModelFolder
        fields = [
            "name",
            "owner",
            "project",
            "usage",
            "description",
            "path",
            "model_definition",
            "service_definition",
            "created_at",
            "updated_at",
        ]
        extra_kwargs = {
            "usage": {
                "help_text": "model (the default): a model's files; general or data: folders a "
                "model definition's service may mount beside its model folder (extra_mounts)."
            }
        }

    def create(self, validated_data: dict[str, Any]) -> ModelFolder:
        try:
            return folders.create_folder(ModelFolder(**validated_data))
        except folders.FolderExists as taken:
            raise serializers.ValidationError({"name": [str(taken)]}) from None


class FileEntrySerializer(serializers.Serializer):
    """One file in a model folder."""

    path = serializers.CharField(help_text="Relative to the folder, with '/' between parts.")
    size = serializers.IntegerField(help_text="Bytes.")
    modified = serializers.DateTimeField()


class FileListingSerializer(serializers.Serializer):
    """A folder's files, sorted by path."""

    files = FileEntrySerializer(many=True)
    truncated = serializers.BooleanField(
        help_text=f"True when the folder holds more than {folders.MAX_LISTED_FILES} files."
    )


class FilePreviewSerializer(serializers.Serializer):
    """The start of a file: its text when it is UTF-8, null when it is binary."""

    path = serializers.CharField()
    size = serializers.IntegerField(help_text="Bytes, the whole file.")
    modified = serializers.DateTimeField()
    binary = serializers.BooleanField()
    truncated = serializers.BooleanField(
        help_text=f"True when the file is longer than the {folders.PREVIEW_BYTES} bytes shown."
    )
    text = serializers.CharField(allow_null=True)


class UploadSerializer(serializers.Serializer):
    """A multipart upload: one file, and where to put it in the folder."""

    file = serializers.FileField(help_text="The file; it replaces any file at the same path.")
    path = serializers.CharField(
        required=False,
        help_text="Where to store it, relative to the folder (e.g. `weights/model.gguf`); "
        "the uploaded file's name when omitted. Missing directories are created.",
    )


# Resource groups and presets


class ResourceGroupSerializer(serializers.ModelSerializer):
    """Trusted nodes a service's replicas may run on: every one (`all_nodes`) or a list."""

    nodes = serializers.SlugRelatedField(
        slug_field="name",
        many=True,
        required=False,
        queryset=Node.objects.all(),
        help_text="Node names; ignored while `all_nodes` is true.",
    )

    class Meta:
        model = ResourceGroup
        fields = ["name", "description", "all_nodes", "nodes", "created_at"]


class ResourcePresetSerializer(serializers.ModelSerializer):
    """A named set of resource slots a replica reserves on its node."""

    class Meta:
        model = ResourcePreset
        fields = ["name", "cpu", "memory_bytes", "cuda_shares"]


# Services, revisions and routes


class RoutePartSerializer(serializers.ModelSerializer):
    """A worker of a multi-node replica: its rank, node and process."""

    node = serializers.CharField(source="node.name", read_only=True)

    class Meta:
        model = RoutePart
        fields = ["rank", "node", "process_id", "started_at"]
        read_only_fields = fields


class RouteSerializer(serializers.ModelSerializer):
    """One replica: where it runs, how healthy it is and every error it met. A multi-node
    replica's `node` is its main's; `parts` are its workers."""

    parts = RoutePartSerializer(many=True, read_only=True)

    revision = serializers.IntegerField(source="revision.number", read_only=True)
    node = serializers.CharField(source="node.name", read_only=True, allow_null=True)
    # Plain strings in the schema: other apps name their own "state" choices.
    state = serializers.CharField(
        read_only=True,
        help_text="provisioning, healthy, unhealthy, terminating, terminated or failed_to_start.",
    )
    probe_result = serializers.CharField(
        read_only=True, help_text="unknown, passed or failed (the latest probe)."
    )
    degraded = serializers.BooleanField(
        read_only=True, help_text="Healthy, but its latest probe failed: ranked last."
    )

    class Meta:
        model = Route
        fields = [
            "id",
            "revision",
            "node",
            "parts",
            "process_id",
            "port",
            "state",
            "status_message",
            "probe_result",
            "degraded",
            "consecutive_failures",
            "last_probe_at",
            "errors",
            "restart_count",
            "not_before",
            "created_at",
            "started_at",
            "ready_at",
            "ended_at",
        ]
        read_only_fields = fields


class RevisionSerializer(serializers.ModelSerializer):
    """One immutable version of a service's launch, with its resolved spec."""

    model_folder = serializers.CharField(source="model_folder_name", read_only=True)
    resource_group = serializers.CharField(source="resource_group.name", read_only=True)
    preset = serializers.CharField(source="preset.name", read_only=True, allow_null=True)
    state = serializers.CharField(
        read_only=True, help_text="pending, rolling_out, running, rolled_back or superseded."
    )
    created_by = serializers.CharField(
        source="created_by.username", read_only=True, allow_null=True
    )

    class Meta:
        model = Revision
        fields = [
            "number",
            "state",
            "failure_reason",
            "model_folder",
            "mount_destination",
            "runtime_variant",
            "model_definition_path",
            "command",
            "command_settings",
            "environ",
            "runtime_parameters",
            "cluster_size",
            "resource_group",
            "preset",
            "resource_slots",
            "image",
            "spec",
            "created_by",
            "created_at",
        ]
        read_only_fields = fields


class RevisionSummarySerializer(serializers.ModelSerializer):
    """A revision in a service's history."""

    state = serializers.CharField(read_only=True)

    class Meta:
        model = Revision
        fields = ["number", "state", "runtime_variant", "failure_reason", "created_at"]
        read_only_fields = fields


class ServiceSerializer(serializers.ModelSerializer):
    """A model service: its replicas' readiness and the revision it runs."""

    owner = serializers.CharField(source="owner.username", read_only=True, allow_null=True)
    lifecycle = serializers.CharField(read_only=True, help_text="active, destroying or destroyed.")
    status = serializers.SerializerMethodField(help_text='e.g. "2 of 3 replicas ready".')
    ready_replicas = serializers.SerializerMethodField(help_text="Replicas taking traffic now.")
    runtime_variant = serializers.CharField(
        source="latest_revision.runtime_variant", read_only=True, allow_null=True
    )
    latest_revision = serializers.IntegerField(
        source="latest_revision.number", read_only=True, allow_null=True
    )
    running_revision = serializers.IntegerField(
        source="running_revision.number", read_only=True, allow_null=True
    )
    endpoint = serializers.SerializerMethodField(help_text="Where clients send requests.")

    class Meta:
        model = Service
        fields = [
            "name",
            "project",
            "owner",
            "lifecycle",
            "status",
            "status_message",
            "desired_replicas",
            "ready_replicas",
            "open_to_public",
            "scale_to_zero_after_s",
            "runtime_variant",
            "latest_revision",
            "running_revision",
            "endpoint",
            "created_at",
            "updated_at",
            "destroyed_at",
        ]
        read_only_fields = fields

    def get_status(self, service: Service) -> str:
        return services.status_text(service)

    def get_ready_replicas(self, service: Service) -> int:
        return services.ready_replicas(service)

    def get_endpoint(self, service: Service) -> str:
        return f"/serve/{service.name}/"


class ServiceDetailSerializer(ServiceSerializer):
    """A service with both revisions in full while they differ, its routes and its history."""

    # Declared fields are per class (DRF's metaclass), so these may replace the summary's numbers.
    latest_revision = RevisionSerializer(read_only=True, allow_null=True)  # type: ignore[assignment]
    running_revision = RevisionSerializer(read_only=True, allow_null=True)  # type: ignore[assignment]
    updating = serializers.SerializerMethodField(
        help_text="True while the latest revision is not the one the replicas run."
    )
    routes = serializers.SerializerMethodField()
    revisions = RevisionSummarySerializer(many=True, read_only=True)

    class Meta(ServiceSerializer.Meta):
        fields = [*ServiceSerializer.Meta.fields, "updating", "routes", "revisions"]
        read_only_fields = fields

    def get_updating(self, service: Service) -> bool:
        return service.latest_revision_id != service.running_revision_id

    @extend_schema_field(RouteSerializer(many=True))
    def get_routes(self, service: Service) -> list[dict[str, Any]]:
        # many=True makes a ReturnList; the stubs type every serializer's data as a ReturnDict.
        return RouteSerializer(services.shown_routes(service), many=True).data  # type: ignore[return-value]


class LaunchFieldsSerializer(serializers.Serializer):
    """What a revision is made of; the service checks the values themselves."""

    model_folder = serializers.CharField(help_text="The model folder's name.")
    runtime_variant = serializers.CharField(
        help_text=f"One of: {', '.join(RUNTIME_NAMES)}.",
    )
    mount_destination = serializers.CharField(
        default=DEFAULT_MOUNT,
        help_text="Where the folder appears to the command; paths in it start here.",
    )
    model_definition_path = serializers.CharField(
        default="",
        allow_blank=True,
        help_text="Custom: the model definition file in the folder (default: "
        "model-definition.yaml).",
    )
    command = serializers.CharField(
        default="",
        allow_blank=True,
        trim_whitespace=False,
        help_text="Custom: a pasted command line, e.g. `vllm serve /models/my-model --tp 2`.",
    )
    command_settings = serializers.DictField(
        child=serializers.JSONField(),
        default=dict,
        help_text="Custom with a command: what it would otherwise be derived from it, any of "
        '{"port": 8001, "health_path": "/", "interval": 10.0, "initial_delay": 60.0, '
        '"max_retries": 10}.',
    )
    environ = serializers.DictField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False),
        default=dict,
        help_text="Variables for the server, e.g. VLLM_TP_SIZE; service-definition.toml's are "
        "the defaults.",
    )
    resource_group = serializers.CharField(default=services.DEFAULT_GROUP)
    preset = serializers.CharField(
        default=None, allow_null=True, allow_blank=True, help_text="A resource preset's name."
    )
    resource_slots = serializers.DictField(
        child=serializers.JSONField(),
        default=dict,
        help_text='Slot amounts over the preset\'s: {"cpu": 2, "mem": "8gb", "cuda.shares": 1}.',
    )
    runtime_parameters = serializers.DictField(
        child=serializers.CharField(allow_blank=True),
        default=dict,
        help_text='vLLM/SGLang parameters by key, e.g. {"dtype": "bfloat16", "max_num_seqs": '
        '"64"}; each becomes the server\'s flag (docs/runtimes.md).',
    )
    extra_mounts = serializers.ListField(
        child=serializers.DictField(child=serializers.CharField()),
        required=False,
        help_text='More folders a model definition\'s service sees: [{"folder": "datasets", '
        '"destination": "/data"}]; general or data folders only (Custom, definition file).',
    )
    cluster_size = serializers.IntegerField(
        default=1,
        help_text="Nodes one replica spans: 1 (Single Node), or a main and workers (Multi Node).",
    )


class ServiceCreateSerializer(LaunchFieldsSerializer):
    """A new service: its name, replicas and public access, and how its replicas launch."""

    name = serializers.CharField(
        help_text="Letters, digits, '-' and '_', at most 64; unique among services not "
        "destroyed, and not an ordinary pool's slug."
    )
    project = serializers.CharField(default="default")
    open_to_public = serializers.BooleanField(default=False, help_text="Reachable without a token.")
    desired_replicas = serializers.IntegerField(default=1, help_text="0 to 64.")


class TrialCreateSerializer(LaunchFieldsSerializer):
    """What a trial replica (Validate) runs: a new service's launch settings, without a name."""

    project = serializers.CharField(default="default")


class TrialSerializer(serializers.ModelSerializer):
    """A trial replica of launch settings: where it ran, its probes, log and verdict."""

    node = serializers.CharField(source="node.name", read_only=True, default=None)
    model_folder = serializers.CharField(source="model_folder.name", read_only=True, default=None)

    class Meta:
        model = Trial
        fields = [
            "id",
            "project",
            "state",
            "reason",
            "model_folder",
            "runtime_variant",
            "node",
            "process_id",
            "port",
            "probes",
            "log",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields


class ServiceUpdateSerializer(LaunchFieldsSerializer):
    """Changes to a service (sent as PATCH: absent means unchanged). Any launch setting makes a
    new revision; replicas and public access do not."""

    open_to_public = serializers.BooleanField(required=False)
    desired_replicas = serializers.IntegerField(required=False, help_text="0 to 64.")
    scale_to_zero_after_s = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=MIN_IDLE_S,
        help_text="Scale to 0 replicas after this many idle seconds (a request wakes it); "
        "null: never.",
    )


class ProblemSerializer(serializers.Serializer):
    """One problem: where (a file in the folder, and a key path) and what."""

    file = serializers.CharField(
        help_text="The folder's file the problem is in; empty for the request's own fields."
    )
    path = serializers.CharField(help_text='A key path, e.g. "models[0].service.port".')
    message = serializers.CharField()


class ProblemsSerializer(serializers.Serializer):
    """A refused request: one line per problem in `detail`, each problem in `problems`."""

    detail = serializers.CharField()
    problems = ProblemSerializer(many=True)


class ValidateSerializer(serializers.Serializer):
    """A definition to check: its kind and its text."""

    kind = serializers.CharField(
        help_text="model-definition, service-definition or command (a pasted command line)."
    )
    text = serializers.CharField(allow_blank=True, trim_whitespace=False)

    def validate_kind(self, kind: str) -> str:
        if kind not in VALIDATE_KINDS:
            raise serializers.ValidationError(f"must be one of: {', '.join(VALIDATE_KINDS)}")
        return kind


class ValidatedProblemSerializer(serializers.Serializer):
    path = serializers.CharField()
    message = serializers.CharField()


class ValidationResultSerializer(serializers.Serializer):
    """Whether the text is valid, every problem at its key path, and what it was read as."""

    valid = serializers.BooleanField()
    problems = ValidatedProblemSerializer(many=True)
    result = serializers.JSONField(allow_null=True, help_text="The parsed text, when valid.")
