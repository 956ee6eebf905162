"""Model serving's stored objects: model folders, resource groups and presets, services with
their immutable revisions, and routes (replicas)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models.functions import Lower

from nexus.choices import choices_of
from nexus.models import ConfigInput, ConfigInputQuerySet
from serving.health import ProbeVerdict
from serving.scheduler import slots_text

FOLDER_NAME_MAX_LENGTH = 100
# Starting with a letter or digit rules out ".", "..", hidden names and our own ".nexus-*" files.
FOLDER_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
FOLDER_NAME_HELP = "Letters, digits, '-', '_' and '.', starting with a letter or digit."
# Looked for at the folder's top level, in this order (the reference accepts both spellings).
MODEL_DEFINITION_NAMES = ("model-definition.yaml", "model-definition.yml")
SERVICE_DEFINITION_NAME = "service-definition.toml"


def validate_folder_name(name: str) -> None:
    """Refuse a name that is not one safe directory name."""
    if not FOLDER_NAME_RE.fullmatch(name):
        raise ValidationError(f"{name!r} is not a valid folder name: {FOLDER_NAME_HELP}")
    if len(name) > FOLDER_NAME_MAX_LENGTH:
        raise ValidationError(f"A folder name has at most {FOLDER_NAME_MAX_LENGTH} characters.")


def models_root() -> Path:
    """Return the directory that holds every model folder."""
    return Path(settings.DATA_DIR) / "models"


class FolderUsage(models.TextChoices):
    """What a folder is for: a model's files, which services mount at their mount destination;
    or general files or data, which a model definition's service may mount beside them."""

    MODEL = "model", "Model"
    GENERAL = "general", "General"
    DATA = "data", "Data"


