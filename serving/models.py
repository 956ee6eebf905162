"""Model serving's stored objects: model folders, resource groups and presets, services with
their immutable revisions, routes (replicas), autoscaling rules and scale events."""

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
from serving.autoscaling import PRESETS, Aggregation, Condition, MetricSource, Rule, step_sign
from serving.autoscaling import Outcome as ScaleOutcome
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


def make_models_root() -> Path:
    """Create the directory of model folders if missing, private like the rest of the data dir
    (0700, whatever the umask: docs/access.md), and return it."""
    root = models_root()
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    return root


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


# The shortest idle period before a service scales to zero (a few autoscaling cycles).
MIN_IDLE_S = 10


class Service(ConfigInput):
    """A model service (an endpoint): N replicas of its latest revision, behind one URL.

    Its replicas are the targets of a pool it owns (`pool`), so /serve/<name>/ and
    `@pool/<name>` go through the same balancer as every pool.
    """

    # The gateway routes /serve/<name>/ and `@pool/<name>` by these (through the pool's service).
    config_fields = frozenset(
        {"name", "open_to_public", "desired_replicas", "scale_to_zero_after_s", "lifecycle", "pool"}
    )

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
    # None: never. Otherwise idle this long, it goes to 0 replicas; a request wakes it (it waits
    # in the pool queue while a replica starts: docs/autoscaling.md).
    scale_to_zero_after_s = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(MIN_IDLE_S)],
        help_text="Scale to 0 replicas after this many seconds without requests; empty: never.",
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
        help_text="A pasted command's port, health_path, interval, initial_delay and "
        "max_retries, where given instead of derived from it.",
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


def _positive(value: int) -> None:
    if value < 1:
        raise ValidationError("Must be at least 1.")


