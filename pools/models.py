"""Pools of inference targets that apps call as one model name, `@pool/<slug>`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from nexus import crypto
from nexus.choices import choices_of
from nexus.models import ConfigInput, ConfigInputQuerySet, Project, default_project_pk
from nodes import services as node_services
from nodes.models import NodeTrust
from pools.balancer import snapshot as balancer

if TYPE_CHECKING:
    from nodes.models import Node

POOL_MODEL_PREFIX = "@pool/"


class CompatibilityMode(models.TextChoices):
    EXACT_REPLICAS = "exact_replicas", "Exact replicas"
    EQUIVALENT_GENERATION = "equivalent_generation", "Equivalent generation"


# How a pool ranks its targets: the balancer's own enum (the field's choices come from it).
Strategy = balancer.Strategy


class RequestKind(models.TextChoices):
    CHAT = "chat", "Chat completions"
    COMPLETIONS = "completions", "Completions"
    EMBEDDINGS = "embeddings", "Embeddings"


# Where a target stands in draining: the balancer's DrainState (the field's choices come from it).
TargetState = balancer.DrainState
# The active probes' verdict on a target: the balancer's Health. Only service-managed targets are
# probed; every other target stays healthy and is judged by passive health (real request
# failures) alone.
TargetHealth = balancer.Health


def all_request_kinds() -> list[str]:
    return [kind.value for kind in RequestKind]


# Said beside the slug in the forms and the API when another pool has it.
SLUG_TAKEN = "Another pool already has this slug: apps call each pool by its own @pool/<slug>."


class Pool(ConfigInput):
    """A stable model address backed by compatible targets."""

    config_fields = frozenset(
        {"slug", "name", "created_at", "strategy", "continuity_enabled", "continuity_threshold",
         "max_queue", "max_queue_wait_s", "max_attempts", "managed", "first_byte_timeout_s",
         "first_token_timeout_s", "stream_idle_timeout_s", "max_ejection_percent"}
    )  # fmt: skip

    objects = ConfigInputQuerySet.as_manager()

    name = models.CharField(max_length=100)
    slug = models.SlugField(
        max_length=64,
        unique=True,
        help_text="Fixed once created.",
        error_messages={"unique": SLUG_TAKEN},
    )
    project = models.ForeignKey(
        Project,
        on_delete=models.PROTECT,
        related_name="pools",
        help_text="Whose members manage the pool and see it; the default project when unset.",
    )
    description = models.TextField(blank=True)
    compatibility_mode = models.CharField(
        max_length=32, choices=CompatibilityMode.choices, default=CompatibilityMode.EXACT_REPLICAS
    )
    strategy = models.CharField(max_length=16, choices=choices_of(Strategy), default=Strategy.SMART)
    max_queue = models.PositiveIntegerField(default=100, help_text="Requests that may wait.")
    max_queue_wait_s = models.FloatField(
        default=30.0, validators=[MinValueValidator(0.0)], help_text="Longest wait in the queue."
    )
    max_attempts = models.PositiveSmallIntegerField(
        default=2,
        validators=[MinValueValidator(1), MaxValueValidator(5)],
        help_text="Attempts per request, the first included; retries only before output.",
    )
    # Upstream timeouts (docs/reliability.md); each one that passes is the target's fault.
    first_byte_timeout_s = models.FloatField(
        default=60.0,
        validators=[MinValueValidator(0.1)],
        help_text="Longest wait for a streamed answer's response headers.",
    )
    first_token_timeout_s = models.FloatField(
        default=120.0,
        validators=[MinValueValidator(0.1)],
        help_text="Longest wait for the first token (a non-streamed answer's headers come with "
        "its whole body, so this bounds them too).",
    )
    stream_idle_timeout_s = models.FloatField(
        default=60.0,
        validators=[MinValueValidator(0.1)],
        help_text="Longest silence between two chunks of an answer.",
    )
    max_ejection_percent = models.PositiveSmallIntegerField(
        default=50,
        validators=[MaxValueValidator(100)],
        help_text="Share of the pool's capacity that failing targets may take out; past it, "
        "ejected targets stay eligible, ranked last.",
    )
    continuity_enabled = models.BooleanField(default=True)
    continuity_threshold = models.FloatField(
        default=0.25,
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="How much busier (utilization) the sticky target may be than the best one.",
    )
    managed = models.BooleanField(
        default=False,
        editable=False,
        help_text="Owned by a model service: its targets are the service's ready replicas, and "
        "only the service's tokens reach it (never an all-pools token).",
    )
    history_retention_days = models.PositiveIntegerField(default=14)
    history_max_rows = models.PositiveIntegerField(default=100_000)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def model_name(self) -> str:
        """Return the name apps put in `model`."""
        return f"{POOL_MODEL_PREFIX}{self.slug}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        # Set here, not as the field's default: a default would query whenever a Pool is built.
        if self.project_id is None:
            self.project_id = default_project_pk()
        super().save(*args, **kwargs)

    def clean(self) -> None:
        if self.pk:
            stored = Pool.objects.filter(pk=self.pk).values_list("slug", flat=True).first()
            if stored is not None and stored != self.slug:
                raise ValidationError({"slug": "A pool's slug cannot change: apps call it."})


# A target's drain state, as the API schema names it (nexus/settings.py ENUM_NAME_OVERRIDES).
TARGET_STATES = choices_of(TargetState)


class Target(ConfigInput):
    """One model endpoint in a pool, with its own capacity, priority and credential."""

    config_fields = frozenset(
        {"pool", "name", "node", "base_url", "model_id", "priority", "capacity_weight", "kinds",
         "credential_encrypted", "enabled", "state", "health", "position"}
    )  # fmt: skip

    objects = ConfigInputQuerySet.as_manager()

    pool = models.ForeignKey(Pool, related_name="targets", on_delete=models.CASCADE)
    name = models.CharField(max_length=100)
    # A target on a node is reached through the node's agent, with the node credential.
    node = models.ForeignKey(
        "nodes.Node",
        related_name="targets",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        help_text="The node serving the model; its agent forwards /v1 to the model's runtime.",
    )
    base_url = models.URLField(
        max_length=500,
        help_text="OpenAI-compatible base URL, e.g. http://10.0.0.5:8000/v1 "
        "(on a node: the node's address + /v1, kept in step).",
    )
    model_id = models.CharField(max_length=200, help_text="The model name the target serves.")
    priority = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1)], help_text="1 is primary."
    )
    capacity_weight = models.PositiveIntegerField(
        default=4,
        validators=[MinValueValidator(1)],
        help_text="Concurrent requests, and the share within its priority tier.",
    )
    kinds = models.JSONField(default=all_request_kinds, help_text="Request kinds served.")
    credential_encrypted = models.TextField(blank=True, editable=False)
    enabled = models.BooleanField(default=True)
    state = models.CharField(
        max_length=16,
        choices=TARGET_STATES,
        default=TargetState.ACTIVE,
        help_text="Draining takes no new requests; drained has none left. Resume to serve again.",
    )
    state_changed_at = models.DateTimeField(null=True, blank=True)
    health = models.CharField(
        max_length=16, choices=choices_of(TargetHealth), default=TargetHealth.HEALTHY
    )
    position = models.PositiveIntegerField(default=0, help_text="Order for round robin.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["pool", "priority", "position", "id"]
        constraints = [
            models.UniqueConstraint(fields=["pool", "name"], name="target_name_unique_in_pool")
        ]

    def __str__(self) -> str:
        return f"{self.pool.slug}/{self.name}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        # A node target's URL is its node's agent; storing it keeps pages and the API plain.
        # A managed pool's target is one replica process on the agent, with a URL of its own.
        node = self.node if self.node_id is not None and not self.pool.managed else None
        if node is not None:
            self.base_url = node_base_url(node.address)
            if kwargs.get("update_fields") is not None:
                kwargs["update_fields"] = {*kwargs["update_fields"], "base_url"}
        super().save(*args, **kwargs)

    @property
    def has_credential(self) -> bool:
        return bool(self.credential_encrypted)

    def set_credential(self, credential: str) -> None:
        """Store the target's API key encrypted; an empty string removes it."""
        self.credential_encrypted = crypto.encrypt(credential) if credential else ""

    def get_credential(self) -> str:
        """Return the decrypted API key, or an empty string."""
        return crypto.decrypt(self.credential_encrypted) if self.credential_encrypted else ""

    def upstream_credential(self) -> str:
        """Return the credential sent with requests: the node's for a node target, else its own."""
        return self.node.get_credential() if self.node is not None else self.get_credential()

    def clean(self) -> None:
        unknown = set(self.kinds or []) - set(all_request_kinds())
        if unknown or not self.kinds:
            raise ValidationError(
                {"kinds": f"Choose from {', '.join(all_request_kinds())}; got {self.kinds!r}."}
            )
        if self.node is not None:
            problem = node_model_problem(self.node, self.model_id)
            if problem:
                raise ValidationError({"model_id": problem})