class ModelFolder(models.Model):
    """A directory of model files, `$NEXUS_DATA_DIR/models/<name>`, that services mount."""

    name = models.CharField(
        max_length=FOLDER_NAME_MAX_LENGTH,
        unique=True,
        validators=[validate_folder_name],
        help_text=f"The directory's name; fixed once created. {FOLDER_NAME_HELP}",
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        # The files outlive the person who uploaded them.
        on_delete=models.SET_NULL,
        related_name="model_folders",
    )
    project = models.CharField(max_length=100, default="default")
    usage = models.CharField(max_length=16, choices=FolderUsage.choices, default=FolderUsage.MODEL)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            # "Llama" and "llama" would be one directory on a case-insensitive file system.
            models.UniqueConstraint(
                Lower("name"),
                name="serving_modelfolder_name_ci_unique",
                violation_error_message="A model folder of this name, ignoring case, exists.",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def path(self) -> Path:
        """Return the folder's directory; refuse a stored name that could point elsewhere."""
        validate_folder_name(self.name)
        return models_root() / self.name

    @property
    def model_definition_file(self) -> str | None:
        """Return the name of the folder's model definition file, if it has one."""
        return next((n for n in MODEL_DEFINITION_NAMES if (self.path / n).is_file()), None)

    @property
    def service_definition_file(self) -> str | None:
        """Return the name of the folder's service definition file, if it has one."""
        return SERVICE_DEFINITION_NAME if (self.path / SERVICE_DEFINITION_NAME).is_file() else None


class ResourceGroup(models.Model):
    """Trusted nodes a service's replicas may run on."""

    name = models.SlugField(max_length=64, unique=True)
    description = models.TextField(blank=True)
    all_nodes = models.BooleanField(
        default=False, help_text="Every trusted node, now and later, instead of the list."
    )
    nodes = models.ManyToManyField("nodes.Node", blank=True, related_name="resource_groups")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ResourcePreset(models.Model):
    """A named set of resource slots a replica reserves on its node."""

    name = models.SlugField(max_length=64, unique=True)
    cpu = models.FloatField(default=1.0, validators=[MinValueValidator(0.0)])
    memory_bytes = models.BigIntegerField(default=1 << 30, validators=[MinValueValidator(0)])
    cuda_shares = models.FloatField(default=0.0, validators=[MinValueValidator(0.0)])

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def slots(self) -> dict[str, float]:
        return {"cpu": self.cpu, "mem": self.memory_bytes, "cuda.shares": self.cuda_shares}


class ServiceLifecycle(models.TextChoices):
    ACTIVE = "active", "Active"
    DESTROYING = "destroying", "Destroying"
    DESTROYED = "destroyed", "Destroyed"


class Service(ConfigInput):
    """A model service (an endpoint): N replicas of its latest revision, behind one URL.

    Its replicas are the targets of a pool it owns (`pool`), so /serve/<name>/ and
    `@pool/<name>` go through the same balancer as every pool.
    """

    # The gateway routes /serve/<name>/ and `@pool/<name>` by these (through the pool's service).
    config_fields = frozenset({"name", "open_to_public", "desired_replicas", "lifecycle", "pool"})

    objects = ConfigInputQuerySet.as_manager()

    name = models.SlugField(
        max_length=64, help_text="Unique among services that are not destroyed; in the URL."
    )
    project = models.CharField(max_length=100, default="default")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    open_to_public = models.BooleanField(default=False)
    desired_replicas = models.PositiveSmallIntegerField(
        default=1, validators=[MaxValueValidator(64)]
    )
    lifecycle = models.CharField(
        max_length=16, choices=ServiceLifecycle.choices, default=ServiceLifecycle.ACTIVE
    )
    latest_revision = models.ForeignKey(
        "Revision", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The revision the ready replicas run; differs from the latest while a rollout is under way.
    running_revision = models.ForeignKey(
        "Revision", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    pool = models.OneToOneField(
        "pools.Pool",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="service",
        help_text="The managed pool whose targets are the ready replicas.",
    )
    status_message = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    destroyed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                "name",
                condition=~models.Q(lifecycle="destroyed"),
                name="serving_service_name_unique_while_alive",
                violation_error_message="A service of this name exists.",
            ),
        ]

    def __str__(self) -> str:
        return self.name


def readiness_text(ready: int, desired: int) -> str:
    """Say how many of a service's replicas are ready: "2 of 3 replicas ready"."""
    return f"{ready} of {desired} replica{'' if desired == 1 else 's'} ready"


class RevisionState(models.TextChoices):
    PENDING = "pending", "Pending"  # created, not rolled out yet
    ROLLING_OUT = "rolling_out", "Rolling out"
    RUNNING = "running", "Running"  # every ready replica runs it
    ROLLED_BACK = "rolled_back", "Rolled back"  # never became healthy; the reason says why
    SUPERSEDED = "superseded", "Superseded"  # a later revision replaced it


class Revision(models.Model):
    """One immutable version of a service's launch: what runs, where, with which settings.

    `spec` is resolved when the revision is made (from the model definition or the runtime
    variant), so a rollout never depends on files changing later:
    {"argv": [...], "env": {...}, "port": int | None, "model_name": str,
     "health_check": {"path", "interval", "max_retries", "max_wait_time",
                      "expected_status_code", "initial_delay"} | None,
     "pre_start_actions": [{"action": ..., "args": {...}}, ...],
     "capacity": int (when the runtime tells its concurrency),
     "cluster": {"size", "worker_argv", "worker_pre_start_actions"} (multi-node only)}
    argv, env and action paths use the mount destination; the agent side maps it to the folder.
    A multi-node spec's argv and actions are the main's, with `${MAIN_HOST}`, `${NODE_RANK}`
    and `${DIST_PORT}` filled in when the parts start (nodes.runtimes.catalogue).
    """

    service = models.ForeignKey(Service, on_delete=models.CASCADE, related_name="revisions")
    number = models.PositiveIntegerField()
    # A folder may be deleted once only destroyed services used it (serving.folders.delete_folder
    # refuses it otherwise); the revision then keeps the folder's name.
    model_folder = models.ForeignKey(
        ModelFolder, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    model_folder_name = models.CharField(max_length=FOLDER_NAME_MAX_LENGTH)
    mount_destination = models.CharField(max_length=200, default="/models")
    runtime_variant = models.CharField(max_length=32)
    model_definition_path = models.CharField(max_length=300, blank=True)
    command = models.TextField(blank=True, help_text="A pasted command line (Custom).")
    command_settings = models.JSONField(
        default=dict,
        blank=True,
        help_text="A pasted command's port, health_path, initial_delay and max_retries, where "
        "given instead of derived from it.",
    )
    environ = models.JSONField(default=dict, blank=True)
    runtime_parameters = models.JSONField(
        default=dict, blank=True, help_text="vLLM/SGLang launcher parameters by key."
    )
    cluster_size = models.PositiveSmallIntegerField(
        default=1, help_text="Nodes one replica spans: 1 (single node) or a main and workers."
    )
    # {"digest", "files": [{"path", "size", "sha256"}]}: the folder's contents when the first
    # replica was placed, which every replica of this revision runs (serving.folder_sync).
    folder_manifest = models.JSONField(null=True, blank=True)
    resource_group = models.ForeignKey(
        ResourceGroup, on_delete=models.PROTECT, related_name="revisions"
    )
    preset = models.ForeignKey(
        ResourcePreset, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    resource_slots = models.JSONField(default=dict, blank=True)
    # The service definition's (or a pasted `docker run`'s) image: shown, not pulled, since a
    # replica runs as a process on its node.
    image = models.CharField(max_length=300, blank=True)
    spec = models.JSONField(default=dict)
    state = models.CharField(
        max_length=16, choices=RevisionState.choices, default=RevisionState.PENDING
    )
    failure_reason = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["service", "number"]
        constraints = [
            models.UniqueConstraint(
                fields=["service", "number"], name="serving_revision_number_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.service.name} r{self.number}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.model_folder is not None:
            self.model_folder_name = self.model_folder.name
        super().save(*args, **kwargs)

    @property
    def slots_text(self) -> str:
        """Return the slots a replica reserves, in words: "1 CPU, 256 MiB"."""
        return slots_text(self.resource_slots)

    @property
    def folder(self) -> ModelFolder:
        """Return the model folder the revision mounts; a live service's cannot be deleted."""
        if self.model_folder is None:
            raise ModelFolder.DoesNotExist(
                f"the model folder {self.model_folder_name!r} was deleted"
            )
        return self.model_folder


class RouteState(models.TextChoices):
    PROVISIONING = "provisioning", "Provisioning"
    HEALTHY = "healthy", "Healthy"
    UNHEALTHY = "unhealthy", "Unhealthy"
    TERMINATING = "terminating", "Terminating"
    TERMINATED = "terminated", "Terminated"
    FAILED_TO_START = "failed_to_start", "Failed to start"


# The latest active probe's verdict, apart from the route's state: health's ProbeVerdict (the
# field's choices come from it). A HEALTHY route whose latest probe FAILED is degraded.
ProbeResult = ProbeVerdict


class Route(models.Model):
    """One replica of a service: a process on a node, started through its agent."""

    service = models.ForeignKey(Service, on_delete=models.CASCADE, related_name="routes")
    revision = models.ForeignKey(Revision, on_delete=models.CASCADE, related_name="routes")
    node = models.ForeignKey(
        "nodes.Node", null=True, blank=True, on_delete=models.PROTECT, related_name="routes"
    )
    process_id = models.CharField(max_length=64, blank=True)
    port = models.PositiveIntegerField(null=True, blank=True)
    state = models.CharField(
        max_length=20, choices=RouteState.choices, default=RouteState.PROVISIONING
    )
    status_message = models.CharField(
        max_length=500, blank=True, help_text='e.g. "waiting: insufficient resources in gpu".'
    )
    # Active health checks (serving.health): the probe schedule and the failure count.
    probe_result = models.CharField(
        max_length=16,
        choices=choices_of(ProbeResult, {"unknown": "Not probed yet"}),
        default=ProbeResult.UNKNOWN,
    )
    consecutive_failures = models.PositiveIntegerField(default=0)
    last_probe_at = models.DateTimeField(null=True, blank=True)
    next_probe_at = models.DateTimeField(null=True, blank=True)
    # Every error the route met (start failures, failed probes that made it unhealthy, exits),
    # newest last: [{"at", "message", "exit_code", "log_tail"}]; kept until "clear errors".
    errors = models.JSONField(default=list, blank=True)
    target = models.OneToOneField(
        "pools.Target", null=True, blank=True, on_delete=models.SET_NULL, related_name="route"
    )
    # A replacement for an unhealthy or failed route waits until then (exponential backoff).
    not_before = models.DateTimeField(null=True, blank=True)
    restart_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    # Where it was placed, kept until it starts: {"gpus", "workers": [{"node", "gpus"}],
    # "folders": {node name: {"job", "state", "path", "source", "copied_bytes", "bytes_done",
    # "bytes_total", "percent", "error"}}} (the model folder copied to nodes that lack it).
    placement = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["service", "id"]

    def __str__(self) -> str:
        return f"{self.service.name} route {self.pk}"

    @property
    def degraded(self) -> bool:
        return self.state == RouteState.HEALTHY and self.probe_result == ProbeResult.FAILED


class RoutePart(models.Model):
    """A worker of a multi-node replica: its process on another node of the group.

    The route itself is the main (rank 0): its node and process take the health probes and the
    traffic. If any part's process ends, the whole replica is replaced.
    """

    route = models.ForeignKey(Route, on_delete=models.CASCADE, related_name="parts")
    rank = models.PositiveSmallIntegerField()
    node = models.ForeignKey("nodes.Node", on_delete=models.PROTECT, related_name="route_parts")
    process_id = models.CharField(max_length=64, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["route", "rank"]
        constraints = [
            models.UniqueConstraint(fields=["route", "rank"], name="serving_routepart_rank_unique")
        ]

    def __str__(self) -> str:
        return f"{self.route} rank {self.rank}"


class TrialState(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    PASSED = "passed", "Passed"  # a health probe answered as expected
    FAILED = "failed", "Failed"  # the reason says why


class Trial(models.Model):
    """A trial replica of a launcher's settings ("Validate"): started on a node that fits,
    probed as a route would be, always stopped; its log and probes kept for the popup.

    `spec`, `mount_destination`, `resource_slots` and `model_folder` are the checked launch, as a
    revision would hold them; nothing of a service is made.
    """

    project = models.CharField(max_length=100, default="default")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    model_folder = models.ForeignKey(
        ModelFolder, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    mount_destination = models.CharField(max_length=200, default="/models")
    runtime_variant = models.CharField(max_length=32)
    resource_group = models.ForeignKey(
        ResourceGroup, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    resource_slots = models.JSONField(default=dict, blank=True)
    spec = models.JSONField(default=dict)
    state = models.CharField(max_length=16, choices=TrialState.choices, default=TrialState.QUEUED)
    reason = models.TextField(blank=True)
    node = models.ForeignKey(
        "nodes.Node", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    process_id = models.CharField(max_length=64, blank=True)
    port = models.PositiveIntegerField(null=True, blank=True)
    # The process's output, its latest tail; and every probe: [{"at", "passed", "detail"}].
    log = models.TextField(blank=True)
    probes = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"trial {self.pk} ({self.state})"

    @property
    def finished(self) -> bool:
        return self.state in (TrialState.PASSED, TrialState.FAILED)
