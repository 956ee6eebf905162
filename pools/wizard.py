"""The create-pool wizard's draft: what the operator chose so far, kept in their session until
the pool is created (docs/pools-console.md).

A draft is plain JSON in the session (database-backed), one per wizard instance, so two tabs
each creating a pool do not mix. A provider key typed into it is kept encrypted as a target
stores it (`nexus.crypto`) and never rendered again. Validate runs on the draft's pool and
targets built as unsaved model instances (nothing is written while targets are called over
HTTP); Dry run creates them through `pools.services` inside a transaction that is rolled back
(the balancer's snapshot reads the database; the configuration version bumped in it is rolled
back too, so no gateway hears of it). Create goes through the same service functions as the API.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.contrib.sessions.backends.base import SessionBase
from django.db import transaction

from nexus import crypto
from nexus.models import Project, project_named
from nodes.models import Node
from pools import services, validation
from pools.models import CompatibilityMode, Pool, Strategy, Target, node_base_url

SESSION_KEY = "pool_wizard"
# Drafts kept per session: an abandoned wizard's draft gives way to newer ones.
MAX_DRAFTS = 5


@dataclass(frozen=True)
class Step:
    """One screen of the wizard."""

    slug: str
    title: str


STEPS = (
    Step("nodes", "Nodes"),
    Step("name", "Name and slug"),
    Step("compatibility", "Compatibility"),
    Step("targets", "Targets"),
    Step("strategy", "Strategy"),
    Step("weights", "Priority and capacity"),
    Step("check", "Validate and dry run"),
    Step("summary", "Summary"),
)
STEP_SLUGS = [step.slug for step in STEPS]


class Source:
    """Where a draft target runs."""

    NODE = "node"
    RUNTIME = "runtime"
    PROVIDER = "provider"


def empty_draft() -> dict[str, Any]:
    return {
        "nodes": [],
        "pool": {},
        "compatibility_mode": CompatibilityMode.EXACT_REPLICAS.value,
        "targets": [],
        "strategy": Strategy.SMART.value,
        "identity_confirmed": False,
        "pending_node": "",
    }


def new_draft(session: SessionBase) -> str:
    """Start a draft in the session; return its id."""
    drafts: dict[str, Any] = session.get(SESSION_KEY, {})
    while len(drafts) >= MAX_DRAFTS:
        drafts.pop(next(iter(drafts)))  # the oldest: dicts keep insertion order in JSON too
    draft_id = secrets.token_hex(6)
    drafts[draft_id] = empty_draft()
    session[SESSION_KEY] = drafts
    return draft_id


def load_draft(session: SessionBase, draft_id: str) -> dict[str, Any] | None:
    """Return the draft of this id in the session; None when there is none (gone or created)."""
    draft: dict[str, Any] | None = session.get(SESSION_KEY, {}).get(draft_id)
    return draft


def save_draft(session: SessionBase, draft_id: str, draft: dict[str, Any]) -> None:
    drafts = session.get(SESSION_KEY, {})
    drafts[draft_id] = draft
    session[SESSION_KEY] = drafts


def drop_draft(session: SessionBase, draft_id: str) -> None:
    drafts = session.get(SESSION_KEY, {})
    drafts.pop(draft_id, None)
    session[SESSION_KEY] = drafts


# -- draft targets ----------------------------------------------------------------------------


def draft_target(
    cleaned: Mapping[str, Any], *, capacity: int, capacity_source: str
) -> dict[str, Any]:
    """Return what the draft keeps of a target added in the targets step (its key encrypted)."""
    node: Node | None = cleaned.get("node")
    credential = cleaned.get("credential") or ""
    return {
        "source": cleaned["source"],
        "name": cleaned["name"],
        "node": node.pk if node is not None else None,
        "node_name": node.name if node is not None else "",
        "base_url": cleaned["base_url"],
        "model_id": cleaned["model_id"],
        "kinds": list(cleaned["kinds"]),
        "credential_encrypted": crypto.encrypt(credential) if credential else "",
        "priority": 1,
        "capacity_weight": capacity,
        "capacity_source": capacity_source,
    }


def derived_name(source: str, node: Node | None, base_url: str, taken: Sequence[str]) -> str:
    """Return a target name from its node or its URL's host, unique among `taken`."""
    if node is not None:
        name = node.name
    else:
        name = (urlsplit(base_url).hostname or "target").split(".")[0] or "target"
    candidate, n = name[:100], 2
    while candidate in taken:
        candidate, n = f"{name[:95]}-{n}", n + 1
    return candidate