def node_base_url(address: str) -> str:
    """Return the OpenAI base URL of a node's agent, which forwards /v1 to its runtimes."""
    return address.rstrip("/") + "/v1"


def node_model_problem(node: Node, model_id: str) -> str:
    """Return why a target cannot serve this model on this node; empty when it can."""
    served = node_services.inventory_ids(node)
    if model_id in served:
        return ""
    if node.trust != NodeTrust.TRUSTED:
        return f"Node {node.name} is not trusted yet, so its models are unknown: confirm it first."
    listed = ", ".join(sorted(served)) or "none"
    return f"Node {node.name} does not serve {model_id} (its models: {listed})."


class RoutingOutcome(models.TextChoices):
    OK = "ok", "OK"
    CLIENT_ERROR = "client_error", "Client error"
    UPSTREAM_ERROR = "upstream_error", "Upstream error"
    QUEUE_FULL = "queue_full", "Queue full"
    QUEUE_TIMEOUT = "queue_timeout", "Queue timeout"
    NO_TARGET = "no_target", "No target"
    INTERRUPTED = "interrupted", "Interrupted"
    CLIENT_GONE = "client_gone", "Client gone"
    RATE_LIMITED = "rate_limited", "Rate limited"


class RoutingRecord(models.Model):
    """One routed request: where it went, why, how long it took; never its content."""

    request_id = models.CharField(max_length=32, unique=True)
    # No separate index: the (pool, created_at) index below serves lookups by pool, and one
    # index fewer keeps the batched inserts cheap.
    pool = models.ForeignKey(
        Pool, related_name="routing_records", on_delete=models.CASCADE, db_index=False
    )
    # The client token's id, never its secret; no foreign key, so an insert checks nothing and a
    # revoked or deleted token keeps its history.
    token_id = models.BigIntegerField(null=True, blank=True)
    token_name = models.CharField(max_length=100, blank=True)
    kind = models.CharField(max_length=16, choices=RequestKind.choices)
    target = models.ForeignKey(
        Target,
        related_name="routing_records",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
    )
    # Kept when the target is deleted, so old records still say where they went.
    target_name = models.CharField(max_length=100, blank=True)
    outcome = models.CharField(max_length=16, choices=RoutingOutcome.choices)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    failure_reason = models.TextField(blank=True)
    attempts = models.JSONField(
        default=list,
        blank=True,
        help_text="Each attempt: target_id, target_name, phase, status, retried, reason.",
    )
    decision = models.JSONField(
        default=dict,
        blank=True,
        help_text="The explanation: ranking with its factors, skipped targets, continuity.",
    )
    # len(attempts), kept as a column so that "was retried" filters without reading the JSON.
    attempt_count = models.PositiveSmallIntegerField(default=0)
    queue_wait_ms = models.FloatField(default=0.0)
    ttft_ms = models.FloatField(null=True, blank=True, help_text="Time to the first output.")
    total_ms = models.FloatField(default=0.0)
    stream = models.BooleanField(default=False)
    # From the answer's `usage` (a stream's usage chunk); None when the target reported none.
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    # When the request arrived, set by the gateway: not auto_now_add, which would stamp the time of
    # the batched insert instead.
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["pool", "-created_at"], name="routing_pool_created"),
            models.Index(fields=["outcome", "-created_at"], name="routing_outcome_created"),
            models.Index(fields=["token_id", "-created_at"], name="routing_token_created"),
            # The history page's keyset pages filtered by target (and outcome): an index range
            # scan from the cursor, whatever the page number (docs/history.md).
            models.Index(fields=["target", "-created_at", "-id"], name="routing_target_created"),
            models.Index(
                fields=["target", "outcome", "-created_at", "-id"], name="routing_target_outcome"
            ),
        ]

    def __str__(self) -> str:
        return self.request_id