class AutoScalingRule(models.Model):
    """A rule that changes a service's replica count from a metric (serving.autoscaling).

    Scale in: metric < min threshold; scale out: metric > max threshold; both: outside the range.
    Each firing moves the count by the step, clamped to min/max replicas.
    """

    service = models.ForeignKey(Service, on_delete=models.CASCADE, related_name="autoscaling_rules")
    metric_source = models.CharField(max_length=24, choices=choices_of(MetricSource))
    metric_name = models.CharField(
        max_length=200,
        blank=True,
        help_text="Kernel: cpu_util, mem, net_rx, net_tx; inference framework: a /metrics name "
        "such as vllm:num_requests_waiting; Prometheus: the preset's metric.",
    )
    prometheus_preset = models.CharField(
        max_length=64,
        blank=True,
        choices=[(preset.key, preset.label) for preset in PRESETS],
    )
    prometheus_query = models.TextField(
        blank=True, help_text="PromQL; $service, $pool and $window are filled in."
    )
    condition = models.CharField(
        max_length=16, choices=choices_of(Condition, {"scale_in_out": "Scale in & out"})
    )
    min_threshold = models.FloatField(null=True, blank=True, help_text="Scale in below it.")
    max_threshold = models.FloatField(null=True, blank=True, help_text="Scale out above it.")
    step_size = models.PositiveSmallIntegerField(default=1, validators=[_positive])
    cooldown_s = models.PositiveIntegerField(
        default=300, help_text="Seconds after this rule scaled before anything scales again."
    )
    min_replicas = models.PositiveSmallIntegerField(
        default=1, validators=[_positive, MaxValueValidator(64)]
    )
    max_replicas = models.PositiveSmallIntegerField(
        default=4, validators=[_positive, MaxValueValidator(64)]
    )
    aggregation = models.CharField(
        max_length=8, choices=choices_of(Aggregation, {"p95": "p95"}), default=Aggregation.AVG
    )
    window_s = models.PositiveIntegerField(
        default=60,
        validators=[MinValueValidator(10), MaxValueValidator(3600)],
        help_text="Samples of the last this many seconds are aggregated.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_triggered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["service", "id"]

    def __str__(self) -> str:
        return f"{self.service.name}: {self.describe()}"

    @property
    def metric_label(self) -> str:
        """Return the metric's name as shown ("vllm:num_requests_waiting")."""
        return self.metric_name or self.prometheus_preset or "metric"

    @property
    def step_text(self) -> str:
        """Return the step with its sign: "+1", "−2", "±1"."""
        return f"{step_sign(self.condition)}{self.step_size}"

    def describe(self) -> str:
        """Say when the rule fires: "vllm:num_requests_waiting > 5"."""
        return self.as_rule().describe(self.metric_label)

    def as_rule(self) -> Rule:
        """Return the rule as the pure evaluator takes it."""
        return Rule(
            id=self.pk or 0,
            condition=Condition(self.condition),
            min_threshold=self.min_threshold,
            max_threshold=self.max_threshold,
            step=self.step_size,
            cooldown_s=float(self.cooldown_s),
            min_replicas=self.min_replicas,
            max_replicas=self.max_replicas,
            window_s=float(self.window_s),
            last_triggered_at=self.last_triggered_at.timestamp()
            if self.last_triggered_at
            else None,
        )

    def clean(self) -> None:
        problems: dict[str, str] = {}
        scales_in = self.condition in (Condition.SCALE_IN, Condition.SCALE_IN_OUT)
        scales_out = self.condition in (Condition.SCALE_OUT, Condition.SCALE_IN_OUT)
        if scales_in and self.min_threshold is None:
            problems["min_threshold"] = "Scaling in needs a min threshold."
        if scales_out and self.max_threshold is None:
            problems["max_threshold"] = "Scaling out needs a max threshold."
        if (
            self.condition == Condition.SCALE_IN_OUT
            and self.min_threshold is not None
            and self.max_threshold is not None
            and self.min_threshold >= self.max_threshold
        ):
            problems["max_threshold"] = "Must be above the min threshold."
        if self.min_replicas > self.max_replicas:
            problems["max_replicas"] = "Must be at least the min replicas."
        if self.metric_source == MetricSource.PROMETHEUS:
            if not self.prometheus_query.strip():
                problems["prometheus_query"] = "A Prometheus rule needs a query (pick a preset)."
        elif not self.metric_name.strip():
            problems["metric_name"] = "Name the metric."
        if problems:
            raise ValidationError(problems)


# A scale event's outcome, as the API schema names it (nexus/settings.py ENUM_NAME_OVERRIDES).
SCALE_OUTCOMES = choices_of(ScaleOutcome)


class ScaleEvent(models.Model):
    """One evaluation of a rule that changed, or declined to change, a service's replica count.

    Quiet evaluations (the metric within its thresholds) are not rows; a declined outcome
    (no data, at a bound, cooling down, overruled) is a row when the rule's previous event had
    another outcome, so a rule stuck in one state leaves one row, not one per cycle.
    """

    service = models.ForeignKey(Service, on_delete=models.CASCADE, related_name="scale_events")
    rule = models.ForeignKey(
        AutoScalingRule, null=True, blank=True, on_delete=models.SET_NULL, related_name="events"
    )
    rule_text = models.CharField(max_length=300, help_text="The rule as it was: when it fires.")
    # Blank for scaling to zero and waking, which follow requests, not a metric.
    metric_source = models.CharField(max_length=24, choices=choices_of(MetricSource), blank=True)
    value = models.FloatField(null=True, blank=True, help_text="None: no data.")
    series = models.PositiveIntegerField(default=0)
    window_s = models.PositiveIntegerField()
    aggregation = models.CharField(max_length=8, choices=choices_of(Aggregation, {"p95": "p95"}))
    replicas_before = models.PositiveSmallIntegerField()
    replicas_after = models.PositiveSmallIntegerField()
    outcome = models.CharField(max_length=16, choices=SCALE_OUTCOMES)
    reason = models.TextField()
    overruled = models.JSONField(
        default=list, blank=True, help_text="The ids of the rules this decision overruled."
    )
    # Set when the count changed: no rule scales the service again before then.
    cooldown_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["service", "-created_at"])]

    def __str__(self) -> str:
        return f"{self.service.name}: {self.outcome} {self.replicas_before}→{self.replicas_after}"
