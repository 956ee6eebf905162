"""The cross-app entry of nodes: add, confirm, reject, refresh and remove nodes of the fleet.

A node is trusted only after the operator confirms the fingerprint of the key it proved it holds
(a signed challenge, on add and on every refresh). Whatever changes whether a node may take
traffic (trust, status, address, credential) announces itself to every gateway through the
model (`nexus.models.ConfigInput`), so each rebuilds its snapshot.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import ProtectedError, QuerySet
from django.utils import timezone

from nodes import live
from nodes.agent.identity import fingerprint_of, verify_challenge
from nodes.client import AgentClient, AgentRefused, AgentUnreachable
from nodes.models import ModelSource, ModelState, Node, NodeModel, NodeStatus, NodeTrust
from nodes.signals import node_state_changed

log = logging.getLogger(__name__)

# Agents are refreshed in parallel so that a few silent ones (each waiting out its timeout)
# cannot stretch one round past the refresh interval.
MAX_PARALLEL_REFRESHES = 16
_INVENTORY_FIELDS = ("runtime", "base_url", "state", "digest", "source", "process_id")


class NodeError(Exception):
    """An operation on a node cannot be done; the message says why, for the operator."""


class NodeInUse(NodeError):
    """The node cannot be removed while something (a pool target, a deployment) uses it."""


class IdentityNotProven(NodeError):
    """The agent's answer does not prove it holds the key it presents."""


@dataclass(frozen=True)
class Identity:
    """What an agent proved about itself in one signed answer."""

    fingerprint: str
    public_key: str
    info: dict[str, Any]


@dataclass
class Observation:
    """What one refresh learned from an agent, gathered without touching the database."""

    address: str  # where it was read: a node moved meanwhile is not updated from it
    identity: Identity | None = None
    models: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str = ""  # why the agent could not be read: the node is offline
    identity_problem: str = ""  # why the agent is not who it was: the node goes back to pending


def usable_nodes() -> QuerySet[Node]:
    """Return the nodes that may take traffic and work: trusted and online."""
    return Node.objects.filter(trust=NodeTrust.TRUSTED, status=NodeStatus.ONLINE)


def inventory_ids(node: Node) -> list[str]:
    """Return the ids of the models the node served at its latest refresh."""
    return list(node.models.values_list("model_id", flat=True))


def model_digest(node: Node, model_id: str) -> str:
    """Return the content digest the node reported for one of its models; empty when unknown."""
    found = node.models.filter(model_id=model_id).values_list("digest", flat=True).first()
    return found or ""


def prove_identity(address: str, credential: str, *, node: Node | None = None) -> Identity:
    """Ask the agent at this address to sign a fresh challenge; return who it proved to be.

    An agent that is already another node than `node` is refused: one machine, one node.
    """
    with AgentClient(address.rstrip("/"), credential) as agent:
        identity = _identify(agent)
    others = Node.objects.filter(fingerprint=identity.fingerprint)
    same = (others.exclude(pk=node.pk) if node is not None else others).first()
    if same is not None:
        raise NodeError(f"The agent at {agent.address} is node {same.name} already.")
    return identity


def add_node(name: str, address: str, credential: str) -> Node:
    """Add a node after its agent proved its identity; it stays pending until confirmed."""
    address = address.rstrip("/")
    if Node.objects.filter(name=name).exists():
        raise NodeError(f"A node named {name} exists already.")
    if name == "add":
        raise NodeError("'add' is the address of the Add node page (/nodes/add/); choose another.")
    identity = prove_identity(address, credential)
    node = Node(name=name, address=address)
    node.set_credential(credential)
    _store_identity(node, identity)
    # It answered just now; pending still keeps it from any traffic or work.
    node.status = NodeStatus.ONLINE
    node.last_seen_at = node.status_changed_at = timezone.now()
    try:
        node.save()
    except IntegrityError:
        raise NodeError(f"A node named {name} exists already.") from None
    log.info("node %s added at %s, fingerprint %s, pending", name, address, node.fingerprint)
    return node


def update_node(
    node: Node,
    *,
    name: str | None = None,
    address: str | None = None,
    credential: str | None = None,
    identity: Identity | None = None,
) -> Node:
    """Rename the node or point it at another address or credential, proven again first.

    `identity` is what `prove_identity(..., node=node)` returned for the new address and
    credential, when the caller checked them already. A different key there is another agent:
    the node goes back to pending.
    """
    address = address.rstrip("/") if address is not None else None
    moved = (address is not None and address != node.address) or (
        credential is not None and credential != node.get_credential()
    )
    if name is not None and name != node.name:
        if Node.objects.filter(name=name).exclude(pk=node.pk).exists():
            raise NodeError(f"A node named {name} exists already.")
        node.name = name
    if not moved:
        node.save()
        return node
    address = address if address is not None else node.address
    credential = credential if credential is not None else node.get_credential()
    identity = identity or prove_identity(address, credential, node=node)
    with transaction.atomic():
        node.address = address
        node.set_credential(credential)
        if identity.fingerprint != node.fingerprint:
            _distrust(node, _identity_changed(node, identity))
        _store_identity(node, identity)
        node.save()
    return refresh_node(node) if node.trust == NodeTrust.TRUSTED else node


