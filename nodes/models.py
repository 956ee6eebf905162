"""The fleet: machines running the Nexus agent, their identity, status and model inventory."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import models

# Node's reverse relation is called `models` (NodeModel's related_name): inside Node's body mypy's
# Django plugin may resolve `models.JSONField` to that relation (it did after a mypy run over tests/
# had left its cache).
from django.db.models import JSONField

from nexus import crypto
from nexus.models import ConfigInput, ConfigInputQuerySet

if TYPE_CHECKING:
    from nodes.client import AgentClient


class NodeTrust(models.TextChoices):
    """Whether the operator confirmed the node's identity; only trusted nodes get anything."""

    PENDING = "pending", "Pending confirmation"
    TRUSTED = "trusted", "Trusted"
    REJECTED = "rejected", "Rejected"


class NodeStatus(models.TextChoices):
    """Whether the node answered its latest refresh."""

    UNKNOWN = "unknown", "Unknown"
    ONLINE = "online", "Online"
    OFFLINE = "offline", "Offline"


class ModelState(models.TextChoices):
    """What the runtime reports about a model (the agent's `state`)."""

    LOADED = "loaded", "Loaded"
    WARM = "warm", "Warm"
    COLD = "cold", "Cold"
    UNKNOWN = "unknown", "Unknown"


class ModelSource(models.TextChoices):
    """Whether the agent runs the model's runtime itself or only watches one."""

    MANAGED = "managed", "Managed"
    WATCHED = "watched", "Watched"


class Node(ConfigInput):
    """A machine running the Nexus agent, reached at its address with the node credential."""

    # What a target on the node is routed by: its URL, its credential, whether it may take
    # traffic (and the node's name, in the reason why not). Not the frequent last_seen_at.
    config_fields = frozenset({"name", "address", "credential_encrypted", "trust", "status"})

    objects = ConfigInputQuerySet.as_manager()

    name = models.SlugField(max_length=64, unique=True)
    address = models.URLField(
        max_length=500, help_text="The agent's base URL, e.g. http://10.0.0.5:7100"
    )
    credential_encrypted = models.TextField(blank=True, editable=False)
    fingerprint = models.CharField(
        max_length=100, blank=True, help_text="SHA256 of the agent's public key, OpenSSH style."
    )
    public_key = models.CharField(max_length=100, blank=True, help_text="Ed25519, base64 raw.")
    trust = models.CharField(max_length=16, choices=NodeTrust.choices, default=NodeTrust.PENDING)
    status = models.CharField(max_length=16, choices=NodeStatus.choices, default=NodeStatus.UNKNOWN)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    status_changed_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    hostname = models.CharField(max_length=255, blank=True)
    agent_version = models.CharField(max_length=50, blank=True)
    resources = JSONField(
        default=dict, blank=True, help_text="cpu_count, memory_bytes, gpus (as the agent reports)."
    )
    free = JSONField(
        default=dict, blank=True, help_text="Resources not reserved by the agent's processes."
    )
    metrics = JSONField(default=dict, blank=True, help_text="The latest /agent/v1/metrics.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    trusted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def has_credential(self) -> bool:
        return bool(self.credential_encrypted)

    def set_credential(self, credential: str) -> None:
        """Store the node credential encrypted; an empty string removes it."""
        self.credential_encrypted = crypto.encrypt(credential) if credential else ""

    def get_credential(self) -> str:
        """Return the decrypted node credential, or an empty string."""
        return crypto.decrypt(self.credential_encrypted) if self.credential_encrypted else ""

    def client(self) -> AgentClient:
        """Return a client of this node's agent (close it, or use it in a `with` block)."""
        from nodes.client import AgentClient

        return AgentClient(self.address, self.get_credential())

    @property
    def is_usable(self) -> bool:
        """Say whether the node may get traffic and work: trusted and online."""
        return self.trust == NodeTrust.TRUSTED and self.status == NodeStatus.ONLINE

    def unusable_reason(self) -> str:
        """Return why the node gets no traffic, e.g. "node gpu-1 is offline"; empty when usable."""
        if self.trust != NodeTrust.TRUSTED:
            return f"node {self.name} is not trusted ({self.get_trust_display().lower()})"
        if self.status == NodeStatus.OFFLINE:
            return f"node {self.name} is offline"
        if self.status != NodeStatus.ONLINE:
            return f"node {self.name} has not answered a refresh yet"
        return ""

    @property
    def gpu_count(self) -> int:
        return len((self.resources or {}).get("gpus") or [])


class NodeModel(models.Model):
    """A model a node serves, as its agent reported it at the latest refresh."""

    node = models.ForeignKey(Node, related_name="models", on_delete=models.CASCADE)
    model_id = models.CharField(max_length=200)
    runtime = models.CharField(max_length=50, blank=True)
    # The runtime's own URL on the node (loopback there); Nexus reaches it through the agent.
    base_url = models.CharField(max_length=500, blank=True)
    state = models.CharField(max_length=16, choices=ModelState.choices, default=ModelState.UNKNOWN)
    digest = models.CharField(max_length=100, blank=True, help_text="sha256:<hex> when known.")
    source = models.CharField(
        max_length=16, choices=ModelSource.choices, default=ModelSource.MANAGED
    )
    process_id = models.CharField(max_length=64, blank=True)
    seen_at = models.DateTimeField()

    class Meta:
        ordering = ["node", "model_id"]
        constraints = [
            models.UniqueConstraint(fields=["node", "model_id"], name="node_model_unique")
        ]

    def __str__(self) -> str:
        return f"{self.node.name}/{self.model_id}"
