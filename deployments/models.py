"""Deployments: a runtime and a model put on chosen nodes, with one progress row per node."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models

from nodes.runtimes import RUNTIMES

# How many of the agent's log lines a node row keeps: enough to explain a failure.
LOG_LINES = 50

# Stored lowercase: services.create_deployment lowers what it is given.
sha256_validator = RegexValidator(r"^[0-9a-f]{64}$", "Give 64 hexadecimal digits.")


class Runtime(models.TextChoices):
    """The runtimes a deployment can put on nodes: the catalogue's deployable ones, by its names
    (tests/deployments/test_runtimes.py keeps the two in step)."""

    SIMULATOR = "simulator", RUNTIMES["simulator"].label
    LLAMA_CPP = "llama-cpp", RUNTIMES["llama-cpp"].label
    VLLM = "vllm", RUNTIMES["vllm"].label
    SGLANG = "sglang", RUNTIMES["sglang"].label
    CUSTOM = "custom", RUNTIMES["custom"].label


class ModelSource(models.TextChoices):
    PATH = "path", "A path on the node"
    HTTP = "http", "An HTTP(S) URL"
    HF = "hf", "A Hugging Face repository"


class NodeState(models.TextChoices):
    """Where one node's part of a deployment stands."""

    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"


class DeploymentState(models.TextChoices):
    """A deployment's overall state, computed from its node rows."""

    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"


class Deployment(models.Model):
    """A runtime and a model source, to be put on each of the deployment's nodes."""

    name = models.CharField(max_length=100)
    runtime = models.CharField(max_length=16, choices=Runtime.choices, default=Runtime.SIMULATOR)
    runtime_requirement = models.CharField(
        max_length=300,
        blank=True,
        help_text="Custom runtime: a pip requirement the agent installs, e.g. my-server==1.2.",
    )
    runtime_argv = models.JSONField(
        default=list,
        blank=True,
        help_text="Custom runtime: the command, with ${MODEL_PATH} and ${PORT} placeholders.",
    )
    model_source = models.CharField(max_length=8, choices=ModelSource.choices)
    model_location = models.CharField(
        max_length=1000, help_text="A path on the node, a URL, or a Hugging Face org/repo."
    )
    model_file = models.CharField(
        max_length=300,
        blank=True,
        help_text="Hugging Face: the file in the repository (else all of it); http: the name to "
        "store the download as (else the URL's).",
    )
    model_sha256 = models.CharField(
        max_length=64,
        blank=True,
        validators=[sha256_validator],
        help_text="The model file's SHA-256, checked after the download when given.",
    )
    model_name = models.CharField(max_length=200, help_text="The model id the runtime serves.")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.name

    @property
    def state(self) -> DeploymentState:
        """Return running while any node is pending or running, failed if any failed, else
        succeeded (reads `nodes.all()`, so prefetch them for lists)."""
        states = {row.state for row in self.nodes.all()}
        if states & {NodeState.PENDING, NodeState.RUNNING}:
            return DeploymentState.RUNNING
        if NodeState.FAILED in states:
            return DeploymentState.FAILED
        return DeploymentState.SUCCEEDED

    @property
    def has_failed_nodes(self) -> bool:
        """Say whether any node's part failed: what "Retry failed nodes" retries."""
        return any(row.state == NodeState.FAILED for row in self.nodes.all())

    def get_state_display(self) -> str:
        """Return the overall state's label, as Django does for a field with choices."""
        return self.state.label

    def job_spec(self) -> dict[str, Any]:
        """Return the deploy job the agents run (docs/nodes.md, "Deploy jobs")."""
        runtime: dict[str, Any] = {"name": self.runtime}
        if self.runtime_requirement:
            runtime["requirement"] = self.runtime_requirement
        if self.runtime == Runtime.CUSTOM:
            runtime["argv"] = list(self.runtime_argv)
        model: dict[str, Any] = {
            "source": self.model_source,
            "location": self.model_location,
            "sha256": self.model_sha256 or None,
            "name": self.model_name,
        }
        if self.model_file:
            model["file"] = self.model_file
        return {"kind": "deploy", "runtime": runtime, "model": model}


class DeploymentNode(models.Model):
    """One node's part of a deployment: its agent job's progress, outcome and last log lines."""

    deployment = models.ForeignKey(Deployment, related_name="nodes", on_delete=models.CASCADE)
    node = models.ForeignKey("nodes.Node", related_name="deployment_rows", on_delete=models.PROTECT)
    state = models.CharField(max_length=16, choices=NodeState.choices, default=NodeState.PENDING)
    phase = models.CharField(max_length=32, blank=True, help_text="The agent job's phase.")
    bytes_done = models.BigIntegerField(default=0)
    bytes_total = models.BigIntegerField(null=True, blank=True, help_text="Unknown until known.")
    percent = models.FloatField(null=True, blank=True)
    message = models.CharField(max_length=500, blank=True)
    error = models.TextField(blank=True)
    log = models.JSONField(default=list, blank=True, help_text=f"The last {LOG_LINES} lines.")
    agent_job_id = models.CharField(max_length=100, blank=True)
    attempt = models.PositiveIntegerField(default=1)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["deployment", "node__name"]
        constraints = [
            models.UniqueConstraint(fields=["deployment", "node"], name="one_row_per_node")
        ]

    def __str__(self) -> str:
        return f"{self.deployment} on {self.node}"