def confirm_node(node: Node, fingerprint: str) -> Node:
    """Trust the node once the operator gave the fingerprint its agent printed; then refresh it."""
    given = fingerprint.strip()
    if not node.fingerprint or given != node.fingerprint:
        raise NodeError(
            f"The fingerprint {given or '(empty)'} is not the one node {node.name} presented "
            f"({node.fingerprint}). Compare it with what the agent printed at start."
        )
    with transaction.atomic():
        node.trust = NodeTrust.TRUSTED
        node.trusted_at = timezone.now()
        node.last_error = ""
        node.save(update_fields=["trust", "trusted_at", "last_error", "updated_at"])
    log.info("node %s trusted (%s)", node.name, node.fingerprint)
    return refresh_node(node)


def reject_node(node: Node) -> Node:
    """Refuse the node: it gets no traffic and no work until confirmed."""
    with transaction.atomic():
        node.trust = NodeTrust.REJECTED
        node.trusted_at = None
        node.save(update_fields=["trust", "trusted_at", "updated_at"])
    log.info("node %s rejected", node.name)
    return node


def delete_node(node: Node) -> None:
    """Remove the node and its inventory, unless something (a pool target, a deployment) uses it.

    What protects it is named from the refusal itself, so nodes need not know other apps.
    """
    try:
        node.delete()
    except ProtectedError as error:
        users = sorted(f"{row._meta.verbose_name} {row}" for row in error.protected_objects)
        them = "it" if len(users) == 1 else "them"
        raise NodeInUse(
            f"Node {node.name} is used by {', '.join(users)}; remove {them} first."
        ) from None


def refresh_node(node: Node) -> Node:
    """Read a trusted node's identity, inventory and metrics; offline at once if it is silent."""
    if node.trust != NodeTrust.TRUSTED:
        return node
    observation = _observe(node.address, node.get_credential(), node.fingerprint)
    return _apply(node.pk, observation) or node


def refresh_nodes() -> dict[str, int]:
    """Refresh every trusted node at once; return how many are online, offline or pending."""
    nodes = list(Node.objects.filter(trust=NodeTrust.TRUSTED))
    if not nodes:
        return {}
    targets = [(node.address, node.get_credential(), node.fingerprint) for node in nodes]
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_REFRESHES, len(nodes))) as pool:
        observations = list(pool.map(lambda args: _observe(*args), targets))
    summary: dict[str, int] = {}
    # Every refresh moves last-seen times: the pages get the whole round in one push.
    with live.one_push():
        for node, observation in zip(nodes, observations, strict=True):
            refreshed = _apply(node.pk, observation)
            if refreshed is not None:
                key = refreshed.status if refreshed.trust == NodeTrust.TRUSTED else refreshed.trust
                summary[key] = summary.get(key, 0) + 1
    return summary


def _identify(agent: AgentClient) -> Identity:
    """Ask the agent to sign a fresh challenge; return who it proved to be, or raise NodeError."""
    challenge = secrets.token_hex(32)
    try:
        info = agent.info(challenge)
    except AgentUnreachable as error:
        raise NodeError(f"Cannot reach the agent at {agent.address}: {error.reason}.") from None
    except AgentRefused as error:
        raise NodeError(_refusal_text(agent.address, error)) from None
    try:
        return _verify(info, challenge)
    except IdentityNotProven as problem:
        raise IdentityNotProven(
            f"The agent at {agent.address} did not prove its identity: {problem}."
        ) from None


def _verify(info: Any, challenge: str) -> Identity:
    if not isinstance(info, dict):
        raise IdentityNotProven("the agent's answer has no identity in it")
    public_key = str(info.get("public_key") or "")
    signature = str(info.get("challenge_signature") or "")
    if not public_key or not signature:
        raise IdentityNotProven("the agent did not sign the identity challenge")
    if not verify_challenge(public_key, challenge, signature):
        raise IdentityNotProven(
            "the agent's signature of the identity challenge does not verify with its public key"
        )
    fingerprint = fingerprint_of(public_key)
    if info.get("fingerprint") not in (None, fingerprint):
        raise IdentityNotProven("the fingerprint the agent reports is not its public key's")
    return Identity(fingerprint=fingerprint, public_key=public_key, info=info)


def _refusal_text(address: str, error: AgentRefused) -> str:
    if error.status == 401:
        return f"The agent at {address} refused the node credential."
    return f"The agent at {address} answered with an error: {error.message}."


def _identity_changed(node: Node, identity: Identity) -> str:
    return (
        f"identity changed: the agent at {node.address} now presents {identity.fingerprint} "
        f"instead of {node.fingerprint}; confirm the new fingerprint to trust it again"
    )