class TokenUsage(models.Model):
    """What one client token used of one pool (a service's: its pool) in one hour (UTC).

    Summed from the routing history's batches as they are written (pools.gateway.history), never
    per request; kept apart from the history, whose retention is shorter.
    """

    # The token's id without a foreign key, as in RoutingRecord: a write checks nothing, and a
    # deleted token's usage stays countable.
    token_id = models.BigIntegerField()
    pool = models.ForeignKey(Pool, related_name="token_usage", on_delete=models.CASCADE)
    hour = models.DateTimeField(help_text="The start of the hour (UTC).")
    requests = models.PositiveBigIntegerField(default=0)
    errors = models.PositiveBigIntegerField(default=0, help_text="Requests not answered OK.")
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["-hour", "token_id", "pool_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["token_id", "pool", "hour"], name="token_usage_one_row_per_hour"
            )
        ]
        indexes = [models.Index(fields=["hour"], name="token_usage_hour")]

    def __str__(self) -> str:
        return f"token {self.token_id} in pool {self.pool_id} at {self.hour:%Y-%m-%d %H}:00"


class IdentityConfirmation(models.Model):
    """An operator's word that an Exact-replicas pool's targets serve one model, where Validate
    could not prove it: who, when, and which targets (with the model id each served then)."""

    pool = models.ForeignKey(Pool, related_name="identity_confirmations", on_delete=models.CASCADE)
    confirmed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    confirmed_by_name = models.CharField(max_length=150, help_text="Kept if the user goes.")
    confirmed_at = models.DateTimeField(default=timezone.now)
    targets = models.JSONField(help_text="Each target confirmed: id, name, model_id, base_url.")

    class Meta:
        ordering = ["-confirmed_at", "-id"]

    def __str__(self) -> str:
        return f"{self.pool.slug} confirmed by {self.confirmed_by_name}"


class TrafficRunKind(models.TextChoices):
    TRY = "try", "Try traffic"
    DRILL = "drill", "Failure drill"


class TrafficRunStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"


class TrafficRun(models.Model):
    """Real requests sent through a pool by its operator: Try traffic, or a failure drill.

    Its phases (one for Try traffic; before, drain, after resume for a drill) fill in while it
    runs in a Celery worker; the run's page reads this row each second.
    """

    pool = models.ForeignKey(Pool, related_name="traffic_runs", on_delete=models.CASCADE)
    kind = models.CharField(max_length=8, choices=TrafficRunKind.choices)
    status = models.CharField(
        max_length=16, choices=TrafficRunStatus.choices, default=TrafficRunStatus.QUEUED
    )
    params = models.JSONField(help_text="requests, concurrency, kind, stream, max_tokens; "
                              "a drill's target_id and target_name.")  # fmt: skip
    phases = models.JSONField(
        default=list,
        blank=True,
        help_text="Each phase: name, planned, sent, outcomes, per-target counts, TTFT.",
    )
    verdict = models.TextField(blank=True)
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} #{self.pk} of {self.pool.slug}"