# -- building, checking and creating the pool -------------------------------------------------


def pool_fields(draft: Mapping[str, Any]) -> dict[str, Any]:
    """Return the fields `services.create_pool` takes, from the draft."""
    chosen = draft["pool"]
    project = project_named(chosen.get("project", "")) if chosen.get("project") else None
    fields: dict[str, Any] = {
        "name": chosen.get("name", ""),
        "slug": chosen.get("slug", ""),
        "description": chosen.get("description", ""),
        "compatibility_mode": draft["compatibility_mode"],
        "strategy": draft["strategy"],
    }
    if isinstance(project, Project):
        fields["project"] = project
    return fields


def target_fields(entry: Mapping[str, Any], position: int) -> dict[str, Any]:
    """Return the fields `services.add_target` takes of one draft target (not its key)."""
    return {
        "name": entry["name"],
        "node_id": entry["node"],
        "base_url": entry["base_url"],
        "model_id": entry["model_id"],
        "kinds": list(entry["kinds"]),
        "priority": entry["priority"],
        "capacity_weight": entry["capacity_weight"],
        "position": position,
    }


def build(draft: Mapping[str, Any]) -> tuple[Pool, list[Target]]:
    """Return the draft's pool and targets as unsaved model instances (for Validate)."""
    pool = Pool(**pool_fields(draft))
    targets = []
    for position, entry in enumerate(draft["targets"]):
        target = Target(pool=pool, **target_fields(entry, position))
        if (node := target.node) is not None:
            # As Target.save() keeps it: a node target is reached through the node's agent.
            target.base_url = node_base_url(node.address)
        target.credential_encrypted = entry["credential_encrypted"]
        targets.append(target)
    return pool, targets


def identity_problems(draft: Mapping[str, Any]) -> list[str]:
    """Return why an Exact-replicas draft's targets are not provably one model (empty when they
    are, or when the pool is Equivalent generation): what Validate's identity check says."""
    if draft["compatibility_mode"] != CompatibilityMode.EXACT_REPLICAS or not draft["targets"]:
        return []
    _, targets = build(draft)
    return validation.identity_problems([validation.identity_of(target) for target in targets])


def replicas(draft: Mapping[str, Any]) -> list[Target]:
    """Return the targets a new target of this draft must be a replica of: an Exact-replicas
    draft's (unsaved), none for Equivalent generation."""
    if draft["compatibility_mode"] != CompatibilityMode.EXACT_REPLICAS:
        return []
    return build(draft)[1]


def mode_refusal(draft: Mapping[str, Any]) -> str:
    """Return why the draft's targets cannot form an Exact-replicas pool (the rule
    services.update_pool_settings applies), "" when they can or the draft is Equivalent."""
    targets = replicas(draft)
    return validation.mode_refusal([validation.identity_of(t) for t in targets]) if targets else ""


def save(draft: Mapping[str, Any], user: Any) -> Pool:
    """Create the draft's pool and its targets through the service functions, in one
    transaction; store the operator's identity confirmation when the pool needs one."""
    with transaction.atomic():
        pool = services.create_pool(pool_fields(draft))
        for position, entry in enumerate(draft["targets"]):
            stored = entry["credential_encrypted"]
            credential = crypto.decrypt(stored) if stored else ""
            services.add_target(pool, target_fields(entry, position), credential=credential)
        if user is not None and draft["identity_confirmed"] and identity_problems(draft):
            validation.confirm_identity(pool, user)
    return pool


def validate(draft: Mapping[str, Any], *, probe_kinds: bool) -> validation.PoolReport:
    """Validate the draft's pool as it would be created; write nothing."""
    pool, targets = build(draft)
    return validation.validate(pool, probe_kinds=probe_kinds, targets=targets)


def dry_run(draft: Mapping[str, Any], *, kind: str, headers: Mapping[str, str]) -> dict[str, Any]:
    """Rank the draft's targets as its strategy would now, in a pool created and rolled back."""
    with transaction.atomic():
        pool = save(draft, user=None)
        ranking = services.dry_run(pool, kind=kind, headers=headers, body={})
        transaction.set_rollback(True)
    return ranking