def _observe(address: str, credential: str, fingerprint: str) -> Observation:
    """Read one agent: its proven identity, then inventory and metrics (no database access)."""
    try:
        with AgentClient(address, credential) as agent:
            challenge = secrets.token_hex(32)
            info = agent.info(challenge)
            try:
                identity = _verify(info, challenge)
            except IdentityNotProven as problem:
                return Observation(address, identity_problem=f"identity not proven: {problem}")
            if identity.fingerprint != fingerprint:
                return Observation(address, identity=identity)
            return Observation(
                address, identity=identity, models=agent.models(), metrics=agent.metrics()
            )
    except AgentUnreachable as error:
        return Observation(address, error=error.reason)
    except AgentRefused as error:
        if error.status == 401:
            return Observation(address, error="the agent refused the node credential")
        return Observation(address, error=f"the agent answered with an error: {error.message}")


@transaction.atomic
def _apply(node_id: int, observation: Observation) -> Node | None:
    """Store what a refresh learned; return the node, or None when it was removed meanwhile."""
    node = Node.objects.select_for_update().filter(pk=node_id).first()
    if node is None or node.trust != NodeTrust.TRUSTED or node.address != observation.address:
        # Rejected, moved or removed while the agent was being read: nothing to store.
        return node
    now = timezone.now()
    changed = False
    identity = observation.identity
    if observation.identity_problem:
        _distrust(node, observation.identity_problem)
        _set_status(node, NodeStatus.OFFLINE, now)
        changed = True
    elif identity is not None and identity.fingerprint != node.fingerprint:
        _distrust(node, _identity_changed(node, identity))
        _store_identity(node, identity)
        _set_status(node, NodeStatus.ONLINE, now)
        node.last_seen_at = now
        changed = True
    elif observation.error:
        node.last_error = observation.error
        changed = _set_status(node, NodeStatus.OFFLINE, now)
    else:
        assert identity is not None
        _store_identity(node, identity)
        node.metrics = observation.metrics
        node.last_error = ""
        node.last_seen_at = now
        changed = _set_status(node, NodeStatus.ONLINE, now)
        changed = _sync_inventory(node, observation.models, now) or changed
    node.save()
    if changed:
        transaction.on_commit(partial(node_state_changed.send, sender=Node, node=node), robust=True)
        if node.trust != NodeTrust.TRUSTED:
            log.warning("node %s is pending again: %s", node.name, node.last_error)
        elif node.status == NodeStatus.OFFLINE:
            log.warning("node %s is offline: %s", node.name, node.last_error)
    return node


def _distrust(node: Node, reason: str) -> None:
    node.trust = NodeTrust.PENDING
    node.trusted_at = None
    node.last_error = reason


def _set_status(node: Node, status: str, now: datetime) -> bool:
    """Set the node's status; return whether it changed."""
    if node.status == status:
        return False
    node.status = status
    node.status_changed_at = now
    return True


def _store_identity(node: Node, identity: Identity) -> None:
    info = identity.info
    node.fingerprint = identity.fingerprint
    node.public_key = identity.public_key
    node.hostname = str(info.get("hostname") or "")[:255]
    node.agent_version = str(info.get("agent_version") or "")[:50]
    node.resources = info.get("resources") or {}
    node.free = info.get("free") or {}


def _inventory_row(item: dict[str, Any]) -> dict[str, str]:
    """Return a reported model as NodeModel fields, unknown values made harmless."""
    state = str(item.get("state") or "")
    source = str(item.get("source") or "")
    return {
        "runtime": str(item.get("runtime") or "")[:50],
        "base_url": str(item.get("base_url") or "")[:500],
        "state": state if state in ModelState.values else ModelState.UNKNOWN,
        "digest": str(item.get("digest") or "")[:100],
        "source": source if source in ModelSource.values else ModelSource.MANAGED,
        "process_id": str(item.get("process_id") or "")[:64],
    }


def _sync_inventory(node: Node, reported: Iterable[dict[str, Any]], now: datetime) -> bool:
    """Make the node's NodeModel rows what the agent reported; return whether any changed."""
    existing = {row.model_id: row for row in node.models.all()}
    seen: dict[str, dict[str, str]] = {}
    for item in reported:
        model_id = str(item.get("id") or "") if isinstance(item, dict) else ""
        # An id that does not fit the column cannot be routed to by name either.
        if model_id and len(model_id) <= 200 and model_id not in seen:
            seen[model_id] = _inventory_row(item)
    changed = False
    new_rows, kept_rows = [], []
    for model_id, fields in seen.items():
        row = existing.get(model_id)
        if row is None:
            new_rows.append(NodeModel(node=node, model_id=model_id, seen_at=now, **fields))
            continue
        if any(getattr(row, name) != value for name, value in fields.items()):
            changed = True
            for name, value in fields.items():
                setattr(row, name, value)
        row.seen_at = now
        kept_rows.append(row)
    vanished = set(existing) - set(seen)
    if vanished:
        node.models.filter(model_id__in=vanished).delete()
    NodeModel.objects.bulk_create(new_rows)
    NodeModel.objects.bulk_update(kept_rows, [*_INVENTORY_FIELDS, "seen_at"])
    return changed or bool(new_rows) or bool(vanished)
